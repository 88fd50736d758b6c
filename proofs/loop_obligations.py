"""The `loop:<name>` obligations of `schedspec prove`: each claim of
loop_claims.py discharged for every block size and refuted by its bad variants,
with a witness that it is not vacuous (loop_vacuity.py) and that its property
applies on a real run (the bounded encoding's, or a fixed scenario,
loop_witnesses.py).
"""

from __future__ import annotations

import time

from schedspec.spec import versions

from .loop_claims import ASYNC_ONLY, CLAIMS, FEATURE_ONLY, SPEC_DECODE, LoopClaim, claim_premises
from .loop_parts import LoopVars
from .loop_rules import LOOP_VARIANTS
from .loop_vacuity import vacuity
from .loop_witnesses import FIXED_WITNESSES
from .obligation import Bound, Obligation, Result
from .release import Release
from .solving import check, prove_parts
from .symbolic import BLOCK_SIZES


DEFAULT_TIMEOUT_S = 20.0


def _check(constraints: list, timeout_s: float) -> str:
    """unsat / sat / unknown over solving.check's tries; within each, z3's default
    strategy gets a second chance on an unknown (it decides some of these faster)."""
    return check(constraints, timeout_s, also_default=True)[0]


def discharge(claim: LoopClaim, release: Release, variant: str = "correct", timeout_s: float = DEFAULT_TIMEOUT_S,
              block_sizes=BLOCK_SIZES) -> Result:
    """Proved when every part holds for every block size (its negation unsat);
    refuted at the first part and block size where z3 finds a counterexample."""
    rules = LOOP_VARIANTS[variant]
    t0 = time.perf_counter()

    def parts():
        for bs in block_sizes:
            V = LoopVars(bs, rules, release)
            for name, build in claim.parts:
                premises, goal = build(V, rules)
                yield f"{name}, block_size {bs}", premises + claim_premises(claim, V), goal

    status, where = prove_parts(parts(), timeout_s, _check)
    return Result(status, time.perf_counter() - t0,
                  where or f"{len(claim.parts)} parts x {len(block_sizes)} block sizes unsat")


def obligations(release: Release, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Obligation]:
    """`loop:<name>` obligations of `release` for `schedspec prove`.  The witness is the z3
    vacuity check (loop_vacuity.py), plus the bounded encoding's reachable witness of the
    property (a scenario file), which shows the property applies on a real run."""
    from .witness import find_witness

    out = []
    for name, claim in CLAIMS.items():
        if name in FEATURE_ONLY and not release.models(FEATURE_ONLY[name]):
            continue  # the spec refuses this feature for the modelled release
        goal = f"property:{name}" if name != "running_never_starved" else "running-kept"

        def witness(claim=claim, goal=goal):
            v = vacuity(claim, release, timeout_s)
            if v.status != "proved":
                return v, None
            fixed = FIXED_WITNESSES.get(claim.name)
            res, scenario = fixed() if fixed else find_witness(goal, release)
            return Result(res.status, v.seconds + res.seconds, f"{v.detail}; {res.detail}", res.model), scenario

        out.append(Obligation(
            name=f"loop:{name}", property=name,
            kind="loop", bound=Bound(None, None, 1, f"any number of requests; block_size in "
                                                    f"{{{','.join(map(str, BLOCK_SIZES))}}}; "
                                                    + ("async scheduling on" if name in ASYNC_ONLY
                                                       else "async scheduling on or off")
                                                    + "; prefix caching on or off"
                                                    + ("; max_loras >= 1, any number of adapters"
                                                       if name == "max_loras_respected" else "")
                                                    + ("; speculative decoding on or off, any "
                                                       "num_speculative_tokens, lookahead and drafter rows "
                                                       "(prefill lookahead <= 1)"
                                                       if name in SPEC_DECODE and release.models(versions.SPEC_DECODE)
                                                       else "")),
            discharge=lambda variant, claim=claim: discharge(claim, release, variant, timeout_s),
            witness=witness, bad_variants=claim.bad_variants, expected="proved", doc=claim.doc,
            extra={"parts": [p for p, _ in claim.parts]}))
    return out
