"""The starvation condition as theorems over unbounded integers (z3).

Setting (docs/rules.md §11): D running requests each needing exactly one token (decodes),
a step budget B = min(token_budget, max_num_batched_tokens), and one prompt that
still needs P tokens, either at the head of `waiting` (its first chunk) or, once
admitted, at the tail of `running` (its later chunks).  The claims:

- `budget_exhausted`: D >= B => the waiting prompt receives 0 tokens;
- `no_run_slot`: D >= max_num_active_reqs => the waiting prompt receives 0 tokens;
- `chunk_grant`: D < B, chunked prefill on, a free run slot, enough free blocks =>
  it receives min(P, cap) > 0, where cap = B - D, or min(B - D, threshold) when the
  long-prefill threshold is in force (more than one eligible request, S:773-779);
- `prefill_steps`: under the same premises, with no decode finishing, after k steps
  the prompt has min(P, k*cap) computed tokens (induction on k), so its prefill
  completes in exactly ceil(P / cap) steps, and D stays constant;
- `chunked_off_admission`: chunked prefill off, a free run slot, enough free
  blocks => it is admitted iff its (threshold-capped) need fits B - D.

They are proved on the *aggregate* encoding (`aggregate_step`): D, B, P and the
config values as single integers, no per-request unrolling, so they hold for any
number of requests.  `agreement` justifies the aggregation: on a per-request
encoding of `schedule()` restricted to the setting (`per_request_step`: up to
AGREEMENT_MAX_DECODES explicit decode slots with their own computed tokens and
block demands, the prompt, sequential budgets and a sequential free pool), z3
shows that every per-request outcome is an outcome of the aggregate encoding.

Both encodings are written once over an `ops` namespace, so the same code is
evaluated on plain integers; tests/test_proofs_starvation.py compares that
evaluation with `spec.scheduler.schedule` exhaustively on small values.

Rule variants ("correct" and the known-bad ones in BAD_VARIANTS) change the
aggregate encoding; each theorem is refuted on at least one of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from schedspec.spec.versions import INPUT_BUDGET, LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL, LONG_PREFILL_THRESHOLD_NEEDS_TWO

from .release import DEFAULT, Release
from .obligation import Bound, Obligation, Result

PROPERTY = "starvation_condition"
BAD_VARIANTS = ("waiting_first", "budget_off_by_one", "no_run_slot_check", "threshold_one_eligible")
VARIANTS = ("correct",) + BAD_VARIANTS
AGREEMENT_MAX_DECODES = 6
AGREEMENT_BLOCK_SIZES = (1, 4, 16)
SOLVER_TIMEOUT_MS = 20000


# --- the two arithmetic back ends ------------------------------------------------------


class PyOps:
    """Plain integers and booleans: evaluates an encoding on concrete values."""

    @staticmethod
    def If(c, a, b):
        return a if c else b

    @staticmethod
    def And(*xs):
        return all(xs)

    @staticmethod
    def Or(*xs):
        return any(xs)

    @staticmethod
    def Not(x):
        return not x

    @staticmethod
    def Implies(a, b):
        return (not a) or b

    @staticmethod
    def Min(*xs):
        return min(xs)

    @staticmethod
    def Max(*xs):
        return max(xs)

    @staticmethod
    def cdiv(a, b: int):
        return -(-a // b)

    @staticmethod
    def Sum(xs):
        return sum(xs)


class Z3Ops:
    """The same operations on z3 terms (z3 imported lazily: CLI modules stay light)."""

    def __init__(self):
        import z3

        self.z3 = z3

    def If(self, c, a, b):
        return self.z3.If(c, a, b)

    def And(self, *xs):
        return self.z3.And(*xs)

    def Or(self, *xs):
        return self.z3.Or(*xs)

    def Not(self, x):
        return self.z3.Not(x)

    def Implies(self, a, b):
        return self.z3.Implies(a, b)

    def Min(self, *xs):
        m = xs[0]
        for x in xs[1:]:
            m = self.z3.If(x < m, x, m)
        return m

    def Max(self, *xs):
        m = xs[0]
        for x in xs[1:]:
            m = self.z3.If(x > m, x, m)
        return m

    def cdiv(self, a, b: int):
        # b is a numeral: z3's integer division by a constant stays in linear arithmetic.
        return (a + (b - 1)) / b

    def Sum(self, xs):
        return self.z3.Sum(list(xs)) if xs else self.z3.IntVal(0)


# --- the aggregate encoding ------------------------------------------------------------


@dataclass
class AggState:
    """One step of the setting, aggregated.  `enough_blocks` is the premise
    F >= (new blocks the D decodes need) + cdiv(prompt num_tokens, block_size) + watermark
    blocks, the same premise as spec/properties.py `starvation_condition`."""

    D: Any  # running decodes, each needing exactly one token
    W: Any  # waiting requests (the prompt, when waiting, is their head)
    token_budget: Any
    max_num_batched_tokens: Any
    P: Any  # the prompt's remaining need, num_tokens - num_computed_tokens
    prompt_running: Any  # False: head of waiting; True: tail of running
    threshold: Any  # long_prefill_token_threshold
    max_num_active_reqs: Any
    chunked: Any  # enable_chunked_prefill
    enough_blocks: Any
    release: Release = DEFAULT  # the vLLM release whose rules the step applies


@dataclass
class AggChoice:
    """What the aggregate leaves open when the pool is short (`enough_blocks` false):
    whether a decode allocation failed and preempted, how many decode tokens were
    granted before that, and whether the prompt's own allocation succeeded."""

    preempted: Any
    decode_tokens: Any
    prompt_alloc_ok: Any


@dataclass
class AggOut:
    decode_tokens: Any
    prompt_tokens: Any
    preempted: Any
    choice_ok: Any  # the choice is one the rules allow


def step_budget(o, s: AggState):
    """spec/properties.py get_step_budget: the token budget alone before 0.28.0."""
    if not s.release.applies(INPUT_BUDGET):
        return s.token_budget
    return o.Min(s.token_budget, s.max_num_batched_tokens)


def threshold_in_force(o, s: AggState, variant: str = "correct"):
    """S:770-779: the cap applies only with more than one eligible request (from
    0.31.0) and with chunked prefill on (from 0.34.0)."""
    eligible = s.D + s.W + o.If(s.prompt_running, 1, 0)
    on = s.threshold > 0
    if s.release.applies(LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL):
        on = o.And(on, s.chunked)
    if variant == "threshold_one_eligible" or not s.release.applies(LONG_PREFILL_THRESHOLD_NEEDS_TWO):
        return on  # the bad variant is the rule before 0.31.0
    return o.And(on, eligible > 1)


def capped_need(o, s: AggState, variant: str = "correct"):
    """The prompt's need after the long-prefill cap (S:860, S:1382)."""
    return o.If(o.And(threshold_in_force(o, s, variant), s.threshold < s.P), s.threshold, s.P)


def aggregate_step(o, s: AggState, ch: AggChoice, variant: str = "correct") -> AggOut:
    B = step_budget(o, s)
    slack = 1 if variant == "budget_off_by_one" else 0
    need = capped_need(o, s, variant)
    full_decodes = o.Min(s.D, B)
    no_failure = o.Not(ch.preempted)
    decode_tokens = o.If(ch.preempted, ch.decode_tokens, full_decodes)
    choice_ok = o.And(
        o.Implies(s.enough_blocks, o.And(no_failure, ch.prompt_alloc_ok)),
        0 <= ch.decode_tokens, ch.decode_tokens <= full_decodes,
    )
    left = B - decode_tokens

    # Later chunks: the prompt is in the running loop, after the decodes (S:809-1052).
    # Under PRIORITY a decode's failure may preempt another decode and the prompt
    # still be served; only the FCFS outcome (the tail, i.e. the prompt, is the
    # victim) is pinned down, so a preempted step leaves its grant open in [0, P].
    run_n = o.Min(need, left + slack)
    run_tokens = o.If(o.And(no_failure, left > 0, ch.prompt_alloc_ok), run_n, 0)

    # First chunk: the waiting loop (S:1066-1687), skipped after any preemption.
    run_slot = s.D < s.max_num_active_reqs
    if variant == "no_run_slot_check":
        run_slot = True
    if variant == "waiting_first":
        wait_left = B
        gate = o.And(wait_left > 0, run_slot, s.W >= 1)
    else:
        wait_left = left
        gate = o.And(no_failure, wait_left > 0, run_slot, s.W >= 1)
    fits = o.Or(s.chunked, need <= wait_left + slack)
    wait_n = o.Min(need, wait_left + slack)
    wait_tokens = o.If(o.And(gate, fits, ch.prompt_alloc_ok), wait_n, 0)
    if variant == "waiting_first":
        decode_tokens = o.If(ch.preempted, ch.decode_tokens, o.Min(s.D, B - wait_tokens))

    prompt_tokens = o.If(s.prompt_running, run_tokens, wait_tokens)
    return AggOut(decode_tokens, prompt_tokens, ch.preempted, choice_ok)


def chunk_cap(o, s: AggState):
    """The chunk the theorems promise: B - D, capped by the threshold when in force."""
    left = step_budget(o, s) - s.D
    return o.If(o.And(threshold_in_force(o, s), s.threshold < left), s.threshold, left)


# --- the per-request encoding (for the agreement obligation) ---------------------------


@dataclass
class Slot:
    """A running decode: its computed tokens and the new blocks one more token needs."""

    num_computed_tokens: Any
    block_demand: Any


@dataclass
class PerRequestState:
    D: Any
    decodes: list  # AGREEMENT_MAX_DECODES slots; slot i is running iff i < D
    W: Any
    token_budget: Any
    max_num_batched_tokens: Any
    max_model_len: Any
    threshold: Any
    max_num_active_reqs: Any
    chunked: Any
    reserve_full_isl: Any
    watermark_blocks: Any
    num_free_blocks: Any
    prompt_running: Any
    prompt_num_tokens: Any
    prompt_num_computed_tokens: Any
    release: Release = DEFAULT  # the vLLM release whose rules the step applies


@dataclass
class PerRequestOut:
    decode_tokens: Any
    prompt_tokens: Any
    preempted: Any
    prompt_alloc_ok: Any


def per_request_step(o, s: PerRequestState, block_size: int) -> PerRequestOut:
    """`schedule()` restricted to the setting, FCFS, one request at a time: the
    running loop over the decode slots (then the prompt when it runs), each with
    the three caps and its own allocation against the remaining pool, then the
    waiting loop for the prompt.  Exact for every output when no allocation fails;
    on a failure it stops the step with `preempted` (S:1066 then skips admission,
    and under FCFS the prompt, the tail of running, is the first victim), which is
    exact for the prompt's grant."""
    tb, ib, free = s.token_budget, s.max_num_batched_tokens, s.num_free_blocks
    stop, pre = False, False
    decode_total = 0
    eligible = s.D + s.W + o.If(s.prompt_running, 1, 0)
    thr = o.If(eligible > 1, s.threshold, 0) if s.release.applies(LONG_PREFILL_THRESHOLD_NEEDS_TWO) \
        else s.threshold
    if s.release.applies(LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL):
        thr = o.If(s.chunked, thr, 0)
    if not s.release.applies(INPUT_BUDGET):
        ib = tb  # the token budget alone (versions.INPUT_BUDGET)

    def cap(need, computed):
        n = o.If(o.And(thr > 0, thr < need), thr, need)
        n = o.Min(n, tb, ib)
        return o.Min(n, s.max_model_len - computed - 1)

    for i, d in enumerate(s.decodes):
        live = o.And(i < s.D, o.Not(stop), tb > 0)
        stop = o.Or(stop, o.And(live, ib <= 0))
        live = o.And(live, ib > 0)
        n = cap(1, d.num_computed_tokens)
        live = o.And(live, n > 0)  # n == 0 is skipped, not the end of the scan (S:907)
        ok = d.block_demand <= free
        grant = o.And(live, ok)
        fail = o.And(live, o.Not(ok))
        pre, stop = o.Or(pre, fail), o.Or(stop, fail)
        decode_total = decode_total + o.If(grant, n, 0)
        tb, ib = tb - o.If(grant, n, 0), ib - o.If(grant, n, 0)
        free = free - o.If(grant, d.block_demand, 0)

    computed = s.prompt_num_computed_tokens
    need = s.prompt_num_tokens - computed
    held = o.cdiv(computed, block_size)

    # The prompt as the tail of running.
    live = o.And(s.prompt_running, o.Not(stop), tb > 0, ib > 0)
    n = cap(need, computed)
    live = o.And(live, n > 0)
    demand = o.Max(o.cdiv(computed + n, block_size) - held, 0)
    run_ok = demand <= free
    run_grant = o.If(o.And(live, run_ok), n, 0)
    pre = o.Or(pre, o.And(live, o.Not(run_ok)))

    # The prompt as the head of waiting (admission: watermark once something runs,
    # the full-ISL gate, K:539-569).
    enter = o.And(o.Not(s.prompt_running), o.Not(pre), tb > 0, ib > 0, s.D < s.max_num_active_reqs)
    n = o.If(o.And(thr > 0, thr < need), thr, need)
    budget = o.Min(tb, ib)
    fits = o.Or(s.chunked, n <= budget)
    n = o.Min(n, budget)
    wm = o.If(s.D > 0, s.watermark_blocks, 0)
    full = o.Max(o.cdiv(s.prompt_num_tokens, block_size) - held, 0)
    gate_ok = o.Or(o.Not(s.reserve_full_isl), full + wm <= free)
    chunk = o.Max(o.cdiv(computed + n, block_size) - held, 0)
    wait_ok = o.And(gate_ok, chunk + wm <= free)
    wait_grant = o.If(o.And(enter, fits, wait_ok), n, 0)

    prompt_alloc_ok = o.If(s.prompt_running, run_ok, wait_ok)
    return PerRequestOut(decode_total, o.If(s.prompt_running, run_grant, wait_grant), pre, prompt_alloc_ok)


def per_request_premises(o, s: PerRequestState, block_size: int):
    """The setting: every running decode needs exactly one token and is unfinished
    (num_tokens < max_model_len); blocks held match computed tokens, so a decode's
    next token needs 0 or 1 new block; the prompt needs P >= 1 and is unfinished;
    a waiting prompt has computed nothing; a config vLLM accepts."""
    cs = [
        0 <= s.D, s.D <= len(s.decodes), s.W >= o.If(s.prompt_running, 0, 1),
        s.token_budget >= 1, s.max_num_batched_tokens >= 1, s.max_model_len >= 2,
        s.threshold >= 0, s.max_num_active_reqs >= 1, s.watermark_blocks >= 0, s.num_free_blocks >= 0,
        s.prompt_num_computed_tokens >= 0, s.prompt_num_tokens > s.prompt_num_computed_tokens,
        s.prompt_num_tokens < s.max_model_len,
        o.Implies(o.Not(s.prompt_running), s.prompt_num_computed_tokens == 0),
        o.Implies(s.prompt_running, s.prompt_num_computed_tokens > 0),
    ]
    for d in s.decodes:
        c = d.num_computed_tokens
        cs += [c >= 0, c + 1 < s.max_model_len,
               d.block_demand == o.cdiv(c + 1, block_size) - o.cdiv(c, block_size)]
    return o.And(*cs)


def aggregate_of(o, s: PerRequestState, block_size: int) -> AggState:
    """The abstraction map: a per-request state's aggregate (counts and sums)."""
    decode_demand = o.Sum([o.If(i < s.D, d.block_demand, 0) for i, d in enumerate(s.decodes)])
    enough = s.num_free_blocks >= (decode_demand + o.cdiv(s.prompt_num_tokens, block_size)
                                   + s.watermark_blocks)
    return AggState(
        D=s.D, W=s.W, token_budget=s.token_budget, max_num_batched_tokens=s.max_num_batched_tokens,
        P=s.prompt_num_tokens - s.prompt_num_computed_tokens, prompt_running=s.prompt_running,
        threshold=s.threshold, max_num_active_reqs=s.max_num_active_reqs, chunked=s.chunked,
        enough_blocks=enough, release=s.release,
    )


# --- z3 plumbing ----------------------------------------------------------------------


def _z3():
    import z3

    return z3


def agg_vars(z3, release: Release, tag: str = "") -> tuple[AggState, AggChoice]:
    I, Bo = z3.Int, z3.Bool
    s = AggState(
        D=I(f"D{tag}"), W=I(f"W{tag}"), token_budget=I(f"token_budget{tag}"),
        max_num_batched_tokens=I(f"max_num_batched_tokens{tag}"), P=I(f"P{tag}"),
        prompt_running=Bo(f"prompt_running{tag}"), threshold=I(f"threshold{tag}"),
        max_num_active_reqs=I(f"max_num_active_reqs{tag}"), chunked=Bo(f"chunked{tag}"),
        enough_blocks=Bo(f"enough_blocks{tag}"), release=release,
    )
    ch = AggChoice(Bo(f"preempted{tag}"), I(f"decode_tokens_chosen{tag}"), Bo(f"prompt_alloc_ok{tag}"))
    return s, ch


def agg_domain(z3, s: AggState):
    """Every aggregate state of the setting (any size): the config values vLLM accepts."""
    return z3.And(
        s.D >= 0, s.W >= z3.If(s.prompt_running, 0, 1), s.token_budget >= 1,
        s.max_num_batched_tokens >= 1, s.P >= 1, s.threshold >= 0, s.max_num_active_reqs >= 1,
        # a running prompt and the decodes all hold a run slot
        z3.Implies(s.prompt_running, s.D + 1 <= s.max_num_active_reqs),
    )


def _model_dict(z3, m) -> dict[str, Any]:
    out = {}
    for d in m.decls():
        v = m[d]
        out[d.name()] = v.as_long() if z3.is_int_value(v) else z3.is_true(v)
    return out


def prove(claims: Callable[[Any], Any], what: str) -> Result:
    """`claims(z3)` builds the formula that must be valid; proved = its negation is unsat."""
    z3 = _z3()
    from .solving import recheck  # z3 at import: kept out of the CLI's light imports, as _z3

    t = time.perf_counter()
    negation = z3.Not(claims(z3))

    def build():
        s = z3.Solver()
        s.add(negation)
        return s

    r, solver = recheck(build, SOLVER_TIMEOUT_MS)
    dt = time.perf_counter() - t
    if r == "unsat":
        return Result("proved", dt, what)
    if r == "sat":
        return Result("refuted", dt, f"{what}: counterexample", _model_dict(z3, solver.model()))
    return Result("unknown", dt, f"{what}: z3 returned unknown ({solver.reason_unknown()})")


# --- the theorems -----------------------------------------------------------------------


def _setting(z3, release: Release, tag=""):
    s, ch = agg_vars(z3, release, tag)
    return s, ch, agg_domain(z3, s)


def claim_budget_exhausted(variant: str, release: Release):
    def f(z3):
        s, ch, dom = _setting(z3, release)
        out = aggregate_step(Z3Ops(), s, ch, variant)
        pre = z3.And(dom, out.choice_ok, z3.Not(s.prompt_running), s.D >= step_budget(Z3Ops(), s))
        return z3.Implies(pre, out.prompt_tokens == 0)
    return f


def claim_no_run_slot(variant: str, release: Release):
    def f(z3):
        s, ch, dom = _setting(z3, release)
        out = aggregate_step(Z3Ops(), s, ch, variant)
        pre = z3.And(dom, out.choice_ok, z3.Not(s.prompt_running), s.D >= s.max_num_active_reqs)
        return z3.Implies(pre, out.prompt_tokens == 0)
    return f


def _grant_premises(z3, s, dom, out):
    o = Z3Ops()
    return z3.And(dom, out.choice_ok, s.D < step_budget(o, s), s.D < s.max_num_active_reqs, s.enough_blocks)


def claim_chunk_grant(variant: str, release: Release):
    """Both phases: the first chunk (waiting) and every later one (running)."""
    def f(z3):
        o = Z3Ops()
        s, ch, dom = _setting(z3, release)
        out = aggregate_step(o, s, ch, variant)
        pre = z3.And(_grant_premises(z3, s, dom, out), s.chunked)
        cap = chunk_cap(o, s)
        expected = o.Min(s.P, cap)
        plain = o.Min(s.P, step_budget(o, s) - s.D)  # the min(P, B - D)
        return z3.Implies(pre, z3.And(
            out.prompt_tokens == expected, expected > 0,
            z3.Implies(z3.Not(threshold_in_force(o, s)), out.prompt_tokens == plain),
            out.decode_tokens == s.D, z3.Not(out.preempted)))
    return f


def claim_chunked_off_admission(variant: str, release: Release):
    def f(z3):
        o = Z3Ops()
        s, ch, dom = _setting(z3, release)
        out = aggregate_step(o, s, ch, variant)
        pre = z3.And(dom, out.choice_ok, z3.Not(s.prompt_running), z3.Not(s.chunked),
                     s.D < s.max_num_active_reqs, s.enough_blocks)
        need = capped_need(o, s)
        B = step_budget(o, s)
        admitted = out.prompt_tokens > 0
        return z3.Implies(pre, z3.And(
            admitted == (need <= B - s.D),
            z3.Implies(admitted, out.prompt_tokens == need),
            z3.Implies(z3.Not(threshold_in_force(o, s)), admitted == (s.P <= B - s.D))))
    return f


def _prefill_state(z3, P_total, computed, tag, release: Release):
    """The aggregate state of step k: the prompt has `computed` tokens; waiting
    (only itself) while it has none, the tail of running after."""
    s, ch = agg_vars(z3, release, tag)
    return s, ch, z3.And(
        s.P == P_total - computed, s.prompt_running == (computed > 0),
        s.W == z3.If(computed > 0, 0, 1))


def claim_prefill_step(variant: str, release: Release):
    """Induction step: inv(k) = (computed == min(P, kc)) with kc = k*cap, and the
    next step under the premises gives inv(k+1) with kc + cap, the same D, no
    preemption.  The base, inv(0), is `computed == 0 == min(P, 0)`."""
    def f(z3):
        o = Z3Ops()
        P_total, computed, kc, D0 = z3.Ints("P_total computed kc D0")
        s, ch, link = _prefill_state(z3, P_total, computed, "", release)
        dom = agg_domain(z3, s)
        out = aggregate_step(o, s, ch, variant)
        cap = chunk_cap(o, s)
        inv = z3.And(kc >= 0, computed == o.Min(P_total, kc), s.D == D0)
        pre = z3.And(P_total >= 1, link, dom, out.choice_ok, computed < P_total, s.chunked,
                     s.D < step_budget(o, s), s.D + 1 <= s.max_num_active_reqs, s.enough_blocks, inv)
        after = computed + out.prompt_tokens
        # the next state's D: no preemption, and no decode finishes (premise of the setting)
        return z3.Implies(pre, z3.And(after == o.Min(P_total, kc + cap), z3.Not(out.preempted),
                                      out.decode_tokens == D0))
    return f


def claim_prefill_cap_invariant(variant: str, release: Release):
    """The chunk cap is the same in every step of the prefill: it depends on D, the
    budgets and whether the threshold is in force, and the eligible count is D + 1
    both while the prompt waits and while it runs."""
    def f(z3):
        o = Z3Ops()
        P_total, c1, c2 = z3.Ints("P_total c1 c2")
        s1, _, l1 = _prefill_state(z3, P_total, c1, "_1", release)
        s2, _, l2 = _prefill_state(z3, P_total, c2, "_2", release)
        same = z3.And(*[getattr(s1, k) == getattr(s2, k) for k in
                        ("D", "token_budget", "max_num_batched_tokens", "threshold",
                         "max_num_active_reqs", "chunked")])
        pre = z3.And(l1, l2, same, 0 <= c1, c1 < P_total, 0 <= c2, c2 < P_total)
        return z3.Implies(pre, chunk_cap(o, s1) == chunk_cap(o, s2))
    return f


def claim_ceil_steps(_variant: str = "correct"):
    """min(P, k*cap) reaches P exactly from k = ceil(P / cap) on (nonlinear integers)."""
    def f(z3):
        P, cap, k, s = z3.Ints("P cap k s")
        is_ceil = z3.And((s - 1) * cap < P, P <= s * cap)
        return z3.Implies(z3.And(P >= 1, cap >= 1, k >= 0, is_ceil),
                          z3.And(s >= 1, (k * cap >= P) == (k >= s)))
    return f


def discharge_prefill_steps(variant: str, release: Release) -> Result:
    parts = [("step", claim_prefill_step(variant, release)),
             ("cap invariant", claim_prefill_cap_invariant(variant, release)),
             ("ceil", claim_ceil_steps(variant))]
    total, details = 0.0, []
    for what, c in parts:
        r = prove(c, f"prefill_steps {what}")
        total += r.seconds
        if r.status != "proved":
            return Result(r.status, total, r.detail, r.model)
        details.append(what)
    return Result("proved", total, "proved: " + ", ".join(details))


# --- agreement of the aggregate with the per-request encoding -------------------------


def per_request_vars(z3, release: Release, n: int = AGREEMENT_MAX_DECODES) -> PerRequestState:
    I, Bo = z3.Int, z3.Bool
    return PerRequestState(
        D=I("D"), decodes=[Slot(I(f"ncomp_{i}"), I(f"demand_{i}")) for i in range(n)], W=I("W"),
        token_budget=I("token_budget"), max_num_batched_tokens=I("max_num_batched_tokens"),
        max_model_len=I("max_model_len"), threshold=I("threshold"),
        max_num_active_reqs=I("max_num_active_reqs"), chunked=Bo("chunked"),
        reserve_full_isl=Bo("reserve_full_isl"), watermark_blocks=I("watermark_blocks"),
        num_free_blocks=I("num_free_blocks"), prompt_running=Bo("prompt_running"),
        prompt_num_tokens=I("prompt_num_tokens"), prompt_num_computed_tokens=I("prompt_num_computed_tokens"),
        release=release,
    )


def claim_agreement(variant: str, block_size: int, release: Release):
    """Every per-request outcome is an aggregate outcome: with the choices the
    per-request run made (did it preempt, how many decode tokens, did the prompt's
    allocation succeed), the aggregate allows them and gives the same prompt grant,
    decode total and preemption; in the running phase the FCFS per-request run pins
    the prompt's grant even after a failure, so it is compared there too."""
    def f(z3):
        o = Z3Ops()
        s = per_request_vars(z3, release)
        pr = per_request_step(o, s, block_size)
        a = aggregate_of(o, s, block_size)
        ch = AggChoice(pr.preempted, pr.decode_tokens, pr.prompt_alloc_ok)
        out = aggregate_step(o, a, ch, variant)
        pre = z3.And(per_request_premises(o, s, block_size), agg_domain(z3, a))
        return z3.Implies(pre, z3.And(
            out.choice_ok, out.prompt_tokens == pr.prompt_tokens,
            out.decode_tokens == pr.decode_tokens, out.preempted == pr.preempted))
    return f


def discharge_agreement(variant: str, release: Release) -> Result:
    total = 0.0
    for bs in AGREEMENT_BLOCK_SIZES:
        r = prove(claim_agreement(variant, bs, release), f"agreement block_size={bs}")
        total += r.seconds
        if r.status != "proved":
            return Result(r.status, total, r.detail, r.model)
    return Result("proved", total, f"per-request (D <= {AGREEMENT_MAX_DECODES}, block_size in "
                                   f"{AGREEMENT_BLOCK_SIZES}) refines the aggregate")


# --- witnesses ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WitnessValues:
    D: int
    B: int
    P: int
    max_num_active_reqs: int
    chunked: bool
    threshold: int


def _witness_values(premises: Callable[[Any, AggState], Any], release: Release,
                    extra: Callable[[Any, AggState], Any] | None = None) -> tuple[Result, WitnessValues | None]:
    """The smallest concrete (D, B, P, ...) satisfying `premises`, with W = 1 (the
    prompt alone waits), max_num_batched_tokens >= token_budget (so B is the
    token budget, as in Table 3) and D <= B (the decodes all start in one step)."""
    z3 = _z3()
    from .solving import recheck

    o = Z3Ops()
    t = time.perf_counter()
    s, ch = agg_vars(z3, release)
    out = aggregate_step(o, s, ch, "correct")

    def build():
        opt = z3.Optimize()
        opt.add(agg_domain(z3, s), out.choice_ok, premises(z3, s), s.W == 1, z3.Not(s.prompt_running),
                s.max_num_batched_tokens >= s.token_budget, s.D <= s.token_budget, s.enough_blocks,
                z3.Not(ch.preempted), s.D <= s.max_num_active_reqs, s.threshold <= s.P)
        if extra is not None:
            opt.add(extra(z3, s))
        opt.minimize(s.D + s.token_budget + s.P + s.max_num_active_reqs + s.threshold)
        return opt

    r, opt = recheck(build, SOLVER_TIMEOUT_MS)
    dt = time.perf_counter() - t
    if r != "sat":
        return Result("unknown" if r == "unknown" else "refuted", dt, f"premises {r}"), None
    m = opt.model()
    val = lambda x: m.eval(x, model_completion=True)
    w = WitnessValues(D=val(s.D).as_long(), B=val(s.token_budget).as_long(), P=val(s.P).as_long(),
                      max_num_active_reqs=val(s.max_num_active_reqs).as_long(),
                      chunked=z3.is_true(val(s.chunked)), threshold=val(s.threshold).as_long())
    return Result("proved", dt, f"premises satisfiable: {w}", _model_dict(z3, m)), w


def witness_scenario(w: WitnessValues, name: str, claim: str, release: Release):
    """A scenario showing the setting at step 1: D one-token prompts arrive at step 0
    and become decodes; the P-token prompt arrives at step 1."""
    from schedspec.reference.scenario import RequestSpec, Scenario

    steps = 2 + (-(-w.P // max(w.B - w.D, 1)))
    max_tokens = steps + 4  # no decode finishes while the prompt is followed
    batched = max(w.B, w.max_num_active_reqs)
    config: dict[str, Any] = {
        "max_num_batched_tokens": batched,
        "max_num_scheduled_tokens": w.B,
        "max_num_seqs": w.max_num_active_reqs,
        "enable_chunked_prefill": w.chunked,
        "long_prefill_token_threshold": w.threshold,
    }
    if not w.chunked:
        # vLLM requires max_num_batched_tokens >= max_model_len without chunked prefill.
        config["max_model_len"] = batched = max(batched, w.P + 1, max_tokens + 2)
        config["max_num_batched_tokens"] = batched
        config["num_gpu_blocks"] = batched + 2
    reqs = [RequestSpec(id=f"d{i}", prompt_len=1, arrival_step=0, max_tokens=max_tokens, arrival_time=float(i))
            for i in range(w.D)]
    reqs.append(RequestSpec(id="prompt", prompt_len=w.P, arrival_step=1, max_tokens=2, arrival_time=float(w.D)))
    desc = (f"Witness of {name} ({PROPERTY}): D={w.D} decodes, step budget B={w.B}, "
            f"a P={w.P}-token prompt arriving at step 1, max_num_seqs={w.max_num_active_reqs}, "
            f"chunked prefill {'on' if w.chunked else 'off'}, threshold {w.threshold}. {claim} "
            f"Reproduce: schedspec run FILE (written by `schedspec prove`).")
    return Scenario(name=f"witness-{name}", config=release.scenario_config(config), requests=tuple(reqs),
                    max_steps=steps,
                    description=desc)


def make_witness(name: str, premises, claim: str, release: Release, extra=None):
    def witness():
        r, w = _witness_values(premises, release, extra)
        if w is None:
            return r, None
        return r, witness_scenario(w, name, claim, release)
    return witness


# --- the obligations ------------------------------------------------------------------------


def _single(claim_factory, what, release: Release):
    return lambda variant: prove(claim_factory(variant, release), what)


UNBOUNDED = Bound(note="unbounded integers (any D, B, P, config)")

def obligations(release: Release) -> list[Obligation]:
    """The starvation theorems of `release`'s rules: the first grant, then the prefill."""
    return _grant_obligations(release) + _prefill_obligations(release)


def _grant_obligations(release: Release) -> list[Obligation]:
    return [
        Obligation(
            name="starvation.budget_exhausted", property=PROPERTY, kind="theorem", bound=UNBOUNDED,
            discharge=_single(claim_budget_exhausted, "D >= B => prompt gets 0", release),
            witness=make_witness("budget_exhausted",
                                 lambda z3, s: z3.And(s.D >= s.token_budget, s.D < s.max_num_active_reqs,
                                                      s.chunked, s.D >= 1),
                                 "Expect: at step 1 the prompt gets 0 tokens.", release),
            bad_variants=("waiting_first",),
            doc="D running decodes, D >= B = min(token_budget, max_num_batched_tokens): the waiting "
                "prompt receives 0 tokens, whatever the pool (a preemption also skips admission).",
        ),
        Obligation(
            name="starvation.no_run_slot", property=PROPERTY, kind="theorem", bound=UNBOUNDED,
            discharge=_single(claim_no_run_slot, "D >= max_num_active_reqs => prompt gets 0", release),
            witness=make_witness("no_run_slot",
                                 lambda z3, s: z3.And(s.D >= s.max_num_active_reqs, s.D < s.token_budget,
                                                      s.chunked),
                                 "Expect: at step 1 the prompt gets 0 tokens although budget is left.", release),
            bad_variants=("no_run_slot_check",),
            doc="With every run slot taken (S:1093-1096) the waiting prompt receives 0 tokens.",
        ),
        Obligation(
            name="starvation.chunk_grant", property=PROPERTY, kind="theorem", bound=UNBOUNDED,
            discharge=_single(claim_chunk_grant, "D < B, chunked => prompt gets min(P, cap)", release),
            witness=make_witness("chunk_grant",
                                 lambda z3, s: z3.And(s.D < s.token_budget, s.D < s.max_num_active_reqs,
                                                      s.chunked, s.D >= 1, s.P > s.token_budget - s.D),
                                 "Expect: at step 1 every decode gets 1 token and the prompt gets B - D.", release),
            bad_variants=("budget_off_by_one", "waiting_first", "threshold_one_eligible"),
            doc="D < B, chunked prefill on, a free run slot, enough free blocks: the prompt receives "
                "min(P, cap) > 0 in its first and every later chunk, cap = B - D (or min(B - D, "
                "threshold) when the threshold is in force); the decodes all get their token.",
        ),
    ]


def _prefill_obligations(release: Release) -> list[Obligation]:
    return [
        Obligation(
            name="starvation.prefill_steps", property=PROPERTY, kind="theorem", bound=UNBOUNDED,
            discharge=lambda variant: discharge_prefill_steps(variant, release),
            witness=make_witness("prefill_steps",
                                 lambda z3, s: z3.And(s.D < s.token_budget, s.D < s.max_num_active_reqs,
                                                      s.chunked, s.D >= 1,
                                                      s.P > 2 * (s.token_budget - s.D),
                                                      s.P % (s.token_budget - s.D) != 0),
                                 "Expect: the prompt's first token comes ceil(P / (B - D)) steps after "
                                 "it arrives, its computed tokens growing by B - D a step.", release),
            bad_variants=("budget_off_by_one",),
            doc="Same premises, no decode finishing: after k steps the prompt has min(P, k*cap) "
                "computed tokens (induction on k), so its prefill completes in exactly ceil(P / cap) "
                "steps, with D constant and no preemption.",
        ),
        Obligation(
            name="starvation.chunked_off_admission", property=PROPERTY, kind="theorem", bound=UNBOUNDED,
            discharge=_single(claim_chunked_off_admission, "chunked off => admitted iff P <= B - D", release),
            witness=make_witness("chunked_off_admission",
                                 lambda z3, s: z3.And(z3.Not(s.chunked), s.D < s.max_num_active_reqs,
                                                      s.D >= 1, s.P > s.token_budget - s.D, s.P <= s.token_budget),
                                 "Expect: the prompt does not fit B - D, so it is not admitted at step 1.", release),
            bad_variants=("budget_off_by_one",),
            doc="Chunked prefill off, a free run slot, enough free blocks: the waiting prompt is "
                "admitted, with its whole (threshold-capped) need, iff that need is <= B - D.",
        ),
        Obligation(
            name="starvation.aggregate_agrees", property=PROPERTY, kind="theorem",
            bound=Bound(max_running=AGREEMENT_MAX_DECODES, max_waiting=1,
                        note=f"block_size in {AGREEMENT_BLOCK_SIZES}; other values unbounded"),
            discharge=lambda variant: discharge_agreement(variant, release),
            witness=make_witness("aggregate_agrees",
                                 lambda z3, s: z3.And(s.D == AGREEMENT_MAX_DECODES, s.chunked,
                                                      s.D < s.max_num_active_reqs, s.token_budget > s.D),
                                 "Expect: the per-request and aggregate encodings both give the prompt B - D.",
                                 release),
            bad_variants=("waiting_first", "budget_off_by_one"),
            doc="The aggregate encoding the theorems use agrees with a per-request encoding of "
                "schedule() (explicit decode slots, sequential budgets and free pool): every "
                "per-request outcome is an aggregate outcome with the same grants.",
        ),
    ]
