"""Obligations for claims proved by invariants of a few operations (pool_invariants.py,
encoder_invariants.py): each claim's parts discharged, its witness the vacuity check of
its premises followed by a fixed scenario replayed on the spec."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .obligation import Bound, Obligation, Result
from .solving import prove_parts


@dataclass(frozen=True)
class Claim:
    name: str  # the property's
    parts: tuple  # (label, build(vars, rules) -> (premises, goal)), each proved alone
    bad_variants: tuple[str, ...]
    doc: str


def discharge_parts(claim: Claim, variables: Any, rules: Any, timeout_s: float) -> Result:
    """Proved when every part's negation is unsat; refuted at the first part with a
    counterexample."""
    t0 = time.perf_counter()
    status, where = prove_parts(((name, *build(variables, rules)) for name, build in claim.parts), timeout_s)
    return Result(status, time.perf_counter() - t0, where or f"{len(claim.parts)} parts unsat")


def claim_obligations(claims: Iterable[Any], *, kind: str, bound: Bound,
                      discharge: Callable[[Any, str], Result], vacuity: Callable[[Any], Result],
                      witness: Callable[[str], tuple[Result, Any]]) -> list[Obligation]:
    """`<kind>:<name>` for each claim (with `name`, `bad_variants`, `doc`, `parts`):
    proved when `discharge(claim, variant)` is; witnessed when `vacuity(claim)` is
    proved and `witness(name)` replays."""
    out = []
    for claim in claims:
        def wit(claim=claim):
            v = vacuity(claim)
            if v.status != "proved":
                return v, None
            res, scenario = witness(claim.name)
            return Result(res.status, v.seconds + res.seconds, f"{v.detail}; {res.detail}", res.model), scenario

        out.append(Obligation(
            name=f"{kind}:{claim.name}", property=claim.name, kind=kind, bound=bound,
            discharge=lambda variant, claim=claim: discharge(claim, variant),
            witness=wit, bad_variants=claim.bad_variants, expected="proved", doc=claim.doc,
            extra={"parts": [p for p, _ in claim.parts]}))
    return out
