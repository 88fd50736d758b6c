"""The proof obligations, as data (one `Obligation` record each), and how each
is discharged with z3.

- "step" <property>: from any state that satisfies the state invariant (and a
  config vLLM accepts), one schedule + fake model + update_from_output step
  satisfies the property: z3 finds `invariant(before) and not property` unsat.
- "inductive" <transition>: the invariant is preserved by schedule+update,
  add_request and abort.
- "initial": the empty state satisfies the invariant.
- "theorem": proofs/starvation.py's unbounded statements (another module).

Each record also carries its witness (premises satisfiable, as a replayable
scenario: proofs/witness.py) and its bad variants, on which the claim must be
refuted.  `unknown` is a failure.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any, Callable, Iterator

import z3

from schedspec.spec import versions
from schedspec.spec.invariants import STATE_INVARIANTS
from schedspec.spec.properties import PROPERTIES

from . import encoding
from .loop_claims import CLAIMS as LOOP_CLAIMS
from .pool_invariants import CLAIMS as POOL_CLAIMS
from .encoder_invariants import CLAIMS as ENCODER_CLAIMS
from .loop_claims import FEATURE_ONLY as LOOP_FEATURE_ONLY
from .obligation import Bound, Obligation, Result
from .release import Release
from .property_formulas import INVARIANT_FORMULAS, PROPERTY_FORMULAS, block_demand, capped_need, state_invariant
from .solving import check, first_try, unknown_detail
from .symbolic import BLOCK_SIZES, SymConfig, SymSlot, SymState, fixed_roles
from .variants import VARIANTS

DEFAULT_TIMEOUT_S = 20.0
# One-step claims: running and waiting slots.  The encoding takes any number; with
# the symmetry reduction, solving.py's randomized restarts and the lemmas below
# (STEP_LEMMAS) every obligation is decided at 4 + 4 (proofs/README.md,
# "Obligations": the default bound).
DEFAULT_BOUND = 4
# Obligations whose default bound is higher, 6 + 6 (12 requests for abort and
# initial, 6 + 6 and the new one for add_request): those proved there in at most 60 s
# of proof, one at a time on the 2-core machine (`--bound N` sets every bound, these
# included; proofs/README.md, "Obligations").
BOUND_OVERRIDES = {"step:max_num_seqs_respected": 6, "step:preempted_restart_from_zero": 6,
                   "step:computed_tokens_bounded": 6, "inductive:abort": 6, "initial": 6,
                   "inductive:add_request": 6}
INVARIANT = "state_invariant"

# property -> the bad variants that must refute its step obligation.
STEP_BAD_VARIANTS = {
    "token_budget_respected": ("admission_over_budget", "budget_off_by_one"),
    "grants_positive": ("zero_grant",),
    "running_before_waiting": ("running_capped_at_1", "waiting_before_running"),
    "preemption_only_on_allocation_failure": ("admit_after_preemption", "preemption_without_allocation_failure",
                                              "victim_head_of_running"),
    "starvation_condition": ("admission_capped_at_2", "threshold_with_one_eligible"),
    "max_num_seqs_respected": ("run_slot_check_off_by_one",),
    "kv_blocks_conserved": ("preemption_leaks_blocks",),
    "computed_tokens_bounded": ("running_need_plus_2",),
    "scheduled_requests_run": ("admitted_to_waiting",),
    "computed_tokens_advance_by_grant": ("advance_short",),
    "waiting_order_preserved": ("preempted_to_back",),
    "preempted_restart_from_zero": ("preemption_not_counted", "computed_tokens_not_reset"),
    "scheduled_within_known_tokens": ("running_need_plus_2",),
}

# Properties about prefix caching or async scheduling, which the bounded encoding
# (both flags off) does not model: no `step:` obligation.
OUTSIDE_BOUNDED = {name: p.engine_flags for name, p in PROPERTIES.items() if p.engine_flags}
# Of those, the ones no obligation encodes (the loop encoding has async scheduling,
# speculative decoding, structured output and LoRA, loop_claims.ASYNC_ONLY /
# FEATURE_ONLY; the pool encoding prefix caching's three; the encoder encoding encoder
# inputs' three, 0.33.0 only): `schedspec prove` lists
# them as not encoded; the state machine, `check` and `diff` judge them.  None today.
OUTSIDE_ENCODING = {name: flags for name, flags in OUTSIDE_BOUNDED.items()
                    if name not in LOOP_CLAIMS and name not in POOL_CLAIMS and name not in ENCODER_CLAIMS}


def outside_encoding(release: Release) -> dict[str, tuple[str, ...]]:
    """OUTSIDE_ENCODING for `release`: LoRA's and structured output's claims exist
    only where schedspec models the feature (loop_claims.FEATURE_ONLY)."""
    out = dict(OUTSIDE_ENCODING)
    out.update({name: OUTSIDE_BOUNDED[name] for name, feature in sorted(LOOP_FEATURE_ONLY.items())
                if not release.models(feature)})
    if not release.models(versions.ENCODER_INPUTS):
        out.update({name: OUTSIDE_BOUNDED[name] for name in ENCODER_CLAIMS})
    return out


def model_state(model: z3.ModelRef, st: SymState) -> dict[str, Any]:
    """A concrete pre-state from a model, as plain data (a counterexample)."""
    ev = lambda t: model.eval(t, model_completion=True)  # noqa: E731

    def val(t):
        v = ev(t)
        return z3.is_true(v) if z3.is_bool(v) else v.as_long()

    cfg = {k: val(v) for k, v in vars(st.config).items() if k not in ("block_sizes", "release")}
    reqs = []
    for i, s in enumerate(st.slots):
        if val(s.present):
            reqs.append({"slot": i, **{k: val(v) for k, v in vars(s).items()}, "num_tokens": val(s.num_tokens)})
    return {"config": cfg, "num_free_blocks": val(st.num_free_blocks), "requests": reqs}


# The encodings built in this process, while `shared_builds()` is open: one
# schedule + update encoding of R + W slots serves every step obligation and the
# inductive one, each variant and both policies (a build is 30-40 % of a bounded
# obligation's time).  Built terms are immutable z3 values with the same names in
# every build, so a reused one is the term a fresh build would give.  Only a whole
# `schedspec prove` run opens it: a test that patches the encoding between builds
# must see its patch.
_shared_builds: list[dict | None] = [None]


@contextlib.contextmanager
def shared_builds() -> Iterator[None]:
    """Within this block, equal encodings are built once per process (cli/prove.py)."""
    before = _shared_builds[0]
    _shared_builds[0] = {}
    try:
        yield
    finally:
        _shared_builds[0] = before


def _built(key: tuple, make: Callable[[], Any]) -> Any:
    """`make()`, or its build already made under `key` (which names the release)."""
    memo = _shared_builds[0]
    if memo is None:
        return make()
    if key not in memo:
        memo[key] = make()
    return memo[key]


class _Claim:
    """A claim `premise => claim` over a fresh symbolic state, for any rule variant.

    `build(variant, block_sizes)` gives (premise, claim, applicable, before, lemmas):
    lemmas are helper facts in stages (a list of lists of facts), each stage
    proved from the premise and the stages before it before it is used.

    It is checked case by case, one z3 call per (block_size, policy): with the
    block size a constant, every cdiv is a division by a numeral, and z3 proves
    in well under a second what it cannot decide in minutes over the whole set."""

    def __init__(self, build: Callable[..., tuple[list, Any, Any, SymState]], timeout_s: float,
                 block_sizes=BLOCK_SIZES):
        self.build = build
        self.timeout_s = timeout_s
        self.block_sizes = block_sizes
        self.whole_tries = [0, 0]  # [missed, proved] by the whole-claim try

    def whole_tries_pay(self) -> bool:
        """Adaptive: go on trying the whole claim first while it proves at least as
        often as it misses (inductive:schedule+update's whole state invariant missed
        in all 18 cases, 2.5 s each, where its conjuncts take 2.4 s a case)."""
        missed, proved = self.whole_tries
        return missed < 2 or proved >= missed

    def cases(self):
        for bs in self.block_sizes:
            for prio in (False, True):
                yield bs, prio

    def _run(self, variant: str, negate: bool) -> Result:
        total = 0.0
        built: dict[int, tuple] = {}  # the build depends on the block size, not the policy
        for bs, prio in self.cases():
            if bs not in built:
                built[bs] = self.build(variant, (bs,))
            premise, claim, applicable, before, lemmas = built[bs]
            case = premise + [before.config.is_priority == prio]
            for stage in lemmas if negate else ():
                # A stage of lemmas, where z3 proves it from this case's premises and
                # the stages before it, becomes a premise too: premise => lemma and
                # premise and lemma => claim give premise => claim.  One not proved (a
                # bad variant may break it) is left out, which only costs time.
                r, _, dt = check(case + [z3.Not(z3.And(stage))], self.timeout_s)
                total += dt
                if r == "unsat":
                    case = case + stage
            # premise => (A and B and ...) is checked one conjunct at a time: the
            # same claim, and z3 decides each part quickly where the whole
            # conjunction often runs into the timeout.
            expect_sat = (variant != "correct") or not negate
            goals = [z3.Not(part) for part in _conjuncts(claim)] if negate else [applicable]
            if negate and not expect_sat and len(goals) > 2 and self.whole_tries_pay():
                # The whole claim first, in one short try: its unsat proves every
                # conjunct.  Each call simplifies the whole step again, so with many
                # conjuncts one call wins: scheduled_requests_run's 8 at 4 + 4 took
                # 97 s of calls, the whole 0.9 s; computed_tokens_bounded's 12 at
                # 6 + 6 36 s, the whole 15 s.  With two it can lose (kv_blocks_conserved:
                # the whole unknown in 6 of 18 cases, 26 s against 16 s).  Sat or
                # unknown: the conjuncts decide, as before.
                t0 = time.perf_counter()
                whole = first_try(case + [z3.Not(claim)], self.timeout_s)
                total += time.perf_counter() - t0
                self.whole_tries[whole == "unsat"] += 1
                if whole == "unsat":
                    continue
            for goal in goals:
                r, model, dt = check(case + [goal], self.timeout_s, expect_sat=expect_sat)
                total += dt
                if r != "unsat":
                    break
            if r == "sat":
                return Result("refuted" if negate else "proved", total,
                              f"block_size {bs}, {'priority' if prio else 'fcfs'}", model_state(model, before))
            if r == "unknown":
                return Result("unknown", total, f"z3 unknown ({unknown_detail(self.timeout_s)}) at block_size {bs}, "
                              f"{'priority' if prio else 'fcfs'}")
        return Result("proved" if negate else "refuted", total, f"{len(list(self.cases()))} cases unsat")

    def discharge(self, variant: str) -> Result:
        return self._run(variant, negate=True)

    def premises(self) -> Result:
        return self._run("correct", negate=False)


def _conjuncts(claim) -> list:
    """`app => (A and B ...)` as [app => A, app => B, ...]; else [claim]."""
    if z3.is_app_of(claim, z3.Z3_OP_IMPLIES):
        app, holds = claim.children()
        if z3.is_and(holds):
            return [z3.Implies(app, h) for h in holds.children()]
    if z3.is_and(claim):
        return list(claim.children())
    return [claim]


def _config(block_sizes, release: Release) -> SymConfig:
    return SymConfig.fresh("c", block_sizes, release=release)


# Symmetry reduction on top of the fixed roles: slot i holds running position i
# (waiting slot R + j holds waiting position j), and the present slots of each queue
# are a prefix.  Sound because every state with at most R running and W waiting
# requests is a relabelling of exactly one such state (running[i] -> slot i,
# waiting[j] -> slot R + j: symbolic.slot_assignment, the agreement test's
# layout), and the encoding, the property formulas and the state invariant never
# read a slot's index: loops go by queue position, victims and queue orders by
# (priority, arrival, id rank, position), all of which the relabelling carries
# along.  proofs/README.md, "Symmetry reduction".
CANONICAL_POSITIONS = True


def _roles_state(R: int, W: int, block_sizes, release: Release) -> SymState:
    """A fresh state whose first R slots can only be running and the next W only
    waiting, with the queue flag a constant so that z3 simplifies the other
    queue's branches away (symbolic.fixed_roles states the same as a premise);
    with CANONICAL_POSITIONS each slot's queue position is a constant too."""
    st = SymState.fresh(R + W, "b", _config(block_sizes, release))
    slots = tuple(sl.evolve(running=z3.BoolVal(i < R)) for i, sl in enumerate(st.slots))
    if CANONICAL_POSITIONS:
        slots = tuple(sl.evolve(pos=z3.IntVal(i if i < R else i - R)) for i, sl in enumerate(slots))
    return replace(st, slots=slots)


def _prefix(st: SymState, R: int, W: int):
    """The present slots of each queue are a prefix of its slots (canonical layout)."""
    if not CANONICAL_POSITIONS:
        return z3.BoolVal(True)
    out = [z3.Implies(st.slots[i].present, st.slots[i - 1].present) for i in range(1, R)]
    out += [z3.Implies(st.slots[R + j].present, st.slots[R + j - 1].present) for j in range(1, W)]
    return z3.And(out)


def _step_premise(R: int, W: int, block_sizes, release: Release) -> tuple[SymState, list]:
    """The canonical R + W state and what the bounded claims assume of it."""
    def make():
        before = _roles_state(R, W, block_sizes, release)
        return before, [state_invariant(before), fixed_roles(before, range(R), range(R, R + W)),
                        _prefix(before, R, W)]
    return _built(("premise", R, W, tuple(block_sizes), release), make)


def _step_encoding(R: int, W: int, block_sizes, variant: str, release: Release) -> tuple:
    """(before, premise, decision, after, asks, pools): one schedule + update step
    of `variant` from the canonical R + W state."""
    def make():
        before, premise = _step_premise(R, W, block_sizes, release)
        asks: list = []
        pools: list = []
        d, after = encoding.schedule_update(before, variant, list(range(R)), list(range(R, R + W)),
                                            asks=asks, pools=pools)
        return before, premise, d, after, tuple(asks), tuple(pools)
    return _built(("step", R, W, tuple(block_sizes), variant, release), make)


def step_claim(prop: str, R: int, W: int, release: Release, block_sizes=BLOCK_SIZES,
               timeout_s=DEFAULT_TIMEOUT_S) -> _Claim:
    def build(variant, block_sizes=block_sizes):
        before, premise, d, after, asks, pools = _step_encoding(R, W, block_sizes, variant, release)
        applicable, holds = PROPERTY_FORMULAS[prop](before, d, after)
        # A property that does not apply holds (spec/properties.py NOT_APPLICABLE).
        claim = z3.Implies(applicable, holds)
        lemmas = STEP_LEMMAS[prop](before, list(asks), list(pools)) if prop in STEP_LEMMAS else []
        return list(premise), claim, applicable, before, lemmas
    return _Claim(build, timeout_s, block_sizes)


def asks_within_demand(before: SymState, asks, pools) -> list[list]:
    """Each running request's allocate_slots asks for at most the blocks its
    whole capped need would take (the grant is at most that need and the block
    count is monotone in the tokens).  The preemption claim's block-demand
    conjunct follows from it by linear arithmetic: the first failed ask exceeded the
    free blocks less the asks granted before it, all within their demands.  Without
    it z3 must find that monotonicity through every ceiling at once, and was
    unknown at 3 + 3 after every restart (258 s); with it the claim is proved at
    4 + 4 in seconds (proofs/README.md, "Lemmas")."""
    return [[z3.Implies(cond, blocks <= block_demand(before, before.slots[s], capped_need(before, before.slots[s])))
             for s, cond, blocks in asks]]


def pool_conserved(before: SymState, asks, pools) -> list[list]:
    """After each iteration of either loop, the free blocks are >= 0 and, with the
    blocks the requests present before the step hold, make the usable blocks: one
    stage per iteration, each from the one before (an iteration moves a victim's
    blocks to the free count and a grant's from it).  The conservation conjunct
    of the claims is then the finish loop's frees alone; without the chain z3 goes
    through every iteration's if-then-else at once, and needed 3-4 restarts in
    most PRIORITY cases at 4 + 4 (proofs/README.md, "Lemmas")."""
    U = before.config.num_usable_blocks
    return [[free >= 0, z3.Sum([z3.If(sl.present, b, 0) for sl, b in zip(before.slots, blocks)]) + free == U]
            for blocks, free in pools]


# property -> its lemma stages over (the state before, the running loop's asks, the pool after each iteration).
STEP_LEMMAS = {"preemption_only_on_allocation_failure": asks_within_demand, "kv_blocks_conserved": pool_conserved}


def inductive_step_claim(R: int, W: int, release: Release, block_sizes=BLOCK_SIZES,
                         timeout_s=DEFAULT_TIMEOUT_S) -> _Claim:
    def build(variant, block_sizes=block_sizes):
        before, premise, d, after, _, pools = _step_encoding(R, W, block_sizes, variant, release)
        something = z3.Or(list(d.scheduled))
        return list(premise), state_invariant(after), something, before, pool_conserved(before, [], list(pools))
    return _Claim(build, timeout_s, block_sizes)


def _new_request(before: SymState, slot: int) -> tuple[SymSlot, list]:
    new = SymSlot.fresh("new")
    c = before.config
    valid = [1 <= new.num_prompt_tokens, new.num_prompt_tokens < c.max_model_len, new.max_tokens >= 1,
             new.output_len >= 0, z3.Not(before.slots[slot].present)]
    # A new id (add_request rejects a duplicate, S:3065).
    valid += [z3.Implies(s.present, s.rid_rank != new.rid_rank) for i, s in enumerate(before.slots) if i != slot]
    return new, valid


def inductive_add_claim(R: int, W: int, release: Release, block_sizes=BLOCK_SIZES,
                        timeout_s=DEFAULT_TIMEOUT_S) -> _Claim:
    """add_request into a state of at most R running and W waiting requests, in the
    canonical layout of the step claims (symmetry reduction, proofs/README.md); the
    new request takes slot R + W, absent before.  Any before-state of that size is
    a relabelling of one of these, and add_request reads no slot index (its queue
    place comes from the waiting count or the queue keys).  With every slot free
    to take either role (the form before), 4 + 4 took 155 s with 45 restarts;
    this form 5 s, and 8 + 8 15 s."""
    def build(variant, block_sizes=block_sizes):
        before = _roles_state(R, W + 1, block_sizes, release)
        new, valid = _new_request(before, R + W)
        after = encoding.add_request(before, R + W, new, True, variant)
        some_waiting = z3.And(before.num_waiting > 0, before.num_running > 0)
        premise = [state_invariant(before), fixed_roles(before, range(R), range(R, R + W + 1)),
                   _prefix(before, R, W + 1)]
        return premise + valid, state_invariant(after), some_waiting, before, []
    return _Claim(build, timeout_s, block_sizes)


def inductive_abort_claim(N: int, release: Release, block_sizes=BLOCK_SIZES,
                          timeout_s=DEFAULT_TIMEOUT_S) -> _Claim:
    def build(variant, block_sizes=block_sizes):
        before = SymState.fresh(N, "b", _config(block_sizes, release))
        after = encoding.abort(before, 0, True, variant)
        holding = z3.And(before.slots[0].present, before.slots[0].num_blocks > 0)
        return [state_invariant(before), before.slots[0].present], state_invariant(after), holding, before, []
    return _Claim(build, timeout_s, block_sizes)


def initial_claim(N: int, release: Release, block_sizes=BLOCK_SIZES, timeout_s=DEFAULT_TIMEOUT_S) -> _Claim:
    def build(variant, block_sizes=block_sizes):
        c = _config(block_sizes, release)
        st = SymState.empty(c, N)
        if VARIANTS[variant].initial_free_includes_null:
            st = replace(st, num_free_blocks=c.num_gpu_blocks)
        return [c.constraints()], state_invariant(st), z3.BoolVal(True), st, []
    return _Claim(build, timeout_s, block_sizes)


def _obligation(name, prop, kind, bound, claim: _Claim, bad, doc, witness_goal, release: Release) -> Obligation:
    from . import witness as witness_mod

    def witness():
        return witness_mod.find_witness(witness_goal, release, claim)

    return Obligation(name=name, property=prop, kind=kind, bound=bound, discharge=claim.discharge,
                      witness=witness, bad_variants=tuple(bad), expected="proved", doc=doc,
                      extra={"witness_goal": witness_goal})


def build_obligations(release: Release, bound: int | None = None,
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Obligation]:
    """Every obligation of `release`'s rules: one "step" per registered property,
    the invariant's inductiveness over the three transitions, the initial state,
    and the theorems of proofs/starvation.py."""
    n = bound or DEFAULT_BOUND
    note = f"block_size in {{{','.join(map(str, BLOCK_SIZES))}}}"
    b1 = Bound(n, n, 1, note)

    def own(name: str) -> int:
        return bound or BOUND_OVERRIDES.get(name, n)

    out = []
    for prop in PROPERTIES:
        if prop in OUTSIDE_BOUNDED:
            continue
        # KeyError for a registered property without a z3 formula or bad variants:
        # every property the encoding can state must have its obligation.
        PROPERTY_FORMULAS[prop], STEP_BAD_VARIANTS[prop]
        m = own(f"step:{prop}")
        out.append(_obligation(
            f"step:{prop}", prop, "step", Bound(m, m, 1, note), step_claim(prop, m, m, release, timeout_s=timeout_s),
            STEP_BAD_VARIANTS.get(prop, ()), PROPERTIES[prop].doc, f"property:{prop}", release))
    out.append(_obligation("inductive:schedule+update", INVARIANT, "inductive", b1,
                           inductive_step_claim(n, n, release, timeout_s=timeout_s),
                           ("preemption_leaks_blocks", "computed_tokens_not_reset", "run_slot_check_off_by_one"),
                           "schedule + update_from_output preserves the state invariant", "inductive:step", release))
    nd = own("inductive:add_request")
    out.append(_obligation("inductive:add_request", INVARIANT, "inductive",
                           Bound(nd, nd, 1, "before it; and the new request; " + note),
                           inductive_add_claim(nd, nd, release, timeout_s=timeout_s),
                           ("add_at_front",), "add_request preserves the state invariant", "inductive:add", release))
    na, ni = own("inductive:abort"), own("initial")
    out.append(_obligation("inductive:abort", INVARIANT, "inductive", Bound(na, na, 1, f"requests <= {2 * na}, "
                           "any queue; " + note), inductive_abort_claim(2 * na, release, timeout_s=timeout_s),
                           ("abort_leaks_blocks",), "finish_requests (abort) preserves the state invariant",
                           "inductive:abort", release))
    out.append(_obligation("initial", INVARIANT, "initial", Bound(ni, ni, 1, "the empty state; " + note),
                           initial_claim(2 * ni, release, timeout_s=timeout_s), ("initial_free_includes_null",),
                           "the empty state satisfies the state invariant", "initial", release))
    out += theorem_obligations(release)
    out += loop_obligations(release, timeout_s)
    out += pool_obligations(release, timeout_s)
    out += encoder_obligations(release, timeout_s)
    return [for_release(o, release) for o in out]


def for_release(o: Obligation, release: Release) -> Obligation:
    """`o` for `release` (proofs/release.py): without the bad variants that are
    that release's own rule, expected refuted where the release has a known vLLM
    bug for the property, and its bound naming the release."""
    finding = release.finding(o.property) if o.kind in ("step", "loop") else None
    restriction = release.restriction()
    if not restriction:
        return o
    bound = replace(o.bound, note="; ".join(x for x in (o.bound.note, restriction) if x))
    return replace(o, bad_variants=release.bad_variants(o.bad_variants), bound=bound,
                   expected="refuted" if finding else o.expected,
                   extra={**o.extra, **({"finding": finding} if finding else {})})


def loop_obligations(release: Release, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Obligation]:
    """proofs/loop_claims.py's claims for any number of requests."""
    from .loop_obligations import obligations

    return obligations(release, timeout_s)


def pool_obligations(release: Release, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Obligation]:
    """proofs/pool_invariants.py's claims for any number of blocks and requests."""
    from . import pool_invariants

    return pool_invariants.obligations(release, timeout_s)


def encoder_obligations(release: Release, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Obligation]:
    """proofs/encoder_invariants.py's claims for any number of requests, items and entries."""
    from . import encoder_invariants

    return encoder_invariants.obligations(release, timeout_s)


def theorem_obligations(release: Release) -> list[Obligation]:
    """proofs/starvation.py's unbounded theorems and proofs/liveness.py's liveness theorem."""
    from . import liveness, starvation

    return starvation.obligations(release) + list(liveness.OBLIGATIONS)


def covered_properties(obligations: list[Obligation]) -> set[str]:
    return {o.property for o in obligations}


__all__ = ["INVARIANT", "OUTSIDE_BOUNDED", "OUTSIDE_ENCODING", "STATE_INVARIANTS", "INVARIANT_FORMULAS", "STEP_BAD_VARIANTS",
           "build_obligations", "outside_encoding",
           "check"]
