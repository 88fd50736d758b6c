"""A liveness theorem: under stated conditions every request finishes within a
number of steps computed from the scenario, by a ranking function checked by z3.

**Theorem (liveness.bounded_finish).**  Synchronous engine, prefix caching off,
prefill throttling off (`prefill_schedule_interval` 1, no data-parallel cadence),
the FCFS policy, and chunked prefill on or a step budget of at least
`max_model_len − 1` tokens (`unmet_conditions`).  Then every request of a
scenario finishes (or is aborted) by step

    finish_bound = T_last + Σ_i W_i,   W_i = min(prompt_len_i + max_tokens_i, max_model_len)

where T_last is the last arrival step.  Valid configs need nothing more: vLLM's
start-up check makes every request fit an empty pool.

**Ranking function.**  Call the *head* the first request of `running` before a
step (none when `running` is empty).  With c_h its computed tokens,

    R = Σ_{unfinished requests i ≠ head} W_i + (W_h − 1 − c_h)

R ≥ 0 (an unfinished head has c_h ≤ W_h − 2), an arrival adds its W_i, and
every step in which a request is present lowers R by at least 1:

1. `head_kept`: a head is granted n ≥ 1 tokens and is not preempted.  It is
   served first, so both budgets are whole (≥ 1) and its capped need is ≥ 1
   (S:855-872; no `max_tokens` guard in the synchronous engine).  If its
   allocation fails, FCFS preempts from the tail (S:986), so the head is the
   victim only once every other running request is gone; the waiting requests
   hold no blocks (flags off), so the head then has the whole usable pool, which
   holds `max_model_len` tokens.  So it is never preempted and c_h grows by n.
2. `idle_admission`: with `running` empty the waiting head is admitted with
   n ≥ 1 tokens: run slots and both budgets are free, the pool is empty (no
   watermark on a first admission, K:539-546; the full-ISL gate asks at most
   ⌈max_model_len / block_size⌉ blocks), and with chunked prefill off the whole
   need, at most `max_model_len − 1`, fits the budget (S:1387-1394).
3. `ranking`: from 1 and 2, R' ≤ R − 1 + (the W of the step's arrivals), also
   when the head finishes and the next request becomes the head.  Summed over
   the run: the steps with a request present number at most Σ W_i, and the
   other steps come before T_last.

Each is a z3 claim over unbounded integers on the aggregate quantities above
(`claim_*`), checked per block size (cdiv by a numeral) and refuted by a bad
variant that breaks the condition it rests on.  **Why the aggregation is
faithful**: tests/test_proofs_liveness.py checks 1, 2 and the decrease of R on
every step of random spec scenarios that meet the conditions (with preemptions
and both admission modes among them), and a spec mutant that preempts the head
makes that check fail; it also checks `finish_bound` on whole runs.

**Each condition matters** (proofs/LIVENESS.md, "A liveness theorem"): without
FCFS, `tests/counterexamples/liveness-finishes-priority-tie.json` never
finishes (the priority victim on a key tie is the head); with chunked prefill
off and a budget below `max_model_len − 1`,
`tests/counterexamples/liveness-finishes-resume.json` never finishes; both
replay on vLLM 0.33.0 (tests/test_counterexample_vllm.py).  Async scheduling and
prefix caching are outside the proof (waiting requests may hold blocks); random
search found no run past the bound with either (LIVENESS.md).
"""

from __future__ import annotations

import time
from typing import Any

from schedspec.spec.properties import get_step_budget
from schedspec.spec.state import SchedulerState

from .obligation import Bound, Obligation, Result
from .starvation import prove
from .symbolic import BLOCK_SIZES, cdiv_const

PROPERTY = "liveness"


# --- the statement on scenarios -----------------------------------------------------------


def unmet_conditions(config) -> list[str]:
    """The theorem's conditions that `config` (a SchedulerConfig) does not meet."""
    out = []
    if config.policy != "fcfs":
        out.append("fcfs")
    if config.async_scheduling:
        out.append("synchronous engine")
    if config.enable_prefix_caching:
        out.append("prefix caching off")
    if config.prefill_schedule_interval > 1:
        # A held step skips a head that is a prefill chunk while another request decodes
        # (docs/rules.md §18): the ranking function below need not fall in it.
        out.append("prefill throttling off")
    if not config.enable_chunked_prefill and get_step_budget(SchedulerState(config)) < config.max_model_len - 1:
        out.append("chunked prefill on or a step budget >= max_model_len - 1")
    return out


def work(request, max_model_len: int) -> int:
    """W_i: a bound on the steps request i needs as the head (module docstring)."""
    max_tokens = request.max_tokens if request.max_tokens is not None else max_model_len - request.prompt_len
    return min(request.prompt_len + max_tokens, max_model_len)


def finish_bound(scenario) -> int:
    """The step by which every request of `scenario` has finished, under the conditions."""
    L = scenario.scheduler_config().max_model_len
    last_arrival = max((r.arrival_step for r in scenario.requests), default=0)
    return last_arrival + sum(work(r, L) for r in scenario.requests)


# --- the z3 claims ---------------------------------------------------------------------------

BAD_VARIANTS = ("victim_head", "waiting_hold_blocks", "no_admission_budget", "watermark_when_idle",
                "head_loses_progress")


def claim_head_kept(z3, bs: int, variant: str):
    """Lemma 1 for block size `bs`: the head of a non-empty `running` is granted
    n >= 1 tokens and fits the pool before it could be its own victim."""
    I = z3.Int
    L, U, TB, IB, th = I("L"), I("U"), I("token_budget"), I("input_budget"), I("threshold")
    c, nt, held_others, held_waiting, R0 = I("c"), I("num_tokens"), I("held_others"), I("held_waiting"), I("R0")
    b_h = cdiv_const(c, bs)  # blocks match computed tokens (spec/invariants.py)
    free = U - b_h - held_others - held_waiting
    premises = [
        L >= 2, U >= cdiv_const(L, bs), TB >= 1, IB >= 1, th >= 0, R0 >= 1,  # a valid config (vLLM's checks)
        0 <= c, c < nt, nt <= L - 1,  # an unfinished running request of the synchronous engine
        held_others >= 0, z3.Implies(R0 == 1, held_others == 0), free >= 0,
        # flags off: a waiting request holds no block (preemption frees all, K:647-657)
        held_waiting == (held_waiting if variant == "waiting_hold_blocks" else 0), held_waiting >= 0,
    ]
    need = nt - c
    n = z3.If(z3.And(0 < th, th < need), th, need)  # S:860
    n = z3.If(n < TB, n, TB)
    n = z3.If(n < IB, n, IB)
    n = z3.If(n < L - c - 1, n, L - c - 1)  # S:868
    blocks = cdiv_const(z3.If(c + n < L, c + n, L), bs) - b_h  # K:571-574
    if variant == "victim_head":
        # The head is the first victim: it keeps running only if it fits what is free now.
        kept = blocks <= free
    else:
        # FCFS takes victims from the tail (S:986): the head is the victim only after the
        # R0 - 1 others have freed their blocks.
        kept = blocks <= free + held_others
    return z3.Implies(z3.And(premises), z3.And(n >= 1, kept))


def claim_idle_admission(z3, bs: int, variant: str):
    """Lemma 2 for block size `bs`: with `running` empty, the waiting head is
    admitted with n >= 1 tokens."""
    I, B = z3.Int, z3.Bool
    L, U, TB, IB, th, M = I("L"), I("U"), I("token_budget"), I("input_budget"), I("threshold"), I("max_num_active")
    nt, wm = I("num_tokens"), I("watermark_blocks")
    chunked, full_isl = B("chunked"), B("full_isl")
    budget = z3.If(TB < IB, TB, IB)  # S:1345
    condition = z3.Or(chunked, budget >= L - 1)
    premises = [
        L >= 2, U >= cdiv_const(L, bs), TB >= 1, IB >= 1, th >= 0, M >= 1, wm >= 0, wm < U,
        z3.Or(chunked, IB >= L),  # vLLM's check with chunked prefill off (C:362)
        1 <= nt, nt <= L - 1,  # a waiting request: nothing computed (flags off), num_tokens < L
        condition if variant != "no_admission_budget" else True,
    ]
    n = z3.If(z3.And(0 < th, th < nt), th, nt)  # S:1356, S:1382
    fits_budget = z3.Or(chunked, n <= budget)  # S:1387-1394
    n = z3.If(n < budget, n, budget)  # S:1396
    # The pool is empty; the watermark applies to admissions only once a request is
    # scheduled in the step (K:539-546), and none is.
    watermark = wm if variant == "watermark_when_idle" else 0
    gate = z3.Implies(full_isl, cdiv_const(z3.If(nt < L, nt, L), bs) + watermark <= U)  # K:552-569
    fits_pool = cdiv_const(z3.If(n < L, n, L), bs) + watermark <= U  # K:605-609
    return z3.Implies(z3.And(premises), z3.And(fits_budget, gate, fits_pool, n >= 1))


def claim_ranking(z3, variant: str):
    """Lemma 3: R falls by at least 1 in every step with a request present, less
    the W of the step's arrivals; so a run has at most Σ W_i such steps.

    `rest`/`rest_after`: Σ W of the unfinished non-head requests before / after the
    step (after: the arrivals added, finished and aborted ones gone).  `next`: the
    request that heads `running` after the step when the head finishes (one of
    `rest`, with its progress c_next), or the waiting head admitted into an empty
    `running` (lemma 2: n >= 1 tokens)."""
    I, B = z3.Int, z3.Bool
    rest, rest2, arrivals = I("rest"), I("rest_after"), I("arrivals")
    W_h, c_h, n, c_next, W_next = I("W_head"), I("c_head"), I("n"), I("c_next"), I("W_next")
    has_head, finishes, has_next = B("has_head"), B("finishes"), B("has_next")
    next_in_rest = z3.Or(z3.Not(has_head), z3.And(finishes, has_next))
    premises = [
        arrivals >= 0, rest >= 0, rest2 >= 0, rest2 <= rest + arrivals,
        W_h >= 2, 0 <= c_h, c_h <= W_h - 2,  # an unfinished head: R >= 0
        n >= 1,  # lemmas 1 and 2
        W_next >= 2, 0 <= c_next, c_next <= W_next - 2, z3.Implies(next_in_rest, W_next <= rest2),
        # the admitted waiting head, unfinished, has computed exactly its grant
        z3.Implies(z3.And(z3.Not(has_head), z3.Not(finishes)), c_next == n),
        # a head still unfinished after the step has c <= W - 2, as before it
        z3.Implies(z3.And(has_head, z3.Not(finishes)), c_h + n <= W_h - 2),
    ]
    R = rest + z3.If(has_head, W_h - 1 - c_h, 0)
    if variant == "head_loses_progress":
        kept = rest2 + W_h  # a preempted head would count whole again, as a non-head
    else:
        kept = rest2 + (W_h - 1 - (c_h + n))  # lemma 1: it stays the head, c_h grows by n
    head_done = z3.If(has_next, rest2 - W_next + (W_next - 1 - c_next), rest2)
    admitted = z3.If(finishes, rest2 - W_next, rest2 - W_next + (W_next - 1 - c_next))
    R_after = z3.If(has_head, z3.If(finishes, head_done, kept), admitted)
    return z3.Implies(z3.And(premises), z3.And(R_after <= R - 1 + arrivals, R_after >= 0))


PARTS = (
    ("head_kept", lambda z3, v: [(f"block_size {bs}", claim_head_kept(z3, bs, v)) for bs in BLOCK_SIZES]),
    ("idle_admission", lambda z3, v: [(f"block_size {bs}", claim_idle_admission(z3, bs, v)) for bs in BLOCK_SIZES]),
    ("ranking", lambda z3, v: [("", claim_ranking(z3, v))]),
)


def discharge(variant: str = "correct") -> Result:
    """Proved when every part holds for every block size; refuted at the first
    part that z3 refutes, with its model (starvation.py's `prove`, retries included)."""
    import z3

    t0 = time.perf_counter()
    for name, build in PARTS:
        for where, formula in build(z3, variant):
            r = prove(lambda _z3, formula=formula: formula, f"{name} {where}".strip())
            if r.status == "refuted":
                return Result("refuted", time.perf_counter() - t0, f"{name} {where}".strip(), r.model)
            if r.status == "unknown":
                return Result("unknown", time.perf_counter() - t0, r.detail)
    return Result("proved", time.perf_counter() - t0,
                  f"{len(PARTS)} lemmas, {len(BLOCK_SIZES)} block sizes each for the first two")


WITNESS_SEED = 77  # generator seed of the witness search (reference/generator.py)


def witness() -> tuple[Result, Any]:
    """A scenario that meets the conditions, with preemptions (so lemma 1's
    tail-first victims act) and a busy run: the first of the seeded random
    scenarios, made FCFS with both flags off, that has them.  It finishes by
    finish_bound; `schedspec run FILE` shows it."""
    import dataclasses

    from schedspec.reference.engine import run_scenario
    from schedspec.reference.generator import generate_scenario, scenario_rng
    from schedspec.reference.impl import SpecScheduler

    t0 = time.perf_counter()
    for i in range(400):
        s = generate_scenario(scenario_rng(WITNESS_SEED, i), i)
        config = dataclasses.replace(s.config, policy="fcfs", enable_prefix_caching=False, async_scheduling=False,
                                     enable_chunked_prefill=True)
        s = dataclasses.replace(s, config=config, aborts=(), max_steps=10_000)
        if len(s.requests) < 3 or unmet_conditions(s.scheduler_config()):
            continue
        trace = run_scenario(s, SpecScheduler())
        summary = trace["summary"]
        preemptions = sum(r["num_preemptions"] for r in summary["requests"].values())
        if summary["unfinished"] or preemptions < 2:
            continue
        last = max(r["finish_step"] for r in summary["requests"].values())
        bound = finish_bound(s)
        s = dataclasses.replace(
            s, name="witness-liveness-bounded_finish", max_steps=last + 1,
            description=f"Witness of liveness.bounded_finish: FCFS, both flags off, chunked prefill on; "
                        f"{len(s.requests)} requests, {preemptions} preemptions, all finished by step {last}, "
                        f"within the bound {bound} (T_last + sum of W_i). Random scenario {i} of generator seed "
                        f"{WITNESS_SEED}, made FCFS with flags off. Reproduce: schedspec run FILE.")
        return Result("proved", time.perf_counter() - t0, f"scenario {i}: {preemptions} preemptions, "
                      f"last finish at step {last} <= bound {bound}", {"step": last}), s
    return Result("refuted", time.perf_counter() - t0, "no scenario with preemptions among 400"), None


OBLIGATIONS: list[Obligation] = [
    Obligation(
        name="liveness.bounded_finish", property=PROPERTY, kind="theorem",
        bound=Bound(note="unbounded integers (any number of requests, any config); synchronous engine, "
                         "prefix caching off, FCFS, chunked prefill on or step budget >= max_model_len - 1"),
        discharge=discharge, witness=witness, bad_variants=BAD_VARIANTS,
        doc="Every request finishes by step T_last + sum_i min(prompt_len_i + max_tokens_i, max_model_len): "
            "the head of running always gains >= 1 token and is never preempted, an idle engine admits the "
            "waiting head, so the ranking function R falls by >= 1 per busy step.",
    ),
]


__all__ = ["BAD_VARIANTS", "OBLIGATIONS", "PROPERTY", "claim_head_kept", "claim_idle_admission", "claim_ranking",
           "discharge", "finish_bound", "unmet_conditions", "witness", "work"]
