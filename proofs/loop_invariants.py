"""Per-step properties for ANY number of requests, by loop invariants (z3).

`schedule()` is two loops over arbitrarily long lists: the running loop
(S:809-1052, spec/scheduler.py `schedule_running` with `allocate_or_preempt`)
and the waiting loop (S:1066-1687, `schedule_waiting` / `admit`), then
`_update_after_schedule` and `update_from_output`, whose removal of finished
requests is a third loop (S:2607-2618, `remove_finished`).  The bounded
encoding (encoding.py) unrolls them over a fixed number of slots; here each
loop is one *iteration* from an arbitrary *iteration state*, as Dafny, Verus or
Why3 would state it:

- entry:        the state before the loop satisfies the invariant;
- preservation: invariant ∧ loop guard ∧ one iteration ⇒ invariant afterwards;
- exit:         invariant ∧ ¬guard ⇒ the property (or the next loop's entry).

By induction on the number of iterations the property then holds after any
number of iterations, so for any number of running and waiting requests.

**Iteration state.**  Aggregates of the whole list (never one variable per
request): budgets left (`tb`, `ib`, S:735/738; `ib` is the input budget a grant
may still take, the spec's `input_budget` less a drafter's rows `D`, which is
what both loops test and cap by, S:813, 862-864, 1345), tokens granted (`T`), the
drafter's rows charged for them (`Dc`, `D` per grant, S:737, 1019),
preemptions so far (`P`), `len(running)` (`Rn`), the cursor (`cur`), free and
held blocks (`F`, `H`), the FCFS break flag (`stopped`), blocks allocated
(`AL`) and the block demand of the requests visited / not yet visited (`DV`,
`Drest`), the capped needs of the granted requests (`CG`), and, relative to
the ghost request below, the capped needs of the ungranted and of the
preempted requests ahead of it (`UA`, `PA`).

**Requests: one ghost and two instances.**  A claim about every request is
proved for one arbitrary request `x` (the ghost): since nothing constrains
which one, it holds for all.  The per-request invariant `J` is assumed for
`x`, for the request at the cursor (`c`) and for the victim (`v`), which are
instances of the same universally quantified fact, and proved for `x` after
the iteration.  Two of them are the same request exactly when both are running
at the same position; then their fields are equal.

**Sums.**  Where an iteration takes one request's share out of a sum (a
refund out of `T`, a victim's blocks out of `H`, the current request's demand
out of `Drest`), the sum is split as `share + rest` with `rest >= 0`: true of
any list whose elements are non-negative, so sound for every N.

**The victim** (S:948-986): FCFS the tail of `running`, PRIORITY the largest
(priority, arrival_time), first in running order.  Within one step this order
of the requests of `before.running` never changes, so it is a fixed ranking
`rank` (0 = the first victim): FCFS `rank = R0 - 1 - position`, PRIORITY by
(priority, arrival_time) descending, then position.  The invariant says a
request is preempted iff its rank is below `P`; so the next victim, the live
request of least rank, is the one of rank `P`, which the iteration assumes of
`v` (the agreement test checks on concrete runs that the spec's own
`choose_victim` returns exactly it).

**Scope.** A paused engine or not (`LoopConfig.pa` / `pn`, free flags, S:3213): PAUSED_ALL
starts the step with no token budget (S:735, 739-741), so nothing is scheduled, every
running request is skipped on purpose (`running_never_starved` names it), and the waiting
loop is not entered (S:1066); PAUSED_NEW admits only requests holding KV blocks
(S:1100-1107), none here, where the KV connector is not encoded.  No encoder inputs (a request's items can only shorten its chunk, or skip it;
their own budget and cache are proved in encoder_invariants.py); prefix caching on or
off (an admission starts from its hit, `WaitReq.hb` / `he`; `H` counts a shared block
once, so a preempted or finished request frees `RunSplit.Fv` / `fr` <= its blocks;
each request's cached blocks `cb`, which a grant and a delivery extend, `cache_extent`,
`deliver_tokens`);
prefill throttling on or off (`LoopConfig.hold`, the step's `defer_prefills`, free, so
either gate, data-parallel or local, is covered; vLLM 0.33.0 only): a held step skips
every running prefill chunk (S:838; whether a request is one, `is_prefill_chunk` as the
last update left it, is free) and stops admission at the first request with more than
its last token to compute (S:1340), one more named exception to `running_never_starved`
and to `running_before_waiting`; async scheduling on or off (`LoopConfig.asy`, a
symbolic flag, so every claim covers both engines): output placeholders in a
running request's need (S:855), the async max_tokens guard (S:816-830: 0
tokens, skipped), the waiting loop's skip of a request with stale output in
flight (S:1123), the placeholder `update_after_schedule` adds
(async_scheduler.py:24-56) and the delivery of an older batch (S:2301-2618);
`placeholders_never_negative`, a property of the async engine alone, is proved
with async on.  Structured output: a waiting head whose grammar is compiling or
failed is skipped and keeps its place (S:1118-1121), so `grammar_wait_respected`
holds for any number of requests.  LoRA (`LoopConfig.lora`, symbolic; 0.33.0 only,
release.models_lora): a waiting head whose adapter would be one too many is skipped
and keeps its place (S:1128-1140), so `max_loras_respected` holds for any number of
requests and adapters; the iteration state counts the batch's adapters (`Lc`), and
whether the head's adapter is new to the batch is an input of each iteration.
Speculative decoding (`LoopConfig.sd`, symbolic; 0.33.0 only,
release.models_spec_decode): a running request's drafts count in its need
(num_tokens_with_spec, S:855) and the grant sends those that fit (S:1025-1041);
allocations reserve the drafter's lookahead slots (K:571-574); a one-token
admission beside a decode is padded to 1 + num_speculative_tokens (S:1358-1380:
one token left, a running request granted, and no prefill chunk granted, which the
running loop's state records as `PS`, vLLM's prefill_scheduled, S:1016); a drafter that adds rows to
the batch (`max_num_new_slots_for_drafting`, `D`, a parallel drafter's K - 1)
has them charged to the input budget with every grant and refunded with a
victim's grant (S:737, 813, 862-864, 971, 1019, 1345).  A multi-module MTP
drafter's prefill lookahead (`num_prefill_lookahead_tokens` > 1, which cuts
chunks short of the prefill's end, S:695-714) is outside: the claims are stated
for drafters that read at most one token ahead (n-gram, the EAGLE family), and
the agreement test draws no other.  The claims about schedule()'s
loops (SPEC_DECODE) are proved with it on or off; the four whose lemmas model
the delivery of one sampled token are stated with it off (update_after_schedule's
placeholder per draft sent is in placeholders_after).  The block size is a case split over
BLOCK_SIZES (each `cdiv` then divides by a numeral); every other value is an
unbounded integer.

`run_iteration`, `wait_iteration` and `finish_iteration` are the encodings;
`tests/test_proofs_loop_invariants.py` drives the spec's own rule functions
(`num_new_tokens_running`, `blocks_to_allocate`, `choose_victim`, `preempt`,
`allocate`, `grant`, `num_new_tokens_waiting`, `admit`) one iteration at a
time on concrete states and compares every field of the iteration state with
these encodings evaluated on the same values; mutants of the encodings must
make that comparison fail.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable

import z3

from schedspec.spec.config import PRIORITY, SchedulerConfig
from schedspec.spec.versions import (INPUT_BUDGET, LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL,
                                     LONG_PREFILL_THRESHOLD_NEEDS_TWO, PRIORITY_SELF_PREEMPTION_CONTINUES)

from . import release
from .encoding import z3_max0, z3_min
from .obligation import Bound, Obligation, Result
from .symbolic import BLOCK_SIZES, cdiv_const
from .solving import check, first_unsatisfiable, prove_parts

DEFAULT_TIMEOUT_S = 20.0


# --- rule variants of the iteration encodings -------------------------------------------


@dataclass(frozen=True)
class LoopRules:
    """The spec's rules ("correct") and known-bad changes, one rule each."""

    token_budget_extra: int = 0  # the step starts with token_budget + 1
    grant_ignores_input_budget: bool = False  # running grant not capped by the input budget
    running_cap: int | None = None  # an extra cap on every running grant (a request left short)
    running_need_extra: int = 0  # the running need over-estimated
    skip_zero_grant: bool = True  # S:907-925: n == 0 is skipped, never granted
    model_len_margin: int = 1  # cap 3: max_model_len - num_computed_tokens - margin (S:868)
    fcfs_victim_head: bool = False  # FCFS victim = head of running instead of its tail (S:986)
    n_once_per_request: bool = True  # False: n recomputed after each preemption (a refund raises it)
    fail_when_exact_fit: bool = False  # allocation "fails" although it fits exactly
    cursor_fix: bool = True  # S:964: a victim behind the cursor moves the cursor back
    refund: bool = True  # S:967-973: a granted victim gives its grant back
    preempt_frees_blocks: bool = True
    fcfs_break: bool = True  # S:998-1008: FCFS stops after a self-preemption
    admit_after_preemption: bool = False  # S:1066 gate removed
    run_slot_check_strict: bool = True  # S:1093-1096: len(running) >= max stops admission
    admission_budget_extra: int = 0  # admission chunk capped at budget + extra
    chunked_off_fit_strict: bool = False  # chunked off: stop when the need is >= the budget (not >)
    watermark_on_first_admission: bool = False  # the watermark also when nothing runs (K:539-546)
    gate_without_watermark: bool = False  # the full-ISL gate leaves the watermark out (K:552-569)
    # prefix caching: hit blocks nobody holds leave the free queue, so the pool check and
    # the full-ISL gate count them (K:552-569, 603-609; T:243-271)
    evictable_hits_checked: bool = True
    finish_frees_blocks: bool = True
    # async scheduling (spec/scheduler.py, spec/request.py), each the spec's rule when True/default
    placeholders_in_need: bool = True  # S:855: need = num_tokens + num_output_placeholders - computed
    last_token_guard: bool = True  # S:816-830: last_token_in_flight -> 0 tokens, skipped
    last_token_guard_stops: bool = False  # the guard ends the running loop instead of skipping (a `break`)
    stale_head: str = "skip"  # S:1123: a waiting head with stale output in flight is skipped; "stop" / "admit"
    placeholder_added: str = "not_prefill"  # async_scheduler.py:24-56: one placeholder unless mid-prefill;
    #                                          "never" / "always"
    inflight_added: bool = True  # S:1899-1931: update_after_schedule adds the grant to num_in_flight_tokens
    stale_decremented: bool = True  # S:2362-2384: a stale delivery lowers num_stale_output_tokens
    # structured output
    grammar_skip: bool = True  # S:1118-1121: a head whose grammar compiles (or failed) is skipped
    # LoRA
    lora_cap_extra: int = 0  # S:1128-1140: skipped when the batch has max_loras (+ extra) adapters
    # speculative decoding
    drafts_in_need: int = 1  # S:855: num_tokens_with_spec counts each draft once (2: twice)
    victim_drafts_dropped: bool = True  # S:967-973: a preempted request's drafts leave the step's output
    padded_budget_checked: bool = True  # S:1376-1378: a padded new decode that does not fit stops admission
    placeholders_per_draft: bool = True  # async_scheduler.py:40-45: a placeholder per draft sent too
    drafter_rows_charged: bool = True  # S:971, 1019: a grant's drafter rows leave the input budget (and return)
    prefill_scheduled_noted: bool = True  # S:1016: a grant to a prefill chunk sets prefill_scheduled
    padding_checks_prefill: bool = True  # S:1358-1380: no padding once a prefill chunk is scheduled
    padding_after_hit: bool = True  # S:1367: a hit (computed tokens) pads without a running grant
    # pause (S:735, 739-741, 1100-1107)
    paused_all_budget_zero: bool = True  # PAUSED_ALL: the step starts with token budget 0
    paused_new_admits_none: bool = True  # PAUSED_NEW: no admission (of a request holding no KV blocks)
    # prefill throttling
    held_chunk_skipped: bool = True  # S:838: a step that holds prefill skips a running prefill chunk
    held_admission_stops: bool = True  # S:1340: ... and stops admission at a request with prefill left
    # prefix caching: which blocks are cached
    grant_caches_computed: bool = True  # K:642-646: a grant caches up to its computed tokens (False: all it knows)
    delivery_caches_computed: bool = True  # S:2450-2471: a delivery caches up to computed tokens out of flight
    #                                        (False: all it knows, the tokens just sampled too)


LOOP_VARIANTS: dict[str, LoopRules] = {
    "correct": LoopRules(),
    "budget_off_by_one": LoopRules(token_budget_extra=1),
    "grant_ignores_input_budget": LoopRules(grant_ignores_input_budget=True),
    "running_capped_at_1": LoopRules(running_cap=1),
    "running_need_plus_2": LoopRules(running_need_extra=2),
    # as encoding.py's: with cap 3 one token tighter a 0-token grant exists, and is not skipped
    "zero_grant": LoopRules(model_len_margin=2, skip_zero_grant=False),
    "victim_head_of_running": LoopRules(fcfs_victim_head=True),
    "n_recomputed_after_preemption": LoopRules(n_once_per_request=False),
    "preemption_without_allocation_failure": LoopRules(fail_when_exact_fit=True),
    "no_cursor_fix": LoopRules(cursor_fix=False),
    "no_refund": LoopRules(refund=False),
    "preemption_leaks_blocks": LoopRules(preempt_frees_blocks=False),
    "no_fcfs_break": LoopRules(fcfs_break=False),
    "admit_after_preemption": LoopRules(admit_after_preemption=True),
    "run_slot_check_off_by_one": LoopRules(run_slot_check_strict=False),
    "admission_over_budget": LoopRules(admission_budget_extra=1),
    "chunked_off_fit_strict": LoopRules(chunked_off_fit_strict=True),
    "watermark_on_first_admission": LoopRules(watermark_on_first_admission=True),
    "gate_without_watermark": LoopRules(gate_without_watermark=True),
    # prefix caching: refuted by kv_blocks_conserved (the pool goes negative), caught by
    # the prefix-caching agreement
    "evictable_hits_unchecked": LoopRules(evictable_hits_checked=False),
    "finish_leaks_blocks": LoopRules(finish_frees_blocks=False),
    # async scheduling
    "placeholders_not_in_need": LoopRules(placeholders_in_need=False),
    "no_last_token_guard": LoopRules(last_token_guard=False),
    "last_token_guard_stops_loop": LoopRules(last_token_guard_stops=True),
    "stale_head_stops_admission": LoopRules(stale_head="stop"),
    "stale_head_admitted": LoopRules(stale_head="admit"),
    "no_placeholder_added": LoopRules(placeholder_added="never"),
    "placeholder_on_prefill_chunk": LoopRules(placeholder_added="always"),
    "inflight_not_added": LoopRules(inflight_added=False),
    "stale_not_decremented": LoopRules(stale_decremented=False),
    # structured output
    "grammar_head_admitted": LoopRules(grammar_skip=False),
    # LoRA
    "lora_cap_off_by_one": LoopRules(lora_cap_extra=1),
    # speculative decoding
    "drafts_counted_twice": LoopRules(drafts_in_need=2),
    "victim_keeps_drafts": LoopRules(victim_drafts_dropped=False),
    "padded_decode_budget_unchecked": LoopRules(padded_budget_checked=False),
    "drafter_rows_not_charged": LoopRules(drafter_rows_charged=False),
    # caught by the update agreement only: the claims that use placeholders_after
    # are stated with speculative decoding off (SPEC_DECODE)
    "placeholders_ignore_drafts": LoopRules(placeholders_per_draft=False),
    # the padding's batch conditions: caught by the iteration agreements
    "prefill_scheduled_not_noted": LoopRules(prefill_scheduled_noted=False),
    "padding_beside_prefill": LoopRules(padding_checks_prefill=False),
    "padding_needs_running_grant": LoopRules(padding_after_hit=False),
    # prefill throttling: caught by the iteration agreements only (a held step
    # schedules less; no safety claim depends on it, and running_never_starved and
    # running_before_waiting name it as an exception)
    "held_prefill_chunk_granted": LoopRules(held_chunk_skipped=False),
    "held_step_admits_prefill": LoopRules(held_admission_stops=False),
    # pause: `paused_new_admits` is caught by the paused agreement; `paused_all_schedules`
    # (the step starts with its budget while PAUSED_ALL) breaks the running loop's entry,
    # refuted by running_never_starved
    "paused_all_schedules": LoopRules(paused_all_budget_zero=False),
    "paused_new_admits": LoopRules(paused_new_admits_none=False),
    # prefix caching: refuted by prefix_hit_within_shared_prefix, caught by the agreements
    "grant_caches_known_tokens": LoopRules(grant_caches_computed=False),
    "delivery_caches_sampled_tokens": LoopRules(delivery_caches_computed=False),
}


# --- records ----------------------------------------------------------------------------


def _fresh(cls, prefix: str):
    out = {}
    for f in fields(cls):
        kind = f.metadata.get("kind", "int")
        out[f.name] = z3.Bool(f"{prefix}.{f.name}") if kind == "bool" else z3.Int(f"{prefix}.{f.name}")
    return cls(**out)


def _B():
    return field(metadata={"kind": "bool"})


@dataclass(frozen=True)
class LoopConfig:
    """What the loops read of the config, for one block size.  `th` is the
    long-prefill threshold in force this step (0 with one eligible request,
    S:773-779); `hold` this step's `defer_prefills` (prefill throttling, either
    gate, spec/prefill_throttle.py; free, so every claim covers held steps and
    others); `pa` / `pn` the engine's pause_state PAUSED_ALL / PAUSED_NEW (free too);
    `wm` the watermark's blocks; `U` the usable blocks; `ML`
    max_loras, which binds when `lora` (a LoRA config) is on; `K`, `LA`, `D` and `PL`
    num_speculative_tokens, num_lookahead_tokens, max_num_new_slots_for_drafting and
    num_prefill_lookahead_tokens, all 0 unless `sd` (speculative decoding) is on.
    No rule here reads `PL`: it is in the constraints so that the drafters the
    claims cover (those that read at most one prompt token ahead, which changes no
    chunk, spec_decode.reserve_prefill_lookahead) are a stated part of the domain
    that tests/test_proofs_agreement_config.py compares with the spec's validation.
    `pc` (prefix caching) and `LH` (num_hash_lookahead_tokens) are read by the
    cached-block counts (cache_extent); the hits are inputs (WaitReq)."""

    TB0: Any  # max_num_scheduled_tokens (S:735)
    IB0: Any  # max_num_batched_tokens (S:738)
    M: Any  # max_num_active_reqs (S:1093-1096)
    L: Any  # max_model_len
    th: Any
    wm: Any
    U: Any
    ML: Any
    K: Any
    LA: Any
    D: Any  # a drafter's rows per scheduled request, charged to the input budget (S:737)
    PL: Any  # a drafter's prefill lookahead: 0 (n-gram) or 1 (EAGLE family); MTP's > 1 is outside
    LH: Any  # num_hash_lookahead_tokens: a block is hashed once this many tokens after it are known
    chunked: Any = _B()
    full_isl: Any = _B()
    prio: Any = _B()
    asy: Any = _B()  # async scheduling (the AsyncScheduler): placeholders, in-flight and stale tokens
    lora: Any = _B()  # a LoRA config: max_loras set (spec/config.py)
    sd: Any = _B()  # speculative decoding: num_speculative_tokens >= 1 (spec/spec_decode.py)
    hold: Any = _B()  # the step holds prefill (ScheduleWork.defer_prefills, S:766-768, 796-807)
    pa: Any = _B()  # pause_state PAUSED_ALL: the step starts with no token budget
    pn: Any = _B()  # pause_state PAUSED_NEW: admission only of requests holding KV blocks
    pc: Any = _B()  # enable_prefix_caching: full blocks are hashed and cached (spec/block_pool.py)
    bs: int = 1

    @staticmethod
    def fresh(prefix: str, bs: int) -> "LoopConfig":
        return replace(_fresh_config(prefix), bs=bs)

    def cdiv(self, x):
        return cdiv_const(x, self.bs)

    def constraints(self):
        # vLLM's acceptance conditions that the loops rely on (spec/config.py validate_config).
        # The threshold check exists from 0.28.0 (proofs/release.py).
        th_check = release.checks_config("long_prefill_token_threshold_at_most_max_model_len")
        # max_loras >= 1 (spec/config.py FIELD_MINIMA); LoRA is modelled for 0.33.0 only.
        lora = z3.Implies(self.lora, self.ML >= 1) if release.models_lora() else z3.Not(self.lora)
        # Speculative decoding (0.33.0 only, spec/config.py validate_spec_decode and
        # validate_drafter): a lookahead and a prefill lookahead only beside drafts, at
        # most one drafter row per draft.
        # From 0.34.0 at most one row (no parallel drafting: versions.CHECKS_SINCE).
        off = z3.And(self.K == 0, self.LA == 0, self.D == 0, self.PL == 0)
        # One row is a draft model's: no prefill lookahead, a batch above its K lookahead.
        rows = z3.And(self.D <= 1, z3.Implies(self.D == 1, z3.And(self.PL == 0, self.IB0 > self.K))) \
            if release.checks_config("drafter_rows_at_most_one") else z3.BoolVal(True)
        sd = z3.If(self.sd, z3.And(self.K >= 1, self.LA >= 0, 0 <= self.D, self.D <= self.K, rows,
                                   0 <= self.PL, self.PL <= 1), off) \
            if release.models_spec_decode() \
            else z3.And(z3.Not(self.sd), off)
        # wm <= U: a watermark below 1 (spec/config.py) leaves int(watermark * num_gpu_blocks)
        # at most num_gpu_blocks - 1 blocks.
        # A step holds prefill only where schedspec models prefill throttling (from 0.33.0).
        hold = z3.BoolVal(True) if release.models_prefill_throttle() else z3.Not(self.hold)
        # Block hashes that cover tokens past the block: only with prefix caching, and
        # modelled from 0.33.0 on (spec/config.py validate_spec_decode).
        hashes = z3.And(self.LH >= 0, z3.Implies(self.LH > 0, z3.And(
            self.pc, z3.BoolVal(release.models_hash_lookahead()))))
        return z3.And(lora, sd, hold, hashes, z3.Not(z3.And(self.pa, self.pn)),
                      self.TB0 >= 1, self.IB0 >= 1, self.M >= 1, self.L >= 2, self.th >= 0,
                      self.th <= self.L if th_check else True, self.wm >= 0, self.wm <= self.U,
                      self.U >= self.cdiv(self.L), self.IB0 >= self.M,
                      z3.Or(self.chunked, self.IB0 >= self.L))

    @property
    def B(self):
        """Tokens one step may grant in all (spec/properties.py get_step_budget)."""
        return z3_min(self.TB0, self.IB) if release.applies(INPUT_BUDGET) else self.TB0

    @property
    def IB(self):
        """The input budget a step starts with: max_num_batched_tokens, or before 0.28.0
        (versions.INPUT_BUDGET) one that starts equal to the token budget and moves
        with it, so it caps nothing more."""
        return self.IB0 if release.applies(INPUT_BUDGET) else self.TBs

    @property
    def TBs(self):
        """The token budget the step starts with: max_num_scheduled_tokens, or 0 while
        the engine is PAUSED_ALL (S:735, 739-741)."""
        return z3.If(self.pa, 0, self.TB0)


def threshold_in_force(T, adaptive, IB0, NE, chunked):
    """config.long_prefill_threshold (S:770-788) as a term: the configured threshold
    `T`, none (0) with chunked prefill off (from 0.34.0) or while at most one request is
    eligible (from 0.31.0), and with the adaptive flag at least max_num_batched_tokens //
    eligible.  Compared with the spec's on concrete configs by
    tests/test_proofs_agreement_config.py."""
    adapted = z3.If(z3.And(T > 0, adaptive), z3.If(T >= IB0 / NE, T, IB0 / NE), T)
    if release.applies(LONG_PREFILL_THRESHOLD_NEEDS_TWO):
        adapted = z3.If(NE <= 1, 0, adapted)
    if release.applies(LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL):
        adapted = z3.If(chunked, adapted, 0)
    return adapted


def threshold_constraints(c: LoopConfig, T, adaptive):
    """What validate_config allows of a configured threshold and its adaptive flag."""
    th_check = release.checks_config("long_prefill_token_threshold_at_most_max_model_len")
    flag = z3.BoolVal(True) if release.models_adaptive_threshold() else z3.Not(adaptive)
    return z3.And(T >= 0, T <= c.L if th_check else True, flag)


def _fresh_config(prefix: str) -> LoopConfig:
    I, Bo = z3.Int, z3.Bool
    return LoopConfig(I(f"{prefix}.TB0"), I(f"{prefix}.IB0"), I(f"{prefix}.M"), I(f"{prefix}.L"),
                      I(f"{prefix}.th"), I(f"{prefix}.wm"), I(f"{prefix}.U"), I(f"{prefix}.ML"),
                      I(f"{prefix}.K"), I(f"{prefix}.LA"), I(f"{prefix}.D"), I(f"{prefix}.PL"), I(f"{prefix}.LH"),
                      Bo(f"{prefix}.chunked"), Bo(f"{prefix}.full_isl"), Bo(f"{prefix}.prio"), Bo(f"{prefix}.asy"),
                      Bo(f"{prefix}.lora"), Bo(f"{prefix}.sd"), Bo(f"{prefix}.hold"), Bo(f"{prefix}.pa"),
                      Bo(f"{prefix}.pn"), Bo(f"{prefix}.pc"))


def config_values(config: SchedulerConfig, threshold: int, hold: bool = False,
                  pause_state: str = "UNPAUSED") -> dict[str, int | bool]:
    """The values of LoopConfig's symbols (but `bs`) for `config`, with `threshold`
    the long-prefill threshold in force in the step (spec/properties.py
    get_long_prefill_threshold; the configured one where no step is meant) and
    `hold` whether the step holds prefill (spec/prefill_throttle.py holds_prefill), in
    an engine whose `pause_state` is this."""
    c = config
    return dict(TB0=c.token_budget, IB0=c.max_num_batched_tokens, M=c.max_num_active_reqs, L=c.max_model_len,
                th=threshold, wm=c.watermark_blocks, U=c.num_gpu_blocks - 1,
                chunked=c.enable_chunked_prefill, full_isl=c.scheduler_reserve_full_isl,
                prio=c.policy == PRIORITY, asy=c.async_scheduling,
                lora=c.max_loras is not None, ML=c.max_loras or 0,
                sd=c.num_speculative_tokens > 0, K=c.num_speculative_tokens, LA=c.num_lookahead_tokens,
                D=c.max_num_new_slots_for_drafting, PL=c.num_prefill_lookahead_tokens, hold=hold,
                pa=pause_state == "PAUSED_ALL", pn=pause_state == "PAUSED_NEW",
                pc=c.enable_prefix_caching, LH=c.num_hash_lookahead_tokens)


def cache_extent(c: LoopConfig, done, nt):
    """How many of a request's blocks are cached once `done` of its num_tokens `nt`
    are computed: cache_blocks hashes its full blocks up to min(done, nt) (K:642-646)
    that have a hash, and a block has one once LH tokens after it are known
    (E:242-252, P:203-273); none without prefix caching.  A multi-module drafter's
    re-prefilled tail (spec_decode.cacheable_tokens) is 0 here: PL <= 1."""
    return z3.If(c.pc, z3_max0(z3_min(done, nt - c.LH)) / c.bs, 0)


def cached_after(c: LoopConfig, cb, done, nt):
    """num_cached_block after cache_blocks(done): it only grows (T:482-546)."""
    ext = cache_extent(c, done, nt)
    return z3.If(ext > cb, ext, cb)


@dataclass(frozen=True)
class RunReq:
    """A request of `before.running`: what the step read of it (nc, nt, b0 = its
    computed tokens, num_tokens and blocks before the step; pos0 its position;
    rank its victim rank; d its drafts), and where the running loop has got it
    (in: still in running; pos; g: granted; n: the grant; b: blocks held; seq:
    its preemption index, -1 if none; ds: drafts sent to the model, 0 for none;
    pf: is_prefill_chunk before the step, which a step holding prefill skips;
    free, as the last update left it)."""

    nc: Any
    nt: Any
    b0: Any
    pos0: Any
    rank: Any
    pos: Any
    n: Any
    b: Any
    seq: Any
    ph: Any  # num_output_placeholders before the step (async; 0 in the synchronous engine)
    lim: Any  # num_prompt_tokens + max_tokens: the length at which max_tokens stops it
    d: Any  # len(spec_token_ids): its drafts (speculative decoding; 0 without)
    ds: Any  # len(scheduled_spec_decode_tokens[it]) so far this step (0: no entry)
    cb: Any  # num_cached_block: its blocks that are cached (prefix caching; 0 without)
    inr: Any = _B()
    g: Any = _B()
    pf: Any = _B()

    def held(self, c: LoopConfig):
        """S:838: a step that holds prefill skips this request (0 tokens)."""
        return z3.And(c.hold, self.pf)

    def thcap(self, c: LoopConfig, n):
        return z3.If(z3.And(0 < c.th, c.th < n), c.th, n)

    def lif(self):
        """spec/request.py last_token_in_flight (S:816-830): the last token max_tokens
        allows is already in a batch in flight."""
        return z3.And(self.ph > 0, self.nc + 2 - self.ph >= self.lim)

    def need(self):
        """get_need (spec/properties.py): drafts and placeholders count as tokens to
        compute (S:855); 0 under the async max_tokens guard."""
        return z3.If(self.lif(), 0, self.nt + self.d + self.ph - self.nc)

    def cap(self, c: LoopConfig):
        """get_capped_need (spec/properties.py): the need after the threshold and
        model-length caps (S:855-872), no budget cap."""
        return z3_max0(z3_min(self.thcap(c, self.need()), c.L - self.nc - 1))

    def dem(self, c: LoopConfig):
        """get_block_demand(before, rid, capped need): new blocks for the whole capped
        need and the drafter's lookahead (K:571-574)."""
        return z3_max0(c.cdiv(z3_min(self.nc + self.cap(c) + c.LA, c.L)) - self.b0)

    def b_after(self, c: LoopConfig, n):
        """Blocks held after a grant of n: those of computed + n tokens; with
        speculative decoding those of the lookahead too, and never fewer than it
        held (the slots of rejected drafts stay, S:2417-2426)."""
        return z3.If(c.sd, z3.If(self.b0 > c.cdiv(z3_min(self.nc + n + c.LA, c.L)), self.b0,
                                 c.cdiv(z3_min(self.nc + n + c.LA, c.L))),
                     c.cdiv(z3_min(self.nc + n, c.L)))

    def drafts_sent(self, n):
        """spec_decode.schedule_drafts (S:1025-1041): the drafts past the tokens it
        has that fit in grant n."""
        return z3.If(self.d > 0, z3_max0(n + self.nc - self.nt - self.ph), 0)

    def static_facts(self, c: LoopConfig, R0):
        """The state invariant's facts about a running request (spec/invariants.py:
        computed_tokens_below_num_tokens, request_lengths_valid, blocks_match_computed_tokens)."""
        fcfs_rank = self.rank == R0 - 1 - self.pos0
        # Async: computed < num_tokens + placeholders (the state invariant
        # computed_tokens_below_num_tokens), and computed < max_model_len, which every
        # grant keeps (cap 3, S:868) and loop:computed_tokens_bounded proves kept; the
        # synchronous engine has no placeholders.
        counts = z3.If(c.asy, z3.And(self.ph >= 0, self.nc < self.nt + self.ph, self.nc < c.L),
                       z3.And(self.ph == 0, self.nc < self.nt))
        # blocks_match_computed_tokens: with speculative decoding up to the slots of
        # num_speculative_tokens drafts and the lookahead (properties.get_block_span).
        blocks = z3.If(c.sd, z3.And(self.d >= 0, c.cdiv(self.nc) <= self.b0,
                                    self.b0 <= c.cdiv(z3_min(self.nc + c.K + c.LA, c.L))),
                       z3.And(self.d == 0, self.b0 == c.cdiv(self.nc)))
        # Its cached blocks (now: cb, like b, changes within the step) are blocks it
        # holds, of tokens it knows (what loop:prefix_hit_within_shared_prefix proves
        # grants and deliveries keep).
        cached = z3.And(0 <= self.cb, self.cb <= self.b, self.cb * c.bs <= self.nt,
                        z3.Implies(z3.Not(c.pc), self.cb == 0))
        return z3.And(0 <= self.nc, counts, 1 <= self.nt, self.nt < c.L, self.nt < self.lim, blocks, cached,
                      0 <= self.pos0, self.pos0 < R0, 0 <= self.rank, self.rank < R0,
                      z3.Or(c.prio, fcfs_rank))


@dataclass(frozen=True)
class RunState:
    """The running loop's iteration state (module docstring)."""

    tb: Any
    ib: Any
    T: Any
    P: Any
    Rn: Any
    cur: Any
    F: Any
    H: Any
    AL: Any
    DV: Any
    Drest: Any
    CG: Any
    UA: Any
    PA: Any
    pend: Any  # the grant being allocated for the request at the cursor after a failure, else -1
    Dc: Any  # the drafter's rows charged to the input budget: D per grant
    stopped: Any = _B()
    # prefill_scheduled: a grant went to a prefill chunk (S:1016; a refund keeps it), which
    # rules out padding a new decode (spec_decode.pads_new_decode)
    PS: Any = _B()


@dataclass(frozen=True)
class RunConsts:
    """The values of the step's start the invariant refers to: R0 = len(running),
    F0 / H0 free and held blocks, D0 the running requests' whole block demand
    (the premise of preemption_only_on_allocation_failure), CAx the capped needs
    of the requests ahead of the ghost x."""

    R0: Any
    F0: Any
    H0: Any
    D0: Any
    CAx: Any


@dataclass(frozen=True)
class RunSplit:
    """Fresh non-negative rests of the sums an iteration takes one share out of."""

    T_oth: Any  # T of the granted requests other than the victim
    T_slack: Any  # (CG - T) of the granted requests other than the victim
    H_oth: Any  # blocks in use but the victim's freed ones
    D_oth: Any
    UA_oth: Any
    Dc_oth: Any  # Dc of the granted requests other than the victim
    # the victim's blocks nobody else holds, which its preemption frees: all of them
    # without prefix caching; with it, a block shared through a hit stays (T:298-310)
    Fv: Any


def _same(a: RunReq, b: RunReq):
    return z3.And(a.inr, b.inr, a.pos == b.pos)


def _equal(a: RunReq, b: RunReq):
    return z3.And([getattr(a, f.name) == getattr(b, f.name) for f in fields(RunReq)])


def moves_on(c: LoopConfig):
    """Does the running loop go on after a self-preemption?  Under PRIORITY from
    0.33.0 (S:998-1008, versions.PRIORITY_SELF_PREEMPTION_CONTINUES); never before."""
    return c.prio if release.applies(PRIORITY_SELF_PREEMPTION_CONTINUES) else z3.BoolVal(False)


def run_guard(s: RunState):
    """S:811-813: a request left under the cursor, budget left; and no FCFS break."""
    return z3.And(z3.Not(s.stopped), s.cur < s.Rn, s.tb > 0, s.ib > 0)


def run_J(c: LoopConfig, k: RunConsts, s: RunState, r: RunReq):
    """The per-request invariant of the running loop, for a request of before.running."""
    cap = r.cap(c)
    return z3.And(
        z3.Implies(r.inr, z3.And(0 <= r.pos, r.pos < s.Rn, r.rank >= s.P, r.seq == -1,
                                 z3.Or(c.prio, r.pos == r.pos0))),  # FCFS removes only the tail
        z3.Implies(z3.Not(r.inr), z3.And(r.rank < s.P, r.seq == r.rank, z3.Not(r.g), r.b == 0, r.n == 0)),
        z3.Implies(r.g, z3.And(r.inr, r.pos < s.cur, 1 <= r.n, r.n <= cap, r.b == r.b_after(c, r.n))),
        z3.Implies(z3.And(r.inr, z3.Not(r.g)), z3.And(r.b == r.b0, r.n == 0)),
        # visited and not granted: skipped, its capped need was 0 (S:907-925) or the
        # step holds prefill and it is a prefill chunk (S:838)
        z3.Implies(z3.And(r.inr, r.pos < s.cur, z3.Not(r.g)), z3.Or(cap == 0, r.held(c))),
        # a grant short of the capped need used the last of a budget (no refund since: P == 0)
        # (with a drafter's rows ib is then -D, S:1019)
        z3.Implies(z3.And(r.g, r.n < cap), z3.Or(s.P > 0, s.tb <= 0, s.ib <= 0)),
        # the grant pending for the request at the cursor is within its capped need
        z3.Implies(z3.And(s.pend >= 1, r.inr, r.pos == s.cur), s.pend <= cap),
    )


def run_I(c: LoopConfig, k: RunConsts, s: RunState, x: RunReq):
    """The global invariant of the running loop, with the ghost-relative sums of x."""
    return z3.And(
        s.tb == c.TBs - s.T, s.ib == c.IB - c.D - s.T - s.Dc, s.tb >= 0, s.ib >= -c.D, s.T >= 0, s.Dc >= 0,
        z3.Implies(c.D == 0, s.Dc == 0),
        s.P >= 0, s.Rn == k.R0 - s.P, 0 <= s.cur, s.cur <= s.Rn,
        s.F + s.H == k.F0 + k.H0, s.F >= 0, s.H >= 0,
        z3.Implies(s.P == 0, z3.And(s.F == k.F0 - s.AL, s.AL <= s.DV, s.DV + s.Drest == k.D0, s.Drest >= 0)),
        z3.Implies(s.P > 0, k.D0 > k.F0),
        # Stopped after a self-preemption: under FCFS the victim was the tail, so no
        # request is left behind the cursor; under PRIORITY (before 0.33.0) there may be.
        z3.Implies(s.stopped, z3.And(s.P > 0, z3.Not(moves_on(c)), z3.Or(c.prio, s.cur >= s.Rn))),
        s.T <= s.CG,
        z3.Or(s.pend == -1, z3.And(s.pend >= 1, s.P >= 1, s.cur < s.Rn, s.pend <= s.tb, s.pend <= s.ib)),
        z3.Implies(z3.And(x.inr, x.pos >= s.cur),
                   z3.And(s.CG + s.UA + s.PA == k.CAx, s.UA >= 0, s.PA >= 0)),
        # x's grant (or the grant pending for it) is at least what the budget left
        # after the capped needs ahead of it: min(cap, budget - CAx); stated without a
        # drafter's rows (the claims that use it have speculative decoding off)
        z3.Implies(z3.And(c.D == 0, x.g), x.n >= z3_min(x.cap(c), c.TBs - k.CAx, c.IB - k.CAx)),
        z3.Implies(z3.And(c.D == 0, s.pend >= 1, x.inr, x.pos == s.cur),
                   s.pend >= z3_min(x.cap(c), c.TBs - k.CAx, c.IB - k.CAx)),
    )


def run_entry(c: LoopConfig, k: RunConsts, x: RunReq, rules: LoopRules = LoopRules()):
    """(premises, the state and ghost at S:809) from a before-state satisfying the state invariant."""
    tb0 = c.TBs if rules.paused_all_budget_zero else c.TB0
    s = RunState(tb0, c.IB - c.D, z3.IntVal(0), z3.IntVal(0), k.R0, z3.IntVal(0), k.F0, k.H0, z3.IntVal(0),
                 z3.IntVal(0), k.D0, z3.IntVal(0), k.CAx, z3.IntVal(0), z3.IntVal(-1), z3.IntVal(0),
                 z3.BoolVal(False), z3.BoolVal(False))
    x0 = replace(x, inr=z3.BoolVal(True), pos=x.pos0, g=z3.BoolVal(False), n=z3.IntVal(0), b=x.b0,
                 seq=z3.IntVal(-1), ds=z3.IntVal(0))
    premises = [c.constraints(), x.static_facts(c, k.R0), k.R0 >= 1, k.R0 <= c.M, k.F0 >= 0, k.H0 >= 0,
                k.F0 + k.H0 == c.U, k.D0 >= 0, k.CAx >= 0]
    return premises, s, x0


def run_iteration(c: LoopConfig, k: RunConsts, s: RunState, x: RunReq, cr: RunReq, v: RunReq, sp: RunSplit,
                  rules: LoopRules = LoopRules()):
    """One round of the running loop from `s`: the request at the cursor `cr` is
    skipped, granted, or its allocation fails and victim `v` is preempted
    (S:855-1008).  Returns (frame assumptions, new state, new ghost x, facts about
    the round for the claims)."""
    # choose_victim (S:948-986): the live request of least rank, which run_J makes rank P.
    victim = z3.If(c.prio, v.rank == s.P, v.pos == 0) if rules.fcfs_victim_head else (v.rank == s.P)
    frame = [cr.inr, cr.pos == s.cur, v.inr, victim,
             cr.static_facts(c, k.R0), v.static_facts(c, k.R0),
             run_J(c, k, s, cr), run_J(c, k, s, v)]
    for a, b in ((x, cr), (x, v), (cr, v)):
        frame.append(z3.Implies(_same(a, b), _equal(a, b)))
        # one request per rank and per position (rank is a bijection onto [0, R0))
        frame.append(z3.Implies(z3.And(a.inr, b.inr, a.rank == b.rank), _same(a, b)))
        frame.append(z3.Implies(z3.And(a.inr, b.inr, a.pos0 == b.pos0), _same(a, b)))
    frame += [sp.T_oth >= 0, sp.T_slack >= 0, sp.H_oth >= 0, sp.D_oth >= 0, sp.UA_oth >= 0, sp.Dc_oth >= 0,
              z3.Implies(v.g, z3.And(s.T == v.n + sp.T_oth, s.CG - s.T == (v.cap(c) - v.n) + sp.T_slack,
                                     s.Dc == c.D + sp.Dc_oth)),
              0 <= sp.Fv, sp.Fv <= v.b, s.H == sp.Fv + sp.H_oth,
              # Drest means something only before the first preemption (run_I)
              z3.Implies(s.P == 0, s.Drest == cr.dem(c) + sp.D_oth)]
    x_unvisited = z3.And(x.inr, x.pos >= s.cur)
    ahead_c = z3.And(x_unvisited, z3.Not(_same(x, cr)))  # cr is at the cursor, x behind it
    ahead_v = z3.And(x_unvisited, z3.Not(_same(x, v)), v.pos < x.pos)

    guard = run_guard(s)
    # num_new_tokens_running (S:855-872): the need, threshold, both budgets, model length.
    # Async: placeholders count as tokens to compute (S:855); a request whose last
    # allowed token is in flight gets 0 before any cap (S:816-830), so it is skipped.
    ph = cr.ph if rules.placeholders_in_need else z3.IntVal(0)
    need_tokens = cr.nt + rules.drafts_in_need * cr.d + ph - cr.nc + rules.running_need_extra
    budgets = [s.tb] if rules.grant_ignores_input_budget else [s.tb, s.ib]
    n = z3_min(cr.thcap(c, need_tokens), *budgets, c.L - cr.nc - rules.model_len_margin)
    if rules.running_cap is not None:
        n = z3_min(n, z3.IntVal(rules.running_cap))
    lif = cr.lif() if rules.last_token_guard else z3.BoolVal(False)
    guarded = z3.Or(lif, cr.held(c)) if rules.held_chunk_skipped else lif
    n = z3.If(guarded, 0, n)
    # allocate_or_preempt retries with the same n after preempting another request
    # (S:928-996): n is computed once per request, not once per round.
    if rules.n_once_per_request:
        n = z3.If(s.pend >= 1, s.pend, n)
    skip = (n == 0) if rules.skip_zero_grant else z3.BoolVal(False)
    # allocate_slots for a running request (K:571-609): no watermark, no gate; the
    # drafter's lookahead slots too (K:571-574).
    need = z3_max0(c.cdiv(z3_min(z3_min(cr.nc, c.L) + n + c.LA, c.L)) - cr.b)
    fits = (need < s.F) if rules.fail_when_exact_fit else (need <= s.F)
    # the bad variant: the guard ends the loop (a `break`) instead of skipping the request
    guard_stop = z3.And(guard, lif, s.pend < 1) if rules.last_token_guard_stops else z3.BoolVal(False)
    skipping = z3.And(guard, skip, z3.Not(guard_stop))
    success = z3.And(guard, z3.Not(skip), fits)
    fail = z3.And(guard, z3.Not(skip), z3.Not(fits))
    self_pre = z3.And(fail, _same(cr, v))
    # UA (ahead of x, alive, ungranted) gives up the share the round moves out of it.
    frame += [z3.Implies(z3.And(success, ahead_c), s.UA == cr.cap(c) + sp.UA_oth),
              z3.Implies(z3.And(fail, ahead_v, z3.Not(v.g)), s.UA == v.cap(c) + sp.UA_oth)]
    refund = z3.And(fail, v.g) if rules.refund else z3.BoolVal(False)

    tb = s.tb - z3.If(success, n, 0) + z3.If(refund, v.n, 0)
    # a grant takes its drafter's rows from the input budget too, a refund gives them back (S:971, 1019)
    rows = c.D if rules.drafter_rows_charged else z3.IntVal(0)
    ib = s.ib - z3.If(success, n + rows, 0) + z3.If(refund, v.n + rows, 0)
    T = s.T + z3.If(success, n, 0) - z3.If(z3.And(fail, v.g), v.n, 0)
    Dc = s.Dc + z3.If(success, c.D, 0) - z3.If(z3.And(fail, v.g), c.D, 0)
    freed = sp.Fv if rules.preempt_frees_blocks else z3.IntVal(0)
    F = s.F - z3.If(success, need, 0) + z3.If(fail, freed, 0)
    H = s.H + z3.If(success, need, 0) - z3.If(fail, sp.Fv, 0)
    P = s.P + z3.If(fail, 1, 0)
    Rn = s.Rn - z3.If(fail, 1, 0)
    back = z3.And(fail, v.pos < s.cur) if rules.cursor_fix else z3.BoolVal(False)
    cur = s.cur + z3.If(z3.Or(skipping, success), 1, 0) - z3.If(back, 1, 0)
    stop_now = z3.And(self_pre, z3.Not(moves_on(c))) if rules.fcfs_break else z3.BoolVal(False)
    stopped = z3.Or(s.stopped, stop_now, guard_stop)
    AL = s.AL + z3.If(success, need, 0)
    moved_on = z3.Or(skipping, success)
    DV = s.DV + z3.If(moved_on, cr.dem(c), 0)
    Drest = s.Drest - z3.If(moved_on, cr.dem(c), 0)
    CG = s.CG + z3.If(success, cr.cap(c), 0) - z3.If(z3.And(fail, v.g), v.cap(c), 0)
    UA = s.UA - z3.If(z3.And(success, ahead_c), cr.cap(c), 0) - z3.If(z3.And(fail, ahead_v, z3.Not(v.g)), v.cap(c), 0)
    PA = s.PA + z3.If(z3.And(fail, ahead_v), v.cap(c), 0)
    pend = z3.If(guard, z3.If(z3.And(fail, z3.Not(self_pre)), n, -1), s.pend)
    noted = z3.And(success, cr.pf) if rules.prefill_scheduled_noted else z3.BoolVal(False)
    s2 = RunState(tb, ib, T, P, Rn, cur, F, H, AL, DV, Drest, CG, UA, PA, pend, Dc, stopped, z3.Or(s.PS, noted))

    # the ghost after the round
    x_is_c, x_is_v = _same(x, cr), _same(x, v)
    done = x.nc + n if rules.grant_caches_computed else x.nt  # the tokens its caching reaches
    shift = z3.And(fail, x.inr, z3.Not(x_is_v), v.pos < x.pos)
    gone = z3.And(fail, x_is_v)
    x_grant = z3.And(success, x_is_c)
    x2 = replace(x, inr=z3.And(x.inr, z3.Not(gone)),
                 pos=x.pos - z3.If(shift, 1, 0),
                 g=z3.Or(x_grant, z3.And(x.g, z3.Not(gone))),
                 n=z3.If(gone, 0, z3.If(x_grant, n, x.n)),
                 b=z3.If(gone, 0, z3.If(x_grant, x.b + need, x.b)),
                 seq=z3.If(gone, s.P, x.seq),
                 ds=z3.If(gone, 0 if rules.victim_drafts_dropped else x.ds,
                          z3.If(x_grant, x.drafts_sent(n), x.ds)),
                 # a grant caches the full blocks it computes (K:642-646); a preemption frees
                 # them all and forgets the count (T:596-604)
                 cb=z3.If(gone, 0, z3.If(x_grant, cached_after(c, x.cb, done, x.nt), x.cb)))
    facts = {"guard": guard, "n": n, "need": need, "skip": skipping, "success": success, "fail": fail,
             "self_preempt": self_pre, "cr_granted_before": cr.g, "guarded": lif,
             "held": z3.And(skipping, cr.held(c), z3.Not(lif))}
    return frame, s2, x2, facts


# --- the waiting loop ---------------------------------------------------------------------


@dataclass(frozen=True)
class WaitReq:
    """A request of `before.waiting`: nt its num_tokens (it has no computed tokens
    and no blocks: spec/invariants.py waiting_requests_hold_nothing), q its queue
    position; adm: admitted this step, n its grant, b its blocks.  With prefix
    caching its admission starts from a hit: hb cached blocks (whole blocks, capped
    at nt - 1 tokens, K:251-292), he of them held by nobody (in the free queue); 0
    without.  Like ln and pd, they are inputs of the iteration that visits it (an
    earlier admission of the step can cache blocks it then hits)."""

    nt: Any
    q: Any
    n: Any
    b: Any
    hb: Any
    he: Any
    cb: Any  # num_cached_block: 0 before admission, its hit blocks and those its grant computes after
    adm: Any = _B()
    st: Any = _B()  # async: num_stale_output_tokens > 0 (its output from before a preemption in flight)
    gw: Any = _B()  # waits for its grammar: WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, compiling or failed
    ls: Any = _B()  # LoRA: skipped this step, its adapter one too many (S:1128-1140)
    ln: Any = _B()  # LoRA: its adapter is not in the batch yet (an input of the iteration that visits it)
    # Speculative decoding: admitted now it would be a new decode padded with drafts
    # (spec_decode.pads_new_decode): for the head, wait_iteration's frame defines it;
    # for the ghost it is read by the iteration that visits it.
    pd: Any = _B()

    def static_facts(self, c: LoopConfig, W0):
        # No grammar where schedspec does not model structured output (release.py).
        grammar = z3.BoolVal(True) if release.models_structured_output() else z3.Not(self.gw)
        # pads_new_decode's conditions on the request and config (S:1358-1380): one
        # token left to compute after its hit, and the padded rows and a sampled token
        # within max_model_len; the batch's (no prefill chunk scheduled, some running
        # request granted or a hit) are in wait_iteration's frame.
        padded = z3.Implies(self.pd, z3.And(c.sd, self.nt - self.hit(c) == 1, self.hit(c) + c.K + 2 <= c.L))
        hits = z3.And(0 <= self.he, self.he <= self.hb, self.hit(c) < self.nt)
        return z3.And(1 <= self.nt, self.nt < c.L, 0 <= self.q, self.q < W0, z3.Implies(z3.Not(c.asy), z3.Not(self.st)),
                      z3.Implies(z3.Not(c.lora), z3.Not(self.ln)), grammar, padded, hits)

    def hit(self, c: LoopConfig):
        """The tokens its prefix hit computes: num_computed_tokens at admission (S:1149-1166)."""
        return self.hb * c.bs

    def computed(self, c: LoopConfig):
        """num_computed_tokens after the step: the hit and the grant if admitted (S:1899-1931)."""
        return z3.If(self.adm, self.hit(c) + self.n, 0)

    def n_max(self, c: LoopConfig):
        """The most an admission grants: the tokens left after the hit, or 1 + K for a padded new decode."""
        return self.nt - self.hit(c) + z3.If(self.pd, c.K, 0)


@dataclass(frozen=True)
class WaitState:
    """tbE / ibE: the budgets at the loop's entry; Tr: tokens the running loop
    granted; A: admissions so far; K (async): requests skipped for stale output
    in flight (S:1123), for a grammar still compiling (S:1118-1121) or for
    LoRA (S:1128-1140), so the head is before.waiting[A + K]; Lc: the distinct
    adapters of the running requests (S:1054-1063), one more per admission
    that brings a new one (S:1627-1629)."""

    tb: Any
    ib: Any
    T: Any
    Tr: Any
    tbE: Any
    ibE: Any
    Rn: Any
    A: Any
    K: Any
    F: Any
    H: Any
    Lc: Any
    Dc: Any  # the drafter's rows charged to the input budget so far, both loops (RunState.Dc)
    stopped: Any = _B()
    PS: Any = _B()  # the running loop's prefill_scheduled (RunState.PS); admissions leave it


def wait_guard(c: LoopConfig, s: WaitState, W0, rules: LoopRules = LoopRules()):
    """S:1066-1096: budget, a request waiting, a run slot; no earlier stop."""
    slot = (s.Rn < c.M) if rules.run_slot_check_strict else (s.Rn <= c.M)
    # PAUSED_NEW admits only a head holding KV blocks (S:1100-1107): none without the KV connector
    paused = c.pn if rules.paused_new_admits_none else z3.BoolVal(False)
    return z3.And(z3.Not(s.stopped), s.A + s.K < W0, s.tb > 0, s.ib > 0, slot, z3.Not(paused))


def wait_J(c: LoopConfig, s: WaitState, r: WaitReq):
    return z3.And(
        # visited (before the head) and not skipped for stale output, its grammar or LoRA: admitted
        r.adm == z3.And(r.q < s.A + s.K, z3.Not(r.st), z3.Not(r.gw), z3.Not(r.ls)),
        z3.Implies(r.ls, r.q < s.A + s.K),
        z3.Implies(r.adm, z3.And(1 <= r.n, r.n <= r.n_max(c), r.b == c.cdiv(z3_min(r.hit(c) + r.n + c.LA, c.L)))),
        z3.Implies(z3.Not(r.adm), z3.And(r.n == 0, r.b == 0, r.cb == 0)),
    )


def wait_I(c: LoopConfig, s: WaitState, W0):
    return z3.And(
        s.tb == c.TBs - s.T, s.ib == c.IB - c.D - s.T - s.Dc, s.tb >= 0, s.ib >= -c.D, s.Dc >= 0,
        z3.Implies(c.D == 0, s.Dc == 0), s.T >= s.Tr, s.Tr >= 0,
        s.tb <= s.tbE, s.ib <= s.ibE, z3.Implies(s.A > 0, z3.And(s.tbE > 0, s.ibE > 0)),
        s.Rn >= 0, s.Rn <= c.M, s.F + s.H == c.U, s.F >= 0, s.H >= 0, 0 <= s.A, 0 <= s.K, s.A + s.K <= W0,
        s.Lc >= 0, z3.Implies(c.lora, s.Lc <= c.ML),
    )


def wait_iteration(c: LoopConfig, s: WaitState, W0, x: WaitReq, h: WaitReq, rules: LoopRules = LoopRules()):
    """One admission attempt of the head `h` (S:1345-1523): admitted with its
    chunk, or admission stops (a `break`: the chunked-off rule, the full-ISL gate,
    the pool with the watermark).  Returns (frame, state, ghost, facts)."""
    # The admission starts from the head's prefix hit, c0 computed tokens (S:1149-1166; 0
    # without prefix caching).  pads_new_decode (S:1358-1380): one token left after it, no
    # prefill chunk granted by the running loop, some running request granted (Tr > 0:
    # scheduled_running, which admissions do not join) or a hit, the padded rows within
    # max_model_len.
    c0 = h.hit(c)
    pads = z3.And(c.sd, h.nt - c0 == 1, z3.Not(s.PS) if rules.padding_checks_prefill else True,
                  z3.Or(s.Tr > 0, c0 > 0) if rules.padding_after_hit else s.Tr > 0, c0 + c.K + 2 <= c.L)
    frame = [h.q == s.A + s.K, h.static_facts(c, W0), wait_J(c, s, h), h.pd == pads,
             z3.Implies(x.q == h.q, z3.And(x.nt == h.nt, x.adm == h.adm, x.n == h.n, x.b == h.b, x.st == h.st,
                                           x.gw == h.gw, x.ls == h.ls, x.pd == h.pd, x.hb == h.hb, x.he == h.he,
                                           x.cb == h.cb))]
    guard = wait_guard(c, s, W0, rules)
    # Async (S:1123): a head whose output from before its preemption is still in
    # flight is skipped and keeps its place; it takes no budget and no run slot.
    stale = h.st if rules.stale_head != "admit" else z3.BoolVal(False)
    # Structured output (S:1118-1121): a head whose grammar is compiling, or failed,
    # is skipped the same way (a compiled one was promoted to WAITING: gw false).
    grammar = h.gw if rules.grammar_skip else z3.BoolVal(False)
    skip_grammar = z3.And(guard, grammar)
    # LoRA (S:1128-1140): a head whose adapter is new to a batch that has max_loras
    # adapters already is skipped the same way.
    lora = z3.And(c.lora, h.ln, s.Lc == c.ML + rules.lora_cap_extra)
    skip_lora = z3.And(guard, lora)
    blocked = z3.Or(stale, grammar, lora)
    skip = z3.Or(z3.And(guard, stale) if rules.stale_head == "skip" else z3.BoolVal(False), skip_grammar, skip_lora)
    stale_stop = z3.And(guard, stale, z3.Not(grammar), z3.Not(lora)) if rules.stale_head == "stop" else z3.BoolVal(False)
    budget = z3_min(s.tb, s.ib)  # S:1345
    # S:1356 (the tokens left after the hit); a padded new decode asks 1 + K and stops admission
    # rather than be cut by the budget (S:1358-1380); then the threshold (S:1382).
    ask = z3.If(h.pd, 1 + c.K, h.nt - c0)
    pad_stop = z3.And(h.pd, ask > budget) if rules.padded_budget_checked else z3.BoolVal(False)
    n0 = z3.If(z3.And(0 < c.th, c.th < ask), c.th, ask)
    no_fit = z3.Or(pad_stop, z3.And(z3.Not(c.chunked),
                                    (n0 >= budget) if rules.chunked_off_fit_strict else (n0 > budget)))  # S:1387-1394
    n = z3_min(n0, budget + rules.admission_budget_extra)  # S:1396
    # allocate_slots for an admission (K:539-609): the watermark unless nothing runs, the gate;
    # the hit blocks are held already (K:552-587), those nobody holds count against the pool.
    wm = c.wm if rules.watermark_on_first_admission else z3.If(s.Rn > 0, c.wm, 0)
    he = h.he if rules.evictable_hits_checked else z3.IntVal(0)
    full = z3_max0(c.cdiv(z3_min(h.nt, c.L)) - h.hb - h.b)
    gate_fail = z3.And(c.full_isl, (full + he if rules.gate_without_watermark else full + he + wm) > s.F)
    need = z3_max0(c.cdiv(z3_min(c0 + n + c.LA, c.L)) - h.hb - h.b)  # the lookahead too (K:571-574)
    # A step that holds prefill stops at a request with more than its last token to
    # compute (S:1340), a padded new decode never (it has one token left).
    held_stop = z3.And(c.hold, h.nt - c0 > 1) if rules.held_admission_stops else z3.BoolVal(False)
    admit = z3.And(guard, z3.Not(blocked), z3.Not(held_stop), z3.Not(no_fit), z3.Not(gate_fail),
                   need + he + wm <= s.F)
    stop = z3.Or(stale_stop, z3.And(guard, z3.Not(blocked), z3.Not(admit)))
    rows = c.D if rules.drafter_rows_charged else z3.IntVal(0)  # S:1019
    s2 = WaitState(s.tb - z3.If(admit, n, 0), s.ib - z3.If(admit, n + rows, 0), s.T + z3.If(admit, n, 0), s.Tr,
                   s.tbE, s.ibE, s.Rn + z3.If(admit, 1, 0), s.A + z3.If(admit, 1, 0), s.K + z3.If(skip, 1, 0),
                   s.F - z3.If(admit, need + h.he, 0), s.H + z3.If(admit, need + h.he, 0),
                   s.Lc + z3.If(z3.And(admit, h.ln), 1, 0), s.Dc + z3.If(admit, c.D, 0), z3.Or(s.stopped, stop),
                   s.PS)
    xa = z3.And(admit, x.q == h.q)
    # the hit blocks are cached already (T:273-329), then the grant caches the full blocks it
    # computes (K:642-646)
    done = c0 + n if rules.grant_caches_computed else h.nt
    x2 = replace(x, adm=z3.Or(x.adm, xa), n=z3.If(xa, n, x.n), b=z3.If(xa, x.b + h.hb + need, x.b),
                 ls=z3.Or(x.ls, z3.And(skip_lora, x.q == h.q)),
                 cb=z3.If(xa, cached_after(c, h.hb, done, h.nt), x.cb))
    return frame, s2, x2, {"guard": guard, "admit": admit, "n": n, "need": need, "head_admitted_before": h.adm,
                           "skip_stale": z3.And(skip, z3.Not(skip_grammar), z3.Not(skip_lora)),
                           "skip_grammar": skip_grammar, "skip_lora": skip_lora, "padded": z3.And(admit, h.pd),
                           "held_stop": z3.And(guard, z3.Not(blocked), held_stop)}


# --- update_from_output's removal of finished requests -------------------------------------


@dataclass(frozen=True)
class FinishState:
    F: Any
    H: Any


def finish_iteration(c: LoopConfig, s: FinishState, b, fr, H_oth, rules: LoopRules = LoopRules()):
    """One finished request, holding `b` blocks, leaves; those of them nobody else
    holds (`fr`: all without prefix caching) return to the pool (S:3170-3201)."""
    frame = [b >= 0, 0 <= fr, fr <= b, H_oth >= 0, s.H == fr + H_oth]
    freed = fr if rules.finish_frees_blocks else z3.IntVal(0)
    return frame, FinishState(s.F + freed, s.H - fr)


def finish_I(c: LoopConfig, s: FinishState):
    return z3.And(s.F + s.H == c.U, s.F >= 0, s.H >= 0)


# --- the claims -----------------------------------------------------------------------------


class LoopVars:
    """Fresh symbols for one claim and one block size."""

    def __init__(self, bs: int, rules: LoopRules):
        # c_real: the config; c: what the loops start from (the budget_off_by_one
        # variant's step starts with one token more than max_num_scheduled_tokens)
        self.c_real = LoopConfig.fresh("L.c", bs)
        self.c = replace(self.c_real, TB0=self.c_real.TB0 + rules.token_budget_extra) \
            if rules.token_budget_extra else self.c_real
        self.k = RunConsts(*(z3.Int(f"L.k.{f.name}") for f in fields(RunConsts)))
        self.s = _fresh(RunState, "L.s")
        self.x = _fresh(RunReq, "L.x")
        self.cr = _fresh(RunReq, "L.cr")
        self.v = _fresh(RunReq, "L.v")
        self.sp = _fresh(RunSplit, "L.sp")
        self.ws = _fresh(WaitState, "L.ws")
        self.wx = _fresh(WaitReq, "L.wx")
        self.wh = _fresh(WaitReq, "L.wh")
        self.W0 = z3.Int("L.W0")
        self.fs = _fresh(FinishState, "L.fs")
        self.fb, self.fH, self.ff = z3.Int("L.fb"), z3.Int("L.fH"), z3.Int("L.ff")
        self.dk = z3.Int("L.dk")  # tokens one batch delivers to a request
        self.Lc0 = z3.Int("L.Lc0")  # LoRA: the distinct adapters of before.running
        # async counters of the ghost (x or wx) before the step, and the tokens the
        # batch update_from_output applies scheduled for it
        self.inf, self.stl, self.bt = z3.Int("L.inf"), z3.Int("L.stl"), z3.Int("L.bt")
        # the configured long-prefill threshold and its adaptive flag; the eligible
        # requests (running + waiting) of this step and the next, the next step's
        # threshold in force, the requests ahead of x and the sum of their capped needs
        # then (running_never_starved)
        self.T, self.adaptive = z3.Int("L.T"), z3.Bool("L.adaptive")
        self.NE, self.NE2, self.th2 = z3.Int("L.NE"), z3.Int("L.NE2"), z3.Int("L.th2")
        self.kA, self.SA2 = z3.Int("L.kA"), z3.Int("L.SA2")


# One "part" = (name, builder(vars, rules) -> (premises, goal)).  A claim is
# proved when every part's premises ∧ ¬goal is unsat, for every block size.
Part = tuple[str, Callable[["LoopVars", LoopRules], tuple[list, Any]]]


def _run_pre(V: LoopVars):
    c, k, s, x = V.c, V.k, V.s, V.x
    return [c.constraints(), x.static_facts(c, k.R0), k.R0 >= 1, k.R0 <= c.M, k.F0 >= 0, k.H0 >= 0,
            k.F0 + k.H0 == c.U, k.D0 >= 0, k.CAx >= 0, run_I(c, k, s, x), run_J(c, k, s, x)]


def part_run_entry(V: LoopVars, R: LoopRules):
    premises, s0, x0 = run_entry(V.c, V.k, V.x, R)
    return premises, z3.And(run_I(V.c, V.k, s0, x0), run_J(V.c, V.k, s0, x0))


def part_run_preserved(V: LoopVars, R: LoopRules):
    frame, s2, x2, _ = run_iteration(V.c, V.k, V.s, V.x, V.cr, V.v, V.sp, R)
    return _run_pre(V) + frame + [run_guard(V.s)], z3.And(run_I(V.c, V.k, s2, x2), run_J(V.c, V.k, s2, x2))


def _wait_pre(V: LoopVars):
    c = V.c
    return [c.constraints(), V.W0 >= 1, V.wx.static_facts(c, V.W0), wait_I(c, V.ws, V.W0), wait_J(c, V.ws, V.wx)]


def part_wait_entry(V: LoopVars, R: LoopRules):
    """From the running loop's exit with no preemption (S:1066) to the waiting
    loop's invariant; the bad variant admits after a preemption too.  LoRA's
    premise `before_within_max_loras`: before.running uses at most max_loras
    adapters (max_loras_respected of the step before; the running loop only
    takes requests out, so with no preemption `running` is before.running)."""
    c, s = V.c, V.s
    pre = _run_pre(V) + [z3.Not(run_guard(s)), V.W0 >= 1, V.wx.static_facts(c, V.W0),
                         V.Lc0 >= 0, z3.Implies(c.lora, V.Lc0 <= c.ML)]
    if not R.admit_after_preemption:
        pre.append(s.P == 0)
    ws0 = WaitState(s.tb, s.ib, s.T, s.T, s.tb, s.ib, s.Rn, z3.IntVal(0), z3.IntVal(0), s.F, s.H, V.Lc0, s.Dc,
                    z3.BoolVal(False), s.PS)
    wx0 = replace(V.wx, adm=z3.BoolVal(False), n=z3.IntVal(0), b=z3.IntVal(0), ls=z3.BoolVal(False), cb=z3.IntVal(0))
    # With the waiting loop entered, the pool's blocks are the usable blocks.
    pre.append(V.k.F0 + V.k.H0 == c.U)
    return pre, z3.And(wait_I(c, ws0, V.W0), wait_J(c, ws0, wx0), s.P == 0)


def part_wait_preserved(V: LoopVars, R: LoopRules):
    frame, s2, x2, _ = wait_iteration(V.c, V.ws, V.W0, V.wx, V.wh, R)
    return _wait_pre(V) + frame + [wait_guard(V.c, V.ws, V.W0, R)], z3.And(wait_I(V.c, s2, V.W0),
                                                                             wait_J(V.c, s2, x2))


def part_finish_entry(V: LoopVars, R: LoopRules):
    ws = V.ws
    return _wait_pre(V), finish_I(V.c, FinishState(ws.F, ws.H))


def part_finish_preserved(V: LoopVars, R: LoopRules):
    frame, s2 = finish_iteration(V.c, V.fs, V.fb, V.ff, V.fH, R)
    return [V.c.constraints(), finish_I(V.c, V.fs)] + frame, finish_I(V.c, s2)


# Exit claims, one per property, each from an invariant and a loop's exit.


def exit_token_budget(V: LoopVars, R: LoopRules):
    """token_budget_respected: after the waiting loop (or a running loop with a
    preemption, which skips it) the grants sum to <= both budgets of the real config,
    and with a drafter's rows the grants and rows to <= max_num_batched_tokens."""
    c = V.c_real
    return _wait_pre(V), z3.And(V.ws.T <= c.TB0, V.ws.T <= c.IB0, V.ws.T + V.ws.Dc <= c.IB0)


def exit_token_budget_running(V: LoopVars, R: LoopRules):
    c = V.c_real
    return _run_pre(V) + [z3.Not(run_guard(V.s))], z3.And(V.s.T <= c.TB0, V.s.T <= c.IB0,
                                                         V.s.T + V.s.Dc <= c.IB0)


def exit_max_num_seqs(V: LoopVars, R: LoopRules):
    """max_num_seqs_respected: running never exceeds max_num_active_reqs after
    the waiting loop (finishes only shrink it)."""
    return _wait_pre(V), V.ws.Rn <= V.c.M


def exit_max_num_seqs_running(V: LoopVars, R: LoopRules):
    return _run_pre(V), V.s.Rn <= V.c.M


def iter_grants_positive(V: LoopVars, R: LoopRules):
    """grants_positive: every running grant is >= 1 token, to a request not granted before in the step."""
    frame, _, _, f = run_iteration(V.c, V.k, V.s, V.x, V.cr, V.v, V.sp, R)
    return _run_pre(V) + frame + [f["success"]], z3.And(f["n"] >= 1, z3.Not(f["cr_granted_before"]))


def iter_admission_positive(V: LoopVars, R: LoopRules):
    frame, _, _, f = wait_iteration(V.c, V.ws, V.W0, V.wx, V.wh, R)
    return _wait_pre(V) + frame + [f["admit"]], z3.And(f["n"] >= 1, z3.Not(f["head_admitted_before"]))


def exit_running_full_needs(V: LoopVars, R: LoopRules):
    """running_before_waiting, running part: the running loop left budget and
    preempted nothing (the waiting loop's premise), so every request of
    before.running with a positive capped need got all of it, but a prefill chunk
    a step holding prefill skips on purpose (S:838; the property's exception too)."""
    s, x = V.s, V.x
    pre = _run_pre(V) + [z3.Not(run_guard(s)), s.P == 0, s.tb > 0, s.ib > 0, x.cap(V.c) > 0, z3.Not(x.held(V.c))]
    return pre, z3.And(x.inr, x.g, x.n == x.cap(V.c))


def exit_admissions_within_left(V: LoopVars, R: LoopRules):
    """running_before_waiting, waiting part: admissions use at most the budget the
    running loop left, min(token_budget, max_num_batched_tokens) - Tr, and only
    if it left some of both budgets."""
    c, ws = V.c_real, V.ws
    return _wait_pre(V) + [ws.A > 0], z3.And(ws.T - ws.Tr <= c.B - ws.Tr,
                                              ws.tbE > 0, ws.ibE > 0)


def exit_grammar_wait(V: LoopVars, R: LoopRules):
    """grammar_wait_respected: when the waiting loop ends, a request of
    before.waiting whose grammar is compiling or failed was not admitted.  The
    running loop schedules only running requests, and a step with a preemption
    admits nobody (exit_no_admission_after_preemption), so this is every way it
    could be scheduled."""
    return _wait_pre(V) + [z3.Not(wait_guard(V.c, V.ws, V.W0, R))], z3.Implies(V.wx.gw, z3.Not(V.wx.adm))


def exit_max_loras(V: LoopVars, R: LoopRules):
    """max_loras_respected: when the waiting loop ends, the batch has at most
    max_loras adapters.  A step with a preemption admits nobody
    (exit_no_admission_after_preemption) and the finish loop only takes requests
    out, so their adapters are a subset of before.running's, within max_loras by
    the premise."""
    return _wait_pre(V) + [z3.Not(wait_guard(V.c, V.ws, V.W0, R))], z3.Implies(V.c.lora, V.ws.Lc <= V.c.ML)


def exit_preemption_failure(V: LoopVars, R: LoopRules):
    """preemption_only_on_allocation_failure: a preemption implies the whole block
    demand of before.running exceeds the free pool, and the victims are the first
    P of the policy's order (rank)."""
    s, x, k = V.s, V.x, V.k
    return _run_pre(V) + [s.P > 0], z3.And(k.D0 > k.F0, z3.Implies(z3.Not(x.inr), x.seq == x.rank),
                                           z3.Implies(x.inr, x.rank >= s.P))


def exit_no_admission_after_preemption(V: LoopVars, R: LoopRules):
    """... and no request is admitted in that step: the waiting loop is entered
    only with P == 0 (S:1066); the bad variant enters it always."""
    entered = z3.BoolVal(True) if R.admit_after_preemption else (V.s.P == 0)
    return _run_pre(V) + [z3.Not(run_guard(V.s)), V.s.P > 0], z3.Not(entered)


def exit_kv_conserved(V: LoopVars, R: LoopRules):
    """kv_blocks_conserved: after the finish loop, free + held == usable and free
    >= 0; each request holds cdiv(min(computed, L)) blocks: a running one of
    before.running (computed advanced by its grant, or 0 if preempted), and an
    admitted one."""
    c, x, wx = V.c, V.x, V.wx
    nc_after = z3.If(x.g, x.nc + x.n, z3.If(x.inr, x.nc, 0))
    per_x = x.b == c.cdiv(z3_min(nc_after, c.L))
    per_wx = wx.b == c.cdiv(z3_min(wx.computed(c), c.L))
    return _run_pre(V) + _wait_pre(V) + [finish_I(c, V.fs)], z3.And(
        V.fs.F + V.fs.H == c.U, V.fs.F >= 0, per_x, per_wx)


def placeholders_after(c: LoopConfig, nc2, nt, ph, granted, rules: LoopRules, ds=0):
    """update_after_schedule (S:1899-1931, async_scheduler.py:24-56): with async
    scheduling a granted request that is not mid-prefill (computed tokens, advanced
    by the grant, reach num_tokens + placeholders) gets one output placeholder, and
    one per draft `ds` it sent the model this step (async_scheduler.py:40-45)."""
    prefill_chunk = nc2 < nt + ph
    add = {"not_prefill": z3.Not(prefill_chunk), "never": z3.BoolVal(False),
           "always": z3.BoolVal(True)}[rules.placeholder_added]
    return ph + z3.If(z3.And(c.asy, granted, add), 1 + (ds if rules.placeholders_per_draft else 0), 0)


def padded_drafts(c: LoopConfig, wx):
    """The drafts an admitted request sends: num_speculative_tokens -1 rows when its
    admission is a padded new decode (S:1358-1380, 1643), else none."""
    return z3.If(z3.And(wx.adm, wx.pd), c.K, 0)


def exit_computed_bounded(V: LoopVars, R: LoopRules):
    """computed_tokens_bounded: 0 <= computed <= num_tokens + placeholders after
    schedule() and update_after_schedule (the grant never passes the need);
    with async on, strictly below (the state invariant
    computed_tokens_below_num_tokens: the placeholder added to a request that
    completes its known tokens; in the synchronous engine the token it samples,
    U:98-140, gives it); and computed < max_model_len (cap 3, S:868), the premise
    `static_facts` assumes of the next step.  A preempted request restarts from 0
    with no placeholders (S:1853-1897)."""
    c, x, wx = V.c, V.x, V.wx
    nc_after = z3.If(x.g, x.nc + x.n, z3.If(x.inr, x.nc, 0))
    ph_after = z3.If(x.inr, placeholders_after(c, nc_after, x.nt, x.ph, x.g, R, x.drafts_sent(x.n)), 0)
    # a waiting request has none (preempt resets them)
    wnc = wx.computed(c)
    wph_after = placeholders_after(c, wnc, wx.nt, 0, wx.adm, R, padded_drafts(c, wx))
    return _run_pre(V) + _wait_pre(V), z3.And(
        0 <= nc_after, nc_after <= x.nt + ph_after, z3.Implies(c.asy, nc_after < x.nt + ph_after), nc_after < c.L,
        z3.Implies(wx.adm, z3.And(wnc <= wx.nt + wph_after, z3.Implies(c.asy, wnc < wx.nt + wph_after),
                                  wnc < c.L)))


def lemma_delivery_keeps_bound(V: LoopVars, R: LoopRules):
    """update_from_output of a batch (with async, an older one, S:2301-2618)
    keeps computed < num_tokens + placeholders, computed < max_model_len and
    placeholders >= 0 for a request it does not finish: it delivers k <= 1 token
    (no speculative decoding), which replaces a placeholder (S:2898-2905) or, for
    a request preempted meanwhile (stale), is appended with progress and
    placeholders unchanged (S:2362-2384); computed tokens fall only by tokens
    discarded past a stop (S:2891-2897), which finishes the request."""
    c, x, k = V.c, V.x, V.dk
    nt2 = x.nt + k
    ph2 = x.ph - z3.If(z3.And(x.ph > 0, k > 0), k, 0)
    pre = [c.constraints(), c.asy, 0 <= x.nc, x.ph >= 0, x.nc < x.nt + x.ph, x.nc < c.L, 0 <= k, k <= 1]
    return pre, z3.And(x.nc < nt2 + ph2, x.nc < c.L, ph2 >= 0)


def exit_never_starved(V: LoopVars, R: LoopRules):
    """A request x of before.running that is still running after the running loop
    received >= 1 token, given the named premises: the capped needs of the
    requests ahead of it sum to less than the step budget (`ahead_within_budget`);
    `not_last_token_in_flight`: the async max_tokens guard does not skip it
    (S:816-830); `below_max_model_len_cap`: computed + 1 < max_model_len, so the
    max_model_len cap (S:868) leaves it a token (under async, computed tokens run
    ahead of num_tokens by the placeholders).  Both hold always in the
    synchronous engine (lemma below).  `not_held_prefill_chunk`: the step does
    not hold prefill, or x is not a prefill chunk (S:838, prefill throttling).
    `engine_not_paused_all`: a PAUSED_ALL engine schedules nothing (S:735, 739-741)."""
    s, x, k, c = V.s, V.x, V.k, V.c
    pre = _run_pre(V) + [z3.Not(run_guard(s)), x.inr, k.CAx < c.B, z3.Not(x.lif()), x.nc + 1 < c.L,
                         z3.Not(x.held(c)), z3.Not(c.pa)]
    return pre, z3.And(x.g, x.n >= 1)


def exit_whole_need_when_it_fits(V: LoopVars, R: LoopRules):
    """... and when its own capped need fits the budget too (CAx + cap <= B), it
    received all of it.  Applied to each request y ahead of x (whose needs ahead
    and own are within x's: CAy + cap_y <= CAx < B), every request ahead of a
    request meeting `ahead_within_budget` gets its whole capped need: what the
    lemma `capped needs ahead never grow` needs to carry the premise to the next step."""
    s, x, k, c = V.s, V.x, V.k, V.c
    pre = _run_pre(V) + [z3.Not(run_guard(s)), x.inr, x.cap(c) >= 1, k.CAx + x.cap(c) <= c.B, z3.Not(x.held(c)),
                         z3.Not(c.pa)]
    return pre, z3.And(x.g, x.n == x.cap(c))


def lemma_cap_positive_sync(V: LoopVars, R: LoopRules):
    """Without async scheduling both exceptions are void: computed < num_tokens <
    max_model_len gives no placeholder (so no guard) and room L - computed - 1 >= 1."""
    c, x = V.c, V.x
    return [c.constraints(), x.static_facts(c, V.k.R0), z3.Not(c.asy)], z3.And(z3.Not(x.lif()), x.nc + 1 < c.L)


def lemma_cap_positive(V: LoopVars, R: LoopRules):
    """The named exceptions are the only ones: outside them a running request's
    capped need is >= 1 (async on or off), so they are exactly the cases where the
    running loop skips it (n == 0, S:907-925) with budget left."""
    c, x = V.c, V.x
    return [c.constraints(), x.static_facts(c, V.k.R0), z3.Not(x.lif()), x.nc + 1 < c.L], x.cap(c) >= 1


def lemma_caps_nonincreasing(V: LoopVars, R: LoopRules):
    """`ahead_within_budget` is kept from step to step: a request that got its whole
    capped need c has a capped need <= c in the next step (its prefill chunk
    shrinks, or it samples and needs one token), so the sum ahead of x never grows
    (requests join running only at its tail, S:1609-1611, and leave by preemption
    or finish).  The next step's threshold in force `th2` is the same, or a lower
    positive one: an adaptive threshold that falls as requests arrive
    (config.long_prefill_threshold); one that grows is the next lemma's case."""
    c, x, k = V.c, V.x, V.dk
    cap = x.cap(c)
    nc2 = x.nc + cap
    # Async: update_after_schedule's placeholder, then the batch update_from_output
    # applies delivers k <= 1 token that replaces a placeholder (a sampling batch in
    # flight always carries one, async_scheduler.py:24-56, S:2898-2905).  Sync: the
    # step samples one token when the prefill is complete.
    ph2 = placeholders_after(c, nc2, x.nt, x.ph, z3.BoolVal(True), R, x.drafts_sent(cap))
    deliveries = z3.If(c.asy, z3.And(0 <= k, k <= 1, k <= ph2), k == z3.If(nc2 >= x.nt, 1, 0))
    nt3 = x.nt + k
    ph3 = ph2 - z3.If(ph2 > 0, k, 0)
    finished = z3.Or(nt3 >= c.L, nt3 >= x.lim)  # the length stops (U:98-140): it leaves
    x2 = replace(x, nc=nc2, nt=nt3, ph=ph3)
    c2 = replace(c, th=V.th2)
    same_or_lower = z3.Or(V.th2 == c.th, z3.And(0 < V.th2, V.th2 <= c.th))
    return [c.constraints(), x.static_facts(c, V.k.R0), cap >= 1, deliveries, z3.Not(finished),
            same_or_lower], x2.cap(c2) <= cap


def lemma_grown_threshold_within_budget(V: LoopVars, R: LoopRules):
    """An adaptive threshold that grows (config.long_prefill_threshold: max(threshold,
    max_num_batched_tokens // eligible), S:770-788) keeps `ahead_within_budget`
    when max_num_scheduled_tokens >= max_num_batched_tokens (the named premise
    `scheduled_at_least_batched`): the kA requests ahead of x and x are eligible, so
    the next step's threshold is at most max_num_batched_tokens // (kA + 1), and
    their capped needs, each at most it, sum to kA * threshold < the budget.  Each
    cap is at most the threshold (get_capped_need); their sum is bounded by kA
    times it as a sum of kA terms (the aggregation of proofs/starvation.py).
    Without the premise this fails: a request that got tokens is starved once
    other requests leave (tests/regressions/adaptive-threshold-grows.json, on the
    spec and vLLM 0.33.0)."""
    c = V.c
    # This step's and the next step's thresholds, both of the configured T, with x and
    # the kA requests ahead of it eligible in both.
    pre = [c.constraints(), threshold_constraints(c, V.T, V.adaptive), c.TB0 >= c.IB0,
           V.kA >= 1, V.NE >= V.kA + 1, V.NE2 >= V.kA + 1,
           c.th == threshold_in_force(V.T, V.adaptive, c.IB0, V.NE, c.chunked),
           V.th2 == threshold_in_force(V.T, V.adaptive, c.IB0, V.NE2, c.chunked),
           V.SA2 >= 0, V.SA2 <= V.kA * V.th2]
    # Only a grown threshold is this lemma's case (before 0.33.0 none grows: no adaptive flag).
    return pre, z3.Implies(V.th2 > c.th, V.SA2 < c.B)


# --- speculative decoding: drafts_sent_are_known ------------------------------------------


def drafts_J(c: LoopConfig, r: RunReq):
    """What the step's output holds for a request of before.running: drafts only
    for a request granted this step (a victim's leave with its grant, S:967-973),
    as many as spec_decode.schedule_drafts takes of its grant."""
    return r.ds == z3.If(r.g, r.drafts_sent(r.n), 0)


def part_drafts_entry(V: LoopVars, R: LoopRules):
    premises, s0, x0 = run_entry(V.c, V.k, V.x)
    return premises, drafts_J(V.c, x0)


def part_drafts_preserved(V: LoopVars, R: LoopRules):
    frame, s2, x2, _ = run_iteration(V.c, V.k, V.s, V.x, V.cr, V.v, V.sp, R)
    return _run_pre(V) + [drafts_J(V.c, V.x)] + frame + [run_guard(V.s)], drafts_J(V.c, x2)


def exit_drafts_known(V: LoopVars, R: LoopRules):
    """drafts_sent_are_known, running part: when the running loop ends, a request
    of before.running has drafts in the output only if it is scheduled and still
    running, and no more than it has (its grant never passes num_tokens_with_spec
    + placeholders, S:855), so they are a prefix of its own (the spec slices
    them: spec_decode.schedule_drafts)."""
    x = V.x
    return _run_pre(V) + [drafts_J(V.c, x), z3.Not(run_guard(V.s))], z3.And(
        x.ds <= x.d, z3.Implies(x.ds > 0, z3.And(x.g, x.inr)))


def iter_padded_admission(V: LoopVars, R: LoopRules):
    """... and admission part: a padded new decode is granted exactly 1 +
    num_speculative_tokens tokens, the one token it lacks and one per -1 draft, so
    its drafts are num_speculative_tokens paddings and vLLM's assertion S:1643
    holds; given the premise `threshold_admits_padded_decode` (no long-prefill
    threshold, or one of at least 1 + num_speculative_tokens: below it the
    threshold cuts the padded decode and vLLM 0.33.0 raises, docs/rules.md)."""
    c = V.c
    frame, _, _, f = wait_iteration(c, V.ws, V.W0, V.wx, V.wh, R)
    premise = z3.Or(c.th == 0, c.th >= 1 + c.K)
    return _wait_pre(V) + frame + [f["padded"], premise], f["n"] == 1 + c.K


# --- async counters: placeholders_never_negative ------------------------------------------


def counters_J(ph, inf, stl, running):
    """One request's async counters between steps (spec/request.py): placeholders,
    in-flight and stale tokens are >= 0 and stale <= in flight (the property);
    and stale output is all of its output in flight, of a waiting request with
    no placeholders: a preemption makes all of it stale and resets the
    placeholders (S:1853-1897), and the waiting loop never admits it while any is
    left (S:1123), so nothing new goes in flight meanwhile."""
    return z3.And(ph >= 0, inf >= 0, stl >= 0, stl <= inf,
                  z3.Implies(stl > 0, z3.And(stl == inf, ph == 0, z3.Not(running))))


def inflight_after(inf, granted, n, rules: LoopRules):
    """update_after_schedule (S:1899-1931): the grant goes in flight."""
    return inf + (z3.If(granted, n, 0) if rules.inflight_added else 0)


def deliver(ph, inf, stl, bt, k, rules: LoopRules):
    """update_from_output for one request of the batch it applies, `bt` tokens
    scheduled, k <= 1 sampled: a stale batch (stale > 0, S:2362-2384) lowers in
    flight and stale and keeps the placeholders; otherwise (deliver_output,
    S:2898-2905) in flight falls by bt and a sampled token replaces a placeholder
    if it has one."""
    stale = stl > 0
    inf2 = inf - bt
    stl2 = z3.If(stale, stl - (bt if rules.stale_decremented else 0), stl)
    ph2 = z3.If(stale, ph, ph - z3.If(z3.And(ph > 0, k > 0), k, 0))
    return ph2, inf2, stl2


def _batch(V: LoopVars, n_now):
    """The batch update_from_output applies in this engine step: one scheduled
    before this schedule() (its tokens are in flight already: bt <= inf), or, when
    none was in flight, this step's (bt = its grant now; reference/engine.py
    _async_step, EngineCore.step_with_batch_queue); it samples k <= 1 token (no
    speculative decoding), only if it scheduled some."""
    return [V.bt >= 0, z3.Or(V.bt <= V.inf, V.bt == n_now), 0 <= V.dk, V.dk <= 1, V.dk <= V.bt]


def exit_counters_running(V: LoopVars, R: LoopRules):
    """A request of before.running after schedule(), update_after_schedule and
    the delivery: preempted (its output in flight goes stale, placeholders reset),
    granted (the grant goes in flight, a placeholder unless mid-prefill) or left."""
    c, x = V.c, V.x
    n_now = z3.If(x.g, x.n, 0)
    pre = _run_pre(V) + [z3.Not(run_guard(V.s)), c.asy, counters_J(x.ph, V.inf, V.stl, True)] + _batch(V, n_now)
    nc2 = z3.If(x.g, x.nc + x.n, x.nc)
    gone = z3.Not(x.inr)
    ph2 = z3.If(gone, 0, placeholders_after(c, nc2, x.nt, x.ph, x.g, R, x.drafts_sent(x.n)))
    inf2 = inflight_after(V.inf, x.g, x.n, R)
    stl2 = z3.If(gone, V.inf, V.stl)
    ph3, inf3, stl3 = deliver(ph2, inf2, stl2, V.bt, V.dk, R)
    return pre, counters_J(ph3, inf3, stl3, x.inr)


def exit_counters_waiting(V: LoopVars, R: LoopRules):
    """A request of before.waiting (no placeholders: a preemption reset them),
    admitted (never with stale output: the skip of S:1123, wait_J) or left."""
    c, wx = V.c, V.wx
    n_now = z3.If(wx.adm, wx.n, 0)
    pre = _wait_pre(V) + [c.asy, counters_J(0, V.inf, V.stl, False), wx.st == (V.stl > 0)] + _batch(V, n_now)
    ph2 = placeholders_after(c, wx.computed(c), wx.nt, 0, wx.adm, R, padded_drafts(c, wx))
    inf2 = inflight_after(V.inf, wx.adm, wx.n, R)
    ph3, inf3, stl3 = deliver(ph2, inf2, V.stl, V.bt, V.dk, R)
    return pre, counters_J(ph3, inf3, stl3, wx.adm)


# --- prefix caching: which blocks a step caches ---------------------------------------------


def deliver_tokens(c: LoopConfig, nc, nt, lim, cb, d, m, stop_at, inf, bt, ph, rules: LoopRules):
    """deliver_output (S:2392-2471, 2891-2905) to a running request of the batch it
    applies: m >= 1 tokens sampled, d drafts sent with the batch.  The rejected drafts
    roll computed tokens back (S:2417-2426); the tokens after the first that stops it
    are discarded and roll them back too (S:2891-2897): an EOS or stop token at
    position `stop_at` (1-based; m or more for none), or num_tokens reaching
    max_model_len or `lim` (num_prompt_tokens + max_tokens, U:98-140).  Then, with
    placeholders or drafts configured, it caches the full blocks of its computed
    tokens out of flight (S:2450-2471).  Returns (computed, num_tokens, cached)."""
    rejected = z3.If(z3.And(d > 0, nc > 0), d - (m - 1), 0)
    kept = z3_min(m, stop_at, z3_min(c.L, lim) - nt)
    nc2 = nc - rejected - (m - kept)
    nt2 = nt + kept
    done = nc2 - (inf - bt) if rules.delivery_caches_computed else nt2
    cb2 = z3.If(z3.Or(ph > 0, c.K > 0), cached_after(c, cb, done, nt2), cb)
    return nc2, nt2, cb2


class DeliveryVars:
    """A delivery's inputs besides the request's (RunReq x): tokens sampled, the
    first stop's position, drafts sent, and in-flight tokens before it and of the batch."""

    def __init__(self):
        self.m, self.stop_at, self.d = z3.Int("L.del.m"), z3.Int("L.del.stop"), z3.Int("L.del.d")
        self.inf, self.bt = z3.Int("L.del.inf"), z3.Int("L.del.bt")


def delivery(V: LoopVars, R: LoopRules):
    """deliver_tokens on the ghost x as update_from_output finds it (nc: computed
    tokens with the batches in flight, b: blocks held): its cached blocks held and
    known (what the iteration parts prove a grant leaves), its blocks covering its
    computed tokens (blocks_match_computed_tokens), not finished (num_tokens below
    both limits); a batch that granted it drafts: m <= d + 1 tokens sampled."""
    c, x, D = V.c, V.x, DeliveryVars()
    nc2, nt2, cb2 = deliver_tokens(c, x.nc, x.nt, x.lim, x.cb, D.d, D.m, D.stop_at, D.inf, D.bt, x.ph, R)
    pre = [c.constraints(), 0 <= x.cb, x.cb <= x.b, x.cb * c.bs <= x.nt, z3.Implies(z3.Not(c.pc), x.cb == 0),
           0 <= x.nc, c.cdiv(x.nc) <= x.b, x.ph >= 0, 1 <= x.nt, x.nt < c.L, x.nt < x.lim,
           1 <= D.m, D.m <= D.d + 1, 0 <= D.d, D.d <= c.K, D.stop_at >= 1, 0 <= D.bt, D.bt <= D.inf, D.inf <= x.nc]
    return D, pre, nc2, nt2, cb2


def iter_grant_caches_computed(V: LoopVars, R: LoopRules):
    """prefix_hit_within_shared_prefix, running part: after a grant of n the
    request's cached blocks are blocks it holds, of tokens it knows, and those it
    newly caches the step computes (the property's `available` grows by at most
    min(start + n, num_tokens) // block_size blocks of it)."""
    frame, _, x2, f = run_iteration(V.c, V.k, V.s, V.x, V.cr, V.v, V.sp, R)
    x = V.x
    return _run_pre(V) + frame + [f["success"], _same(x, V.cr)], z3.And(
        x2.cb <= x2.b, x2.cb * V.c.bs <= x.nt, z3.Or(x2.cb == x.cb, x2.cb * V.c.bs <= x.nc + f["n"]))


def iter_admission_caches_computed(V: LoopVars, R: LoopRules):
    """... and waiting part: an admission holds its hit blocks, cached already, and
    caches only blocks whose tokens the hit and its grant compute."""
    c, wx = V.c, V.wx
    frame, _, x2, f = wait_iteration(c, V.ws, V.W0, wx, V.wh, R)
    return _wait_pre(V) + frame + [f["admit"], wx.q == V.wh.q], z3.And(
        x2.cb <= x2.b, x2.cb * c.bs <= wx.nt, x2.cb * c.bs <= wx.hit(c) + f["n"])


def lemma_delivery_caches_computed(V: LoopVars, R: LoopRules):
    """... and a delivery keeps the cached blocks within those it holds and the
    tokens it knows, and newly caches only blocks of tokens computed by the batches
    applied (out of flight), after its rejected drafts and discarded tokens."""
    D, pre, nc2, nt2, cb2 = delivery(V, R)
    x = V.x
    out_of_flight = nc2 - (D.inf - D.bt)
    return pre, z3.And(cb2 <= x.b, cb2 * V.c.bs <= nt2, z3.Or(cb2 == x.cb, cb2 * V.c.bs <= out_of_flight))


@dataclass(frozen=True)
class LoopClaim:
    name: str  # the registry property, or a named theorem
    parts: tuple[Part, ...]
    bad_variants: tuple[str, ...]
    doc: str


RUN_INV: tuple[Part, ...] = (("running loop: entry", part_run_entry), ("running loop: preserved", part_run_preserved))
WAIT_INV: tuple[Part, ...] = (("waiting loop: entry", part_wait_entry), ("waiting loop: preserved", part_wait_preserved))
FIN_INV: tuple[Part, ...] = (("finish loop: entry", part_finish_entry),
                             ("finish loop: preserved", part_finish_preserved))

CLAIMS: dict[str, LoopClaim] = {c.name: c for c in (
    LoopClaim("token_budget_respected", RUN_INV + WAIT_INV + (
        ("exit: running loop", exit_token_budget_running), ("exit: waiting loop", exit_token_budget)),
        ("budget_off_by_one", "grant_ignores_input_budget", "admission_over_budget", "drafter_rows_not_charged"),
        "the grants of one step sum to <= max_num_scheduled_tokens and <= max_num_batched_tokens"),
    LoopClaim("max_num_seqs_respected", RUN_INV + WAIT_INV + (
        ("exit: running loop", exit_max_num_seqs_running), ("exit: waiting loop", exit_max_num_seqs)),
        ("run_slot_check_off_by_one",), "len(running) <= max_num_active_reqs after the step"),
    LoopClaim("running_before_waiting", RUN_INV + WAIT_INV + (
        ("exit: running needs met", exit_running_full_needs),
        ("exit: admissions within what running left", exit_admissions_within_left)),
        ("running_capped_at_1", "admit_after_preemption"),
        "an admission happens only after every running request got its whole capped need, from the budget left "
        "(a prefill chunk a step holding prefill skips excepted)"),
    LoopClaim("preemption_only_on_allocation_failure", RUN_INV + (
        ("exit: demand exceeds the pool, victims in policy order", exit_preemption_failure),
        ("exit: no admission after a preemption", exit_no_admission_after_preemption)),
        ("preemption_without_allocation_failure", "admit_after_preemption", "victim_head_of_running"),
        "a preemption only when the running requests' block demand exceeds the free pool, the policy's victims, "
        "no admission"),
    LoopClaim("grants_positive", RUN_INV + WAIT_INV + (
        ("iteration: running grant >= 1, once", iter_grants_positive),
        ("iteration: admission grant >= 1, once", iter_admission_positive)),
        ("zero_grant", "placeholders_not_in_need"), "every grant >= 1 token, no request granted twice"),
    LoopClaim("kv_blocks_conserved", RUN_INV + WAIT_INV + FIN_INV + (("exit: after the finish loop", exit_kv_conserved),),
              ("preemption_leaks_blocks", "finish_leaks_blocks", "evictable_hits_unchecked"),
              "free + held == usable blocks (a block shared through a prefix hit held once), and each request "
              "holds cdiv(min(computed, L)) blocks"),
    LoopClaim("computed_tokens_bounded", RUN_INV + WAIT_INV + (
        ("exit: computed <= num_tokens + placeholders", exit_computed_bounded),
        ("lemma: delivering a batch keeps the bound", lemma_delivery_keeps_bound)),
              ("running_need_plus_2", "no_placeholder_added", "placeholders_not_in_need"),
              "0 <= num_computed_tokens <= num_tokens + num_output_placeholders after the step (strictly below "
              "with async on), and < max_model_len"),
    LoopClaim("running_never_starved", RUN_INV + (
        ("exit: a running request that stays running got >= 1 token", exit_never_starved),
        ("exit: ... and all its capped need when that fits too", exit_whole_need_when_it_fits),
        ("lemma: outside the named exceptions the capped need is >= 1", lemma_cap_positive),
        ("lemma: without async scheduling the exceptions are void", lemma_cap_positive_sync),
        ("lemma: capped needs ahead never grow", lemma_caps_nonincreasing),
        ("lemma: a grown adaptive threshold keeps the needs ahead within budget",
         lemma_grown_threshold_within_budget)),
        ("no_cursor_fix", "no_refund", "last_token_guard_stops_loop", "paused_all_schedules"),
        "a request running before the step and after it received >= 1 token in it, given its premises "
        "(ahead_within_budget; exceptions: not_last_token_in_flight, below_max_model_len_cap, "
        "not_held_prefill_chunk, engine_not_paused_all)"),
    LoopClaim("grammar_wait_respected", RUN_INV + WAIT_INV + (
        ("exit: a request waiting for its grammar was not admitted", exit_grammar_wait),),
        ("grammar_head_admitted",),
        "structured output: a waiting request whose grammar is compiling or failed is not scheduled; it keeps "
        "its place"),
    LoopClaim("max_loras_respected", RUN_INV + WAIT_INV + (
        ("exit: at most max_loras adapters in the batch", exit_max_loras),),
        ("lora_cap_off_by_one",),
        "LoRA: the running requests use at most max_loras distinct adapters after the step, given the premise "
        "before_within_max_loras; a waiting request whose adapter would be one too many keeps its place"),
    LoopClaim("drafts_sent_are_known", RUN_INV + WAIT_INV + (
        ("drafts sent: entry", part_drafts_entry), ("drafts sent: preserved", part_drafts_preserved),
        ("exit: a running request's drafts sent are its own, only if scheduled", exit_drafts_known),
        ("iteration: a padded new decode is granted 1 + num_speculative_tokens", iter_padded_admission)),
        ("drafts_counted_twice", "victim_keeps_drafts", "padded_decode_budget_unchecked"),
        "speculative decoding: the drafts a step sends are a scheduled running request's own (a prefix), or for "
        "an admitted new decode num_speculative_tokens paddings, given the premise threshold_admits_padded_decode"),
    LoopClaim("placeholders_never_negative", RUN_INV + WAIT_INV + (
        ("exit: a request of before.running, after the delivery", exit_counters_running),
        ("exit: a request of before.waiting, after the delivery", exit_counters_waiting)),
        ("inflight_not_added", "stale_not_decremented", "stale_head_admitted"),
        "async: placeholders, in-flight and stale tokens >= 0 and stale <= in flight after the step"),
    LoopClaim("prefix_hit_within_shared_prefix", RUN_INV + WAIT_INV + (
        ("iteration: a running grant caches only blocks the step computes", iter_grant_caches_computed),
        ("iteration: an admission caches only blocks the step computes", iter_admission_caches_computed),
        ("lemma: a delivery caches only computed tokens out of flight", lemma_delivery_caches_computed)),
        ("grant_caches_known_tokens", "delivery_caches_sampled_tokens"),
        "prefix caching: a grant caches only full blocks it holds whose tokens the step computes, an admission "
        "from its hit, and a delivery only blocks of tokens computed out of flight, after rejected drafts and "
        "discarded tokens (the cached prefix the property checks hits against)"),
)}

# Claims only the async engine has (the property is registered for async_scheduling alone).
ASYNC_ONLY = frozenset({"placeholders_never_negative"})
# Claims of a feature schedspec models for 0.33.0 only: whether the modelled release
# has it (the spec refuses the feature for the others).
FEATURE_ONLY: dict[str, Callable[[], bool]] = {"max_loras_respected": release.models_lora,
                                               "grammar_wait_respected": release.models_structured_output,
                                               "drafts_sent_are_known": release.models_spec_decode}
# Claims proved with speculative decoding on or off (`LoopConfig.sd` free): those
# about schedule()'s two loops, whose iterations model drafts and the lookahead,
# and which blocks a step caches, whose delivery lemma delivers several tokens
# (deliver_tokens).  The other four are stated with it off (their premises add `not sd`): their
# lemmas model the delivery of one sampled token, where speculative decoding
# delivers accepted drafts and rolls back rejected ones (S:2392-2426), and their
# exits bound computed tokens by num_tokens + placeholders, which a synchronous
# grant of drafts passes until that rollback.
SPEC_DECODE = frozenset({"token_budget_respected", "max_num_seqs_respected", "running_before_waiting",
                         "preemption_only_on_allocation_failure", "grants_positive", "grammar_wait_respected",
                         "max_loras_respected", "drafts_sent_are_known", "prefix_hit_within_shared_prefix"})


def claim_premises(claim: LoopClaim, V: LoopVars) -> list:
    """The premises a claim adds to every part: speculative decoding off unless
    the claim is one of SPEC_DECODE."""
    return [] if claim.name in SPEC_DECODE else [z3.Not(V.c.sd)]


def _check(constraints: list, timeout_s: float) -> str:
    """unsat / sat / unknown over solving.check's tries; within each, z3's default
    strategy gets a second chance on an unknown (it decides some of these faster)."""
    return check(constraints, timeout_s, also_default=True)[0]


def discharge(claim: LoopClaim, variant: str = "correct", timeout_s: float = DEFAULT_TIMEOUT_S,
              block_sizes=BLOCK_SIZES) -> Result:
    """Proved when every part holds for every block size (its negation unsat);
    refuted at the first part and block size where z3 finds a counterexample."""
    rules = LOOP_VARIANTS[variant]
    t0 = time.perf_counter()

    def parts():
        for bs in block_sizes:
            V = LoopVars(bs, rules)
            for name, build in claim.parts:
                premises, goal = build(V, rules)
                yield f"{name}, block_size {bs}", premises + claim_premises(claim, V), goal

    status, where = prove_parts(parts(), timeout_s, _check)
    return Result(status, time.perf_counter() - t0,
                  where or f"{len(claim.parts)} parts x {len(block_sizes)} block sizes unsat")


def vacuity(claim: LoopClaim, timeout_s: float = DEFAULT_TIMEOUT_S, bs: int = 4) -> Result:
    """Every part's premises are satisfiable, and the iterations can do what the
    claim is about: a grant and a preemption in the running loop (P == 0 before
    it), an admission in the waiting loop.  A part whose premises were unsat would
    prove its goal vacuously."""
    t0 = time.perf_counter()
    rules = LOOP_VARIANTS["correct"]
    V = LoopVars(bs, rules)
    checks = []
    # speculative decoding on too, where the claim covers it and the release has it
    spec_decode = claim.name in SPEC_DECODE and release.models_spec_decode()
    for name, build in claim.parts:
        premises, _ = build(V, rules)
        premises = premises + claim_premises(claim, V)
        # each part with the engine flags off and on (the synchronous-only lemma: off);
        # speculative decoding on too where the claim covers it
        for asy in (False, True):
            if asy and name.startswith("lemma: without async"):
                continue
            if not asy and claim.name in ASYNC_ONLY and name.startswith("exit"):
                continue
            if not asy and "delivering" in name:
                continue  # stated for async (the synchronous delivery is the existing "update only appends")
            for sd in (False, True) if spec_decode else (False,):
                if not sd and "padded" in name:
                    continue  # a padded new decode exists only with speculative decoding on
                checks.append((f"{name} (async {'on' if asy else 'off'}, speculative decoding "
                               f"{'on' if sd else 'off'})", premises + [V.c.asy == asy, V.c.sd == sd]))
    frame, _, _, f = run_iteration(V.c, V.k, V.s, V.x, V.cr, V.v, V.sp, rules)
    run = _run_pre(V) + frame
    checks += [("a running grant", run + [f["success"], z3.Not(_same(V.x, V.cr)), V.x.inr, V.x.pos > V.s.cur]),
               ("a first preemption of another request", run + [f["fail"], V.s.P == 0, z3.Not(f["self_preempt"])]),
               ("a self-preemption", run + [f["self_preempt"]]),
               ("async: a grant that counts placeholders", run + [V.c.asy, f["success"], V.cr.ph > 0]),
               ("async: a request skipped by the max_tokens guard, budget left",
                run + [V.c.asy, f["skip"], f["guarded"], V.x.inr, V.x.pos > V.s.cur]),
               ("async: a preemption of a request with placeholders", run + [V.c.asy, f["fail"], V.v.ph > 0])]
    wframe, _, _, wf = wait_iteration(V.c, V.ws, V.W0, V.wx, V.wh, rules)
    checks.append(("an admission", _wait_pre(V) + wframe + [wf["admit"], V.ws.A > 0]))
    checks.append(("async: a stale head skipped", _wait_pre(V) + wframe + [wf["skip_stale"]]))
    checks.append(("async: an admission behind a skipped request", _wait_pre(V) + wframe + [wf["admit"], V.ws.K > 0]))
    if release.models_prefill_throttle():
        checks += [("prefill throttling: a held prefill chunk skipped, budget left",
                    run + [f["held"], V.x.inr, V.x.pos > V.s.cur]),
                   ("prefill throttling: admission stopped at a request with prefill left",
                    _wait_pre(V) + wframe + [wf["held_stop"]]),
                   ("prefill throttling: a one-token admission in a step that holds prefill",
                    _wait_pre(V) + wframe + [wf["admit"], V.c.hold])]
    if release.models_structured_output():
        checks.append(("a head waiting for its grammar skipped", _wait_pre(V) + wframe + [wf["skip_grammar"]]))
        checks.append(("an admission behind a request waiting for its grammar",
                       _wait_pre(V) + wframe + [wf["admit"], V.wx.gw, V.wx.q < V.wh.q]))
    if release.models_lora():
        checks += [("LoRA: a head skipped, its adapter one too many", _wait_pre(V) + wframe + [wf["skip_lora"]]),
                   ("LoRA: an admission bringing a new adapter to a batch below max_loras",
                    _wait_pre(V) + wframe + [wf["admit"], V.c.lora, V.wh.ln, V.ws.Lc > 0]),
                   ("LoRA: an admission behind a request skipped for its adapter",
                    _wait_pre(V) + wframe + [wf["admit"], V.wx.ls, V.wx.q < V.wh.q])]
    if spec_decode:
        ns = V.cr.drafts_sent(f["n"])
        checks += [("speculative decoding: a grant sending all of a request's drafts",
                    run + [V.c.sd, f["success"], ns == V.cr.d, V.cr.d > 1]),
                   ("speculative decoding: a grant cut short of a request's drafts",
                    run + [V.c.sd, f["success"], ns > 0, ns < V.cr.d]),
                   ("speculative decoding: a preemption of a request granted drafts",
                    run + [V.c.sd, f["fail"], V.v.g, V.v.drafts_sent(V.v.n) > 0, drafts_J(V.c, V.v)]),
                   ("speculative decoding: a padded new decode admitted, with a lookahead",
                    _wait_pre(V) + wframe + [wf["padded"], V.c.K > 1, V.c.LA > 0]),
                   ("speculative decoding: a grant cut by the drafter rows, after another grant",
                    run + [V.c.D > 0, f["success"], f["n"] == V.s.ib, V.s.Dc > 0]),
                   ("speculative decoding: a refund of a victim's drafter rows",
                    run + [V.c.D > 0, f["fail"], V.v.g]),
                   ("speculative decoding: an admission after grants charged drafter rows",
                    _wait_pre(V) + wframe + [wf["admit"], V.c.D > 0, V.ws.Dc > V.c.D])]
    if claim.name == "prefix_hit_within_shared_prefix":
        _, _, x2, _ = run_iteration(V.c, V.k, V.s, V.x, V.cr, V.v, V.sp, rules)
        _, _, wx2, _ = wait_iteration(V.c, V.ws, V.W0, V.wx, V.wh, rules)
        D, dpre, _, _, cb2 = delivery(V, rules)
        checks += [("prefix caching: a running grant that caches a block",
                    run + [f["success"], _same(V.x, V.cr), x2.cb > V.x.cb]),
                   ("prefix caching: an admission from a hit that caches a block past it",
                    _wait_pre(V) + wframe + [wf["admit"], V.wx.q == V.wh.q, V.wh.hb > 0, wx2.cb > V.wh.hb]),
                   ("prefix caching: a delivery of drafts, one rejected, past a stop, that caches a block",
                    dpre + [D.d > 0, D.m <= D.d, D.stop_at < D.m, cb2 > V.x.cb]),
                   ("prefix caching: a hash lookahead holding a full block back",
                    run + [f["success"], _same(V.x, V.cr), V.c.LH > 0,
                           x2.cb < z3_min(V.x.nc + f["n"], V.x.nt) / V.c.bs])]
    if claim.name in ASYNC_ONLY:
        xr, _ = exit_counters_running(V, rules)
        xw, _ = exit_counters_waiting(V, rules)
        checks += [("async: a preempted request's output goes stale and is delivered",
                    xr + [z3.Not(V.x.inr), V.inf > 0, V.bt > 0]),
                   ("async: a granted request with placeholders gets a token of an older batch",
                    xr + [V.x.g, V.x.ph > 0, V.dk == 1, V.bt <= V.inf]),
                   ("async: a waiting request's stale output delivered", xw + [V.stl > 0, V.bt > 0]),
                   ("async: an admission whose own batch is applied", xw + [V.wx.adm, V.bt == V.wx.n])]
    return vacuity_result(checks, timeout_s, t0)


def vacuity_result(checks, timeout_s: float, t0: float) -> Result:
    """proved when every (name, constraints) of `checks` is satisfiable; else which is
    not (unsat: the claim would be vacuous)."""
    bad = first_unsatisfiable(checks, timeout_s)
    if bad is not None:
        name, r = bad
        return Result("refuted" if r == "unsat" else "unknown", time.perf_counter() - t0,
                      f"premises of {name!r} are {r}: the claim would be vacuous")
    return Result("proved", time.perf_counter() - t0, f"{len(checks)} premise sets satisfiable")


def async_witness_scenario():
    """Three requests on a pool of 9 usable blocks with async scheduling: grants
    that count placeholders, and a preemption of a request whose batch is in
    flight, whose stale output is then delivered (found by a small random search
    over the spec, kept here so the witness is the same every run)."""
    from schedspec.reference.scenario import RequestSpec, Scenario

    cfg = {"max_num_batched_tokens": 16, "max_num_seqs": 4, "block_size": 2, "max_model_len": 16,
           "num_gpu_blocks": 10, "async_scheduling": True, "enable_prefix_caching": False,
           "enable_chunked_prefill": True}
    reqs = (RequestSpec(id="r0", prompt_len=2, max_tokens=8), RequestSpec(id="r1", prompt_len=5, max_tokens=6),
            RequestSpec(id="r2", prompt_len=5, max_tokens=8))
    return Scenario(name="loop-async-counters", config=cfg, requests=reqs, max_steps=30,
                    description=fixed_witness_description(
                        "async scheduling, placeholders, a preemption with a batch in flight, its stale output "
                        "delivered (loop:placeholders_never_negative)"))


def fixed_witness_description(what: str) -> str:
    # It starts with cli/prove.py's WITNESS_MARK, so that a rerun of `prove`
    # replaces the file instead of writing a fresh name beside it.
    return ("z3 bounded-model-checking witness file of `schedspec prove` (this one not found by BMC: a fixed "
            f"scenario replayed on the spec): {what}. Reproduce: schedspec check <this file>")


def async_witness() -> tuple[Result, Any]:
    """The witness of an async-only claim: the scenario above, replayed on the spec,
    must show a grant counting placeholders and a request preempted with output in
    flight whose stale output is delivered, with the property applicable (and
    holding) on every step; `step` is the step of that preemption."""
    from schedspec.reference.engine import run_scenario
    from schedspec.reference.impl import SpecScheduler
    from schedspec.spec.properties import PROPERTIES

    t0 = time.perf_counter()
    scenario = async_witness_scenario()
    seen: dict[str, Any] = {"placeholder grant": None, "stale delivered": None, "property": True}
    prop = PROPERTIES["placeholders_never_negative"].check

    def on_step(t):
        v = prop(t.before, t.output, t.after)
        seen["property"] = seen["property"] and v.holds and v.applicable
        for rid, _ in t.output.num_scheduled_tokens:
            r = t.before.requests.get(rid)
            if r is not None and r.num_output_placeholders > 0 and seen["placeholder grant"] is None:
                seen["placeholder grant"] = t.step
        for rid in t.output.preempted_req_ids:
            r, a = t.before.requests[rid], t.after.requests.get(rid)
            if r.num_in_flight_tokens > 0 and (a is None or a.num_output_tokens > r.num_output_tokens) \
                    and seen["stale delivered"] is None:
                seen["stale delivered"] = t.step

    run_scenario(scenario, SpecScheduler(), on_step=on_step)
    ok = seen["property"] and seen["placeholder grant"] is not None and seen["stale delivered"] is not None
    return Result("proved" if ok else "refuted", time.perf_counter() - t0,
                  f"async replay on the spec: {seen}", {"step": seen["stale delivered"]}), scenario


def grammar_witness_scenario():
    """Two requests with a grammar ahead of one without: r0's grammar compiles for
    two steps, r1's fails at step 1, r2 behind them is admitted while both wait."""
    from schedspec.reference.scenario import RequestSpec, Scenario

    cfg = {"max_num_batched_tokens": 16, "max_num_seqs": 4, "block_size": 2, "max_model_len": 32,
           "num_gpu_blocks": 20, "async_scheduling": False, "enable_prefix_caching": False}
    reqs = (RequestSpec(id="r0", prompt_len=4, max_tokens=3, grammar_compile_steps=2),
            RequestSpec(id="r1", prompt_len=3, max_tokens=3, grammar_compile_steps=1, grammar_error=True),
            RequestSpec(id="r2", prompt_len=5, max_tokens=3))
    return Scenario(name="loop-grammar-wait", config=cfg, requests=reqs, max_steps=20,
                    description=fixed_witness_description(
                        "structured output, two requests waiting for their grammars skipped while the one "
                        "behind them is admitted (loop:grammar_wait_respected)"))


def replay_witness(scenario, prop: str, label: str, shows: Callable[[Any], bool]) -> tuple[Result, Any]:
    """A fixed scenario replayed on the spec as a claim's witness: `prop` must hold
    on every step and apply on a step where `shows(transition)`; `step` is the
    first such step."""
    from schedspec.reference.engine import run_scenario
    from schedspec.reference.impl import SpecScheduler
    from schedspec.spec.properties import PROPERTIES

    t0 = time.perf_counter()
    seen: dict[str, Any] = {label: None, "holds": True}
    check_prop = PROPERTIES[prop].check

    def on_step(t):
        v = check_prop(t.before, t.output, t.after)
        seen["holds"] = seen["holds"] and v.holds
        if v.applicable and seen[label] is None and shows(t):
            seen[label] = t.step

    run_scenario(scenario, SpecScheduler(), on_step=on_step)
    ok = seen["holds"] and seen[label] is not None
    return Result("proved" if ok else "refuted", time.perf_counter() - t0,
                  f"replay on the spec: {seen}", {"step": seen[label]}), scenario


def grammar_witness() -> tuple[Result, Any]:
    """The witness of grammar_wait_respected: a request admitted from behind a
    request waiting for its grammar."""
    def shows(t):
        waiting = list(t.before.waiting)
        blocked = [i for i, rid in enumerate(waiting) if t.before.requests[rid].grammar in ("compiling", "failed")]
        return any(blocked and i > blocked[0] and rid in t.output.scheduled for i, rid in enumerate(waiting))

    return replay_witness(grammar_witness_scenario(), "grammar_wait_respected", "admitted behind a grammar wait",
                          shows)


def lora_witness_scenario():
    """max_loras 1: r0 (adapter 1) is admitted, r1 (adapter 2) is skipped, one
    adapter too many, and r2 (adapter 1) behind it is admitted past it."""
    from schedspec.reference.scenario import RequestSpec, Scenario

    cfg = {"max_num_batched_tokens": 16, "max_num_seqs": 4, "block_size": 2, "max_model_len": 32,
           "num_gpu_blocks": 20, "async_scheduling": False, "enable_prefix_caching": False, "max_loras": 1}
    reqs = (RequestSpec(id="r0", prompt_len=4, max_tokens=3, lora_int_id=1),
            RequestSpec(id="r1", prompt_len=3, max_tokens=3, lora_int_id=2),
            RequestSpec(id="r2", prompt_len=5, max_tokens=3, lora_int_id=1))
    return Scenario(name="loop-max-loras", config=cfg, requests=reqs, max_steps=20,
                    description=fixed_witness_description(
                        "LoRA with max_loras 1, a request whose adapter is one too many skipped while the one "
                        "behind it, on the batch's adapter, is admitted (loop:max_loras_respected)"))


def lora_witness() -> tuple[Result, Any]:
    """The witness of max_loras_respected: the batch at max_loras adapters and a
    request admitted from behind one skipped for its adapter."""
    def shows(t):
        adapters = {t.after.requests[rid].lora_int_id for rid in t.after.running} - {0}
        waiting = list(t.before.waiting)
        skipped = [i for i, rid in enumerate(waiting) if rid not in t.output.scheduled
                   and t.before.requests[rid].lora_int_id not in adapters | {0}]
        behind = any(skipped and i > skipped[0] and rid in t.output.scheduled for i, rid in enumerate(waiting))
        return behind and len(adapters) == t.after.config.max_loras

    return replay_witness(lora_witness_scenario(), "max_loras_respected", "admitted behind a LoRA skip", shows)


def drafts_witness_scenario():
    """num_speculative_tokens 3, lookahead 1, a token budget of 6: r0 decodes with
    three drafts, then one, alternately; r2 (arriving at step 1) decodes beside it
    and gets fewer of its drafts than it has; r1, a one-token prompt arriving at
    step 5, is admitted as a new decode padded with three -1 drafts (found by a
    small search over the spec, kept here so the witness is the same every run)."""
    from schedspec.reference.scenario import RequestSpec, Scenario

    cfg = {"max_num_batched_tokens": 6, "max_num_seqs": 4, "block_size": 2, "max_model_len": 32,
           "num_gpu_blocks": 40, "async_scheduling": False, "enable_prefix_caching": False,
           "num_speculative_tokens": 3, "num_lookahead_tokens": 1}
    reqs = (RequestSpec(id="r0", prompt_len=4, max_tokens=12, num_draft_tokens=(3, 1), num_accepted_tokens=(1,)),
            RequestSpec(id="r1", prompt_len=1, arrival_step=5, max_tokens=4, num_draft_tokens=(3,),
                        num_accepted_tokens=(0,)),
            RequestSpec(id="r2", prompt_len=3, arrival_step=1, max_tokens=3, num_draft_tokens=(3,),
                        num_accepted_tokens=(2,)))
    return Scenario(name="loop-drafts-sent", config=cfg, requests=reqs, max_steps=30,
                    description=fixed_witness_description(
                        "speculative decoding, a running request's drafts sent cut short by the budget and a new "
                        "decode admitted with padding drafts (loop:drafts_sent_are_known)"))


def drafts_witness() -> tuple[Result, Any]:
    """The witness of drafts_sent_are_known: a step that sends a running request
    fewer drafts than it has, and a step that admits a padded new decode."""
    seen = {"cut": False, "padded": False}

    def shows(t):
        admitted = set(t.output.admitted)
        for rid, ids in t.output.scheduled_spec_decode_tokens:
            if rid in admitted:
                seen["padded"] = True
            elif len(ids) < len(t.before.requests[rid].spec_token_ids):
                seen["cut"] = True
        return seen["cut"] and seen["padded"]

    return replay_witness(drafts_witness_scenario(), "drafts_sent_are_known",
                          "drafts cut short and a padded new decode, by this step", shows)


def caching_witness_scenario():
    """Prefix caching with one draft per step (block_size 2): r0's grants and its
    deliveries of accepted drafts cache its blocks; r1, of r0's prefix group,
    arrives later and hits them."""
    from schedspec.reference.scenario import RequestSpec, Scenario

    cfg = {"max_num_batched_tokens": 8, "max_num_seqs": 4, "block_size": 2, "max_model_len": 32,
           "num_gpu_blocks": 40, "async_scheduling": False, "enable_prefix_caching": True,
           "num_speculative_tokens": 1}
    reqs = (RequestSpec(id="r0", prompt_len=7, max_tokens=6, prefix_group="A", prefix_len=6,
                        num_draft_tokens=(1,), num_accepted_tokens=(1,)),
            RequestSpec(id="r1", prompt_len=9, arrival_step=3, max_tokens=2, prefix_group="A", prefix_len=6))
    return Scenario(name="loop-cached-blocks", config=cfg, requests=reqs, max_steps=30,
                    description=fixed_witness_description(
                        "prefix caching and speculative decoding, a hit on blocks an earlier request's grants "
                        "cached (loop:prefix_hit_within_shared_prefix)"))


def caching_witness() -> tuple[Result, Any]:
    return replay_witness(caching_witness_scenario(), "prefix_hit_within_shared_prefix", "a hit on cached blocks",
                          lambda t: any(h > 0 for _, h in t.output.prefix_hits))


# Claims whose witness is a fixed scenario replayed on the spec: the bounded
# encoding's BMC models neither async scheduling, structured output, LoRA,
# speculative decoding nor prefix caching.
FIXED_WITNESSES: dict[str, Callable[[], tuple[Result, Any]]] = {
    "placeholders_never_negative": async_witness, "grammar_wait_respected": grammar_witness,
    "max_loras_respected": lora_witness, "drafts_sent_are_known": drafts_witness,
    "prefix_hit_within_shared_prefix": caching_witness}


def obligations(timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Obligation]:
    """`loop:<name>` obligations for `schedspec prove`.  The witness is the z3
    vacuity check above, plus the bounded encoding's reachable witness of the
    property (a scenario file), which shows the property applies on a real run."""
    from .witness import find_witness

    out = []
    for name, claim in CLAIMS.items():
        if name in FEATURE_ONLY and not FEATURE_ONLY[name]():
            continue  # the spec refuses this feature for the modelled release
        goal = f"property:{name}" if name != "running_never_starved" else "running-kept"

        def witness(claim=claim, goal=goal):
            v = vacuity(claim, timeout_s)
            if v.status != "proved":
                return v, None
            fixed = FIXED_WITNESSES.get(claim.name)
            res, scenario = fixed() if fixed else find_witness(goal)
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
                                                       if name in SPEC_DECODE and release.models_spec_decode()
                                                       else "")),
            discharge=lambda variant, claim=claim: discharge(claim, variant, timeout_s),
            witness=witness, bad_variants=claim.bad_variants, expected="proved", doc=claim.doc,
            extra={"parts": [p for p, _ in claim.parts]}))
    return out
