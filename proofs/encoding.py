"""One scheduler step in z3: `schedule()` + fake model + `update_from_output()`,
and `add_request` and an abort (`finish_requests`), over a `SymState`.

The step is spec/scheduler.py unrolled over the slots: the running loop visits
running positions 0, 1, ... of the state before the step; a preemption clears a
slot's `alive` flag instead of deleting it from a list, which is the same as
vLLM's cursor fix (S:964): the cursor always moves on to the next live request
in the original order.  The inner allocate/preempt loop (S:928-996) runs at most
once per running request, so unrolling it that many times is exact.  Queue
positions after the step are recomputed from an order key per slot (`_compact`).

Every function returns new symbolic values and never asserts anything: the
claims, premises and bounds are the callers' (proofs/obligations.py).
Extensions (prefix-cache hits on admission, async placeholders) hook in where
spec/scheduler.py marks its seams; the comments below name the same seams.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import z3

from schedspec.spec.versions import (INPUT_BUDGET, LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL,
                                     LONG_PREFILL_THRESHOLD_NEEDS_TWO, PRIORITY_SELF_PREEMPTION_CONTINUES)

from .symbolic import PREEMPTED, RUNNING, WAITING, SymConfig, SymSlot, SymState, key_lt, priority_key_le
from .variants import VARIANTS, Rules

FINISHED_STOPPED = 7
FINISHED_LENGTH_CAPPED = 8


def z3_min(*xs):
    """The least of `xs` (z3 integer terms or ints) as one z3 term."""
    out = xs[0]
    for x in xs[1:]:
        out = z3.If(x < out, x, out)
    return out


def z3_max0(x):
    """max(x, 0) as a z3 term."""
    return z3.If(x > 0, x, 0)


def _pick(flags, values):
    """The value whose flag is true (exactly one or none; none -> the last)."""
    out = values[-1]
    for f, v in zip(reversed(flags[:-1]), reversed(values[:-1])):
        out = z3.If(f, v, out)
    return out


@dataclass(frozen=True)
class SymDecision:
    """What one step decided, per slot (SchedulerOutput + the finished list)."""

    scheduled: tuple  # Bool: granted tokens (and not refunded)
    num_scheduled_tokens: tuple  # Int: the grant (0 if none)
    grant_seq: tuple  # Int: grant order key among scheduled
    from_running: tuple  # Bool: granted by the running loop (scheduled_running_reqs)
    admitted: tuple  # Bool: admitted from waiting (new or resumed)
    resumed: tuple  # Bool: admitted and it was PREEMPTED
    preempted: tuple  # Bool
    preempt_seq: tuple  # Int: preemption order key
    sampled: tuple  # Bool: the fake model sampled a token for it
    finished: tuple  # Bool: finished by update_from_output
    finish_status: tuple  # Int: FINISHED_STOPPED / FINISHED_LENGTH_CAPPED

    def leaves(self) -> list:
        out = []
        for name in self.__dataclass_fields__:
            out += list(getattr(self, name))
        return out


class _Work:
    """schedule()'s working copy (S:716-1838): per-slot arrays and the scalars."""

    def __init__(self, st: SymState, rules: Rules, running_slots, waiting_slots, asks=None, pools=None):
        c = st.config
        self.asks = asks if asks is not None else []
        self.pools = pools if pools is not None else []
        self.st, self.c, self.rules = st, c, rules
        self.RS, self.WS = list(running_slots), list(waiting_slots)
        n = len(st.slots)
        self.alive = [s.in_running for s in st.slots]
        self.blocks = [s.num_blocks for s in st.slots]
        self.grant = [z3.IntVal(0)] * n
        self.sched = [z3.BoolVal(False)] * n
        self.gseq = [z3.IntVal(0)] * n
        self.from_running = [z3.BoolVal(False)] * n
        self.admitted = [z3.BoolVal(False)] * n
        self.aseq = [z3.IntVal(0)] * n
        self.pre = [z3.BoolVal(False)] * n
        self.pseq = [z3.IntVal(0)] * n
        self.token_budget = c.token_budget + rules.token_budget_extra  # S:735
        # S:738; before 0.28.0 the token budget alone (versions.INPUT_BUDGET): an
        # input budget that starts equal to it and moves with it caps nothing more.
        self.input_budget = c.max_num_batched_tokens if c.release.applies(INPUT_BUDGET) else self.token_budget
        self.free = st.num_free_blocks
        self.gcount = z3.IntVal(0)
        self.pcount = z3.IntVal(0)
        self.acount = z3.IntVal(0)
        eligible = st.num_running + st.num_waiting
        # The long-prefill cap applies only with more than one eligible request (S:773-779).
        # Before 0.31.0 it caps every grant (versions.LONG_PREFILL_THRESHOLD_NEEDS_TWO).
        min_eligible = rules.threshold_min_eligible if c.release.applies(LONG_PREFILL_THRESHOLD_NEEDS_TWO) else 1
        # From 0.34.0 only with chunked prefill on (versions.LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL).
        in_force = eligible >= min_eligible
        if c.release.applies(LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL):
            in_force = z3.And(in_force, c.enable_chunked_prefill)
        self.threshold = z3.If(in_force, c.long_prefill_token_threshold, 0)
        # The victim order never changes during a step: precompute who beats whom.
        self.beats = {}
        for s in self.RS:
            for t in self.RS:
                if s == t:
                    continue
                a, b = st.slots[s], st.slots[t]
                if rules.fcfs_victim_head:
                    fcfs = a.pos < b.pos
                else:
                    fcfs = a.pos > b.pos  # FCFS: the tail (S:986)
                # PRIORITY: the largest (priority, arrival_time), first in running order (S:948-952).
                prio = z3.Or(z3.Not(priority_key_le(a, b)),
                             z3.And(priority_key_le(a, b), priority_key_le(b, a), a.pos < b.pos))
                self.beats[s, t] = z3.If(c.is_priority, prio, fcfs)

    def do_grant(self, cond, s, n, running_loop: bool):
        self.grant[s] = z3.If(cond, n, self.grant[s])
        self.sched[s] = z3.Or(self.sched[s], cond)
        self.gseq[s] = z3.If(cond, self.gcount, self.gseq[s])
        if running_loop:
            self.from_running[s] = z3.Or(self.from_running[s], cond)
        self.gcount = self.gcount + z3.If(cond, 1, 0)
        self.token_budget = self.token_budget - z3.If(cond, n, 0)
        self.input_budget = self.input_budget - z3.If(cond, n, 0)

    def preempt(self, isv, s):
        """S:1853-1897 for victim slot s when `isv`; a priority victim already
        granted this step gives its grant back (S:967-973)."""
        refund = z3.And(isv, self.sched[s])
        self.token_budget = self.token_budget + z3.If(refund, self.grant[s], 0)
        self.input_budget = self.input_budget + z3.If(refund, self.grant[s], 0)
        self.sched[s] = z3.And(self.sched[s], z3.Not(isv))
        self.from_running[s] = z3.And(self.from_running[s], z3.Not(isv))
        self.grant[s] = z3.If(isv, 0, self.grant[s])
        self.alive[s] = z3.And(self.alive[s], z3.Not(isv))
        if self.rules.preempt_frees_blocks:
            self.free = self.free + z3.If(isv, self.blocks[s], 0)
        self.blocks[s] = z3.If(isv, 0, self.blocks[s])
        self.pre[s] = z3.Or(self.pre[s], isv)
        self.pseq[s] = z3.If(isv, self.pcount, self.pseq[s])

    def running_loop(self):
        """S:809-1052."""
        c, st, rules, RS = self.c, self.st, self.rules, self.RS
        active = z3.BoolVal(True)
        for k in range(len(RS)):
            at_k = [z3.And(st.slots[s].in_running, st.slots[s].pos == k) for s in RS]
            exists = z3.Or(at_k)
            ncomp = _pick(at_k, [st.slots[s].num_computed_tokens for s in RS])
            num_tokens = _pick(at_k, [st.slots[s].num_tokens for s in RS])
            blocks_held = _pick(at_k, [self.blocks[s] for s in RS])
            alive = _pick(at_k, [self.alive[s] for s in RS])
            # The loop condition: a request left and budget left (S:811).
            enter = z3.And(active, exists, self.token_budget > 0)
            active = z3.And(active, z3.Or(z3.Not(exists), self.token_budget > 0))
            enter = z3.And(enter, alive)
            stop = z3.And(enter, self.input_budget <= 0)  # S:813
            active = z3.And(active, z3.Not(stop))
            go = z3.And(enter, self.input_budget > 0)
            # [seams: async max_tokens guard, PP cadence, spec tokens/placeholders (S:816-855)]
            n = num_tokens - ncomp + rules.running_need_extra  # S:855
            n = z3.If(z3.And(0 < self.threshold, self.threshold < n), self.threshold, n)  # S:860
            n = z3_min(n, self.token_budget, self.input_budget)  # S:862
            if rules.running_cap is not None:
                n = z3_min(n, z3.IntVal(rules.running_cap))
            n = z3_min(n, c.max_model_len - ncomp - rules.model_len_margin)  # S:868
            skip = (n == 0) if rules.skip_zero_grant else (n < 0)  # S:907-925
            go = z3.And(go, z3.Not(skip))
            # allocate_slots for a RUNNING request: no watermark, no full-ISL gate (K:539-609).
            need = z3_max0(c.cdiv(z3_min(z3_min(ncomp, c.max_model_len) + n, c.max_model_len)) - blocks_held)
            # The blocks this request's allocate_slots asks for (every retry asks the same).
            for i, s in enumerate(RS):
                self.asks.append((s, z3.And(go, at_k[i]), need))
            done = z3.BoolVal(False)
            ok = z3.BoolVal(False)
            for _ in range(len(RS)):  # S:928-996: each failure removes one live request
                attempt = z3.And(go, z3.Not(done))
                fits = (need < self.free) if rules.fail_when_exact_fit else (need <= self.free)
                success = z3.And(attempt, fits)
                fail = z3.And(attempt, z3.Not(fits))
                isv = {}
                for s in RS:
                    others = [z3.Implies(self.alive[t], self.beats[s, t]) for t in RS if t != s]
                    isv[s] = z3.And([fail, self.alive[s]] + others)
                self_pre = z3.Or([z3.And(at_k[i], isv[s]) for i, s in enumerate(RS)])
                for s in RS:
                    self.preempt(isv[s], s)
                self.pcount = self.pcount + z3.If(fail, 1, 0)
                done = z3.Or(done, success, self_pre)
                ok = z3.Or(ok, success)
            granted = z3.And(go, ok)
            for i, s in enumerate(RS):
                here = z3.And(granted, at_k[i])
                self.blocks[s] = self.blocks[s] + z3.If(here, need, 0)
                self.do_grant(here, s, n, running_loop=True)
            self.free = self.free - z3.If(granted, need, 0)
            self.pools.append((list(self.blocks), self.free))
            # FCFS stops at a self-preemption; PRIORITY moves on (S:998-1008), from 0.33.0
            # (versions.PRIORITY_SELF_PREEMPTION_CONTINUES; before, PRIORITY stops too).
            moves_on = c.is_priority if c.release.applies(PRIORITY_SELF_PREEMPTION_CONTINUES) else False
            active = z3.And(active, z3.Not(z3.And(go, z3.Not(ok), z3.Not(moves_on))))

    def waiting_loop(self):
        """S:1066-1687: admissions in queue order; never preempts."""
        c, st, rules, WS = self.c, self.st, self.rules, self.WS
        num_preempted = self.pcount
        active = z3.BoolVal(True) if rules.admit_after_preemption else (num_preempted == 0)
        num_running = z3.Sum([z3.If(self.alive[s], 1, 0) for s in range(len(st.slots))])
        for q in range(len(WS)):
            at_q = [z3.And(st.slots[s].in_waiting, st.slots[s].pos == q) for s in WS]
            exists = z3.Or(at_q)
            slot_limit = (num_running < c.max_num_active_reqs) if rules.run_slot_check_strict \
                else (num_running <= c.max_num_active_reqs)
            enter = z3.And(active, exists, self.token_budget > 0, self.input_budget > 0, slot_limit)
            ncomp = _pick(at_q, [st.slots[s].num_computed_tokens for s in WS])
            num_tokens = _pick(at_q, [st.slots[s].num_tokens for s in WS])
            status = _pick(at_q, [st.slots[s].status for s in WS])
            blocks_held = _pick(at_q, [self.blocks[s] for s in WS])
            # [seams: blocked statuses, LoRA, prefix-cache and connector hits (S:1114-1350)]
            request_token_budget = z3_min(self.token_budget, self.input_budget)  # S:1345
            n = num_tokens - ncomp  # S:1356
            n = z3.If(z3.And(0 < self.threshold, self.threshold < n), self.threshold, n)  # S:1382
            no_fit = z3.And(z3.Not(c.enable_chunked_prefill), n > request_token_budget)  # S:1387-1394
            n = z3_min(n, request_token_budget + rules.admission_budget_extra)  # S:1396
            if rules.admission_cap is not None:
                n = z3_min(n, z3.IntVal(rules.admission_cap))
            L = c.max_model_len
            watermark = z3.If(z3.And(num_running > 0, z3.Or(status == WAITING, status == PREEMPTED)),
                              c.watermark_blocks, 0)  # K:539-546
            full = z3_max0(c.cdiv(z3_min(num_tokens, L)) - blocks_held)  # K:552-569
            gate_fail = z3.And(c.scheduler_reserve_full_isl, full + watermark > self.free)
            need = z3_max0(c.cdiv(z3_min(z3_min(ncomp, L) + n, L)) - blocks_held)  # K:571-609
            admit = z3.And(enter, z3.Not(no_fit), z3.Not(gate_fail), need + watermark <= self.free)
            active = z3.And(active, admit)
            for i, s in enumerate(WS):
                here = z3.And(admit, at_q[i])
                self.blocks[s] = self.blocks[s] + z3.If(here, need, 0)
                self.admitted[s] = z3.Or(self.admitted[s], here)
                self.aseq[s] = z3.If(here, self.acount, self.aseq[s])
                self.do_grant(here, s, n, running_loop=False)
            self.free = self.free - z3.If(admit, need, 0)
            self.pools.append((list(self.blocks), self.free))
            self.acount = self.acount + z3.If(admit, 1, 0)
            if rules.admitted_to_running:
                num_running = num_running + z3.If(admit, 1, 0)


def _compact(members, before) -> list:
    """New 0-based positions: the number of members that come before each slot."""
    n = len(members)
    return [z3.Sum([z3.If(z3.And(members[t], before(t, s)), 1, 0) for t in range(n) if t != s] + [z3.IntVal(0)])
            for s in range(n)]


def schedule_update(st: SymState, rules: Rules | str = "correct",
                    running_slots: Sequence[int] | None = None,
                    waiting_slots: Sequence[int] | None = None, asks: list | None = None,
                    pools: list | None = None) -> tuple[SymDecision, SymState]:
    """`schedule()`, the fake model of formats.md, then `update_from_output()`.

    `running_slots` / `waiting_slots`: the slots that may hold a running / waiting
    request before the step (default: all); a one-step claim uses disjoint sets
    (symbolic.fixed_roles) so the loops unroll over fewer candidates.

    `asks`, when given, receives one `(slot, cond, blocks)` per running slot and
    loop iteration: when `cond`, that slot's allocate_slots in the running loop asked
    for `blocks` (obligations.py states lemmas about them).  `pools`, when given,
    receives `(blocks per slot, free blocks)` after each iteration of either loop."""
    if isinstance(rules, str):
        rules = VARIANTS[rules]
    N = len(st.slots)
    RS = list(range(N)) if running_slots is None else list(running_slots)
    WS = list(range(N)) if waiting_slots is None else list(waiting_slots)
    c = st.config
    w = _Work(st, rules, RS, WS, asks, pools)
    if rules.waiting_first:
        w.waiting_loop()
        w.running_loop()
    else:
        w.running_loop()
        w.waiting_loop()
    queues = _queue_keys(st, w, rules)
    mid = _after_schedule(st, w, rules)
    sampled, finished, fstatus, after, free = _model_and_update(c, w, mid)
    nxt = _next_state_slots(st, rules, after, finished, queues)
    slots = st.slots
    decision = SymDecision(tuple(w.sched), tuple(w.grant), tuple(w.gseq), tuple(w.from_running),
                           tuple(w.admitted), tuple(z3.And(w.admitted[s], slots[s].status == PREEMPTED)
                                                    for s in range(N)),
                           tuple(w.pre), tuple(w.pseq), tuple(sampled), tuple(finished), tuple(fstatus))
    return decision, SymState(c, tuple(nxt), free)


def _queue_keys(st: SymState, w: _Work, rules: Rules) -> tuple[list, list, list, list]:
    """(running members, their order keys, waiting members, their order keys) after
    schedule(): survivors keep their order, admissions follow (S:1609-1611)."""
    N, slots = len(st.slots), st.slots
    run_member = [z3.Or(w.alive[s], w.admitted[s]) if rules.admitted_to_running else w.alive[s]
                  for s in range(N)]
    run_key = [z3.If(w.admitted[s], N + w.aseq[s], slots[s].pos) for s in range(N)]
    wait_member = [z3.Or(z3.And(slots[s].in_waiting, z3.Not(w.admitted[s])), w.pre[s],
                         z3.BoolVal(False) if rules.admitted_to_running else w.admitted[s])
                   for s in range(N)]
    if rules.preempted_to_front:
        # FCFS: each victim is prepended, so the last one is first (Q:92-95).
        fcfs_pre_key = [-1 - w.pseq[s] for s in range(N)]
    else:
        fcfs_pre_key = [N + w.pseq[s] for s in range(N)]
    wait_key = [z3.If(w.pre[s], fcfs_pre_key[s],
                      z3.If(w.admitted[s], 3 * N + w.aseq[s], slots[s].pos)) for s in range(N)]
    return run_member, run_key, wait_member, wait_key


def _after_schedule(st: SymState, w: _Work, rules: Rules) -> list:
    """The request fields after schedule() and _update_after_schedule (S:1912-1919)."""
    mid = []
    for s in range(len(st.slots)):
        r = st.slots[s]
        pre = w.pre[s]
        ncomp = r.num_computed_tokens
        if rules.preempt_resets_progress:
            ncomp = z3.If(pre, 0, ncomp)
        adv = z3.If(w.grant[s] > 2, w.grant[s] - 1, w.grant[s]) if rules.advance_shortfall_over_2 else w.grant[s]
        ncomp = ncomp + z3.If(w.sched[s], adv, 0)
        status = z3.If(pre, PREEMPTED, z3.If(w.admitted[s], RUNNING, r.status))
        npre = r.num_preemptions + z3.If(z3.And(pre, rules.preempt_counts), 1, 0)
        mid.append(r.evolve(num_computed_tokens=ncomp, status=status, num_preemptions=npre,
                            num_blocks=w.blocks[s]))
    return mid


def _model_and_update(c: SymConfig, w: _Work, mid: list) -> tuple[list, list, list, list, Any]:
    """The fake model (formats.md step 4) and update_from_output (S:2301-2618):
    (sampled, finished, finish status, the slots after, free blocks) per slot."""
    sampled, finished, fstatus, after = [], [], [], []
    free = w.free
    for s in range(len(mid)):
        r = mid[s]
        smp = z3.And(w.sched[s], r.num_computed_tokens >= r.num_tokens)
        out = r.num_output_tokens + z3.If(smp, 1, 0)
        eos = z3.And(smp, r.output_len == r.num_output_tokens + 1)
        # check_stop: EOS first, then length (U:98-140).
        length = z3.And(smp, z3.Not(eos), z3.Or(r.num_prompt_tokens + out >= c.max_model_len, out >= r.max_tokens))
        fin = z3.Or(eos, length)
        sampled.append(smp)
        finished.append(fin)
        fstatus.append(z3.If(eos, FINISHED_STOPPED, z3.If(length, FINISHED_LENGTH_CAPPED, 0)))
        free = free + z3.If(fin, r.num_blocks, 0)
        after.append(r.evolve(num_output_tokens=out, present=z3.And(r.present, z3.Not(fin)),
                              num_blocks=z3.If(fin, 0, r.num_blocks)))
    return sampled, finished, fstatus, after, free


def _next_state_slots(st: SymState, rules: Rules, after: list, finished: list, queues) -> list:
    """The slots of the state after the step: the unfinished members of each queue,
    at their positions there."""
    N, slots, c = len(st.slots), st.slots, st.config
    run_member, run_key, wait_member, wait_key = queues
    run_final = [z3.And(run_member[s], z3.Not(finished[s])) for s in range(N)]
    wait_final = [z3.And(wait_member[s], z3.Not(finished[s])) for s in range(N)]
    run_pos = _compact(run_final, lambda t, s: run_key[t] < run_key[s])
    fcfs_wait_pos = _compact(wait_final, lambda t, s: wait_key[t] < wait_key[s])
    if rules.preempted_to_front:
        # PRIORITY: the waiting heap pops in queue_key order (Q:159-164).
        prio_wait_pos = _compact(wait_final, lambda t, s: key_lt(slots[t], slots[s]))
        wait_pos = [z3.If(c.is_priority, prio_wait_pos[s], fcfs_wait_pos[s]) for s in range(N)]
    else:
        wait_pos = fcfs_wait_pos
    nxt = []
    for s in range(N):
        a = after[s]
        present = z3.Or(run_final[s], wait_final[s])
        nxt.append(a.evolve(present=present, running=run_final[s],
                            pos=z3.If(run_final[s], run_pos[s], z3.If(wait_final[s], wait_pos[s], 0))))
    return nxt


def add_request(st: SymState, s: int, request: SymSlot, cond=True, rules: Rules | str = "correct") -> SymState:
    """S:3065-3098: when `cond`, slot `s` (absent before) receives `request`, a new
    WAITING request with no progress, at the back (FCFS) or at its queue_key place
    (PRIORITY).  `request` supplies the scenario fields (lengths, priority, ...)."""
    if isinstance(rules, str):
        rules = VARIANTS[rules]
    cond = z3.BoolVal(cond) if isinstance(cond, bool) else cond
    c = st.config
    new = st.slots[s].evolve(
        present=z3.BoolVal(True), running=z3.BoolVal(False), rid_rank=request.rid_rank,
        num_prompt_tokens=request.num_prompt_tokens, max_tokens=request.max_tokens,
        output_len=request.output_len, priority=request.priority, arrival=request.arrival,
        status=z3.IntVal(WAITING), num_computed_tokens=z3.IntVal(0), num_output_tokens=z3.IntVal(0),
        num_preemptions=z3.IntVal(0), num_blocks=z3.IntVal(0))
    ahead = [t for t in range(len(st.slots)) if t != s]
    fcfs_pos = z3.Sum([z3.If(st.slots[t].in_waiting, 1, 0) for t in ahead] + [z3.IntVal(0)])
    if rules.add_at_front:
        fcfs_pos = z3.IntVal(0)
    prio_pos = z3.Sum([z3.If(z3.And(st.slots[t].in_waiting, key_lt(st.slots[t], new)), 1, 0) for t in ahead]
                      + [z3.IntVal(0)])
    new = new.evolve(pos=z3.If(c.is_priority, prio_pos, fcfs_pos))
    slots = []
    for t, old in enumerate(st.slots):
        if t == s:
            slots.append(_if_slot(cond, new, old))
        else:
            shift = z3.And(cond, c.is_priority, old.in_waiting, key_lt(new, old))
            if rules.add_at_front:
                shift = z3.Or(shift, z3.And(cond, z3.Not(c.is_priority), old.in_waiting))
            slots.append(old.evolve(pos=old.pos + z3.If(shift, 1, 0)))
    return SymState(c, tuple(slots), st.num_free_blocks)


def abort(st: SymState, s: int, cond=True, rules: Rules | str = "correct") -> SymState:
    """finish_requests([id], FINISHED_ABORTED) for the request in slot `s` (S:3100-3168):
    it leaves its queue and its blocks return to the pool."""
    cond = z3.And(z3.BoolVal(cond) if isinstance(cond, bool) else cond, st.slots[s].present)
    gone = st.slots[s]
    slots = []
    for t, old in enumerate(st.slots):
        if t == s:
            slots.append(old.evolve(present=z3.And(old.present, z3.Not(cond)),
                                    num_blocks=z3.If(cond, 0, old.num_blocks)))
        else:
            same_queue = z3.And(old.present, old.running == gone.running, gone.pos < old.pos)
            slots.append(old.evolve(pos=old.pos - z3.If(z3.And(cond, same_queue), 1, 0)))
    if isinstance(rules, str):
        rules = VARIANTS[rules]
    freed = 0 if rules.abort_leaks_blocks else z3.If(cond, gone.num_blocks, 0)
    return SymState(st.config, tuple(slots), st.num_free_blocks + freed)


def _if_slot(cond, a: SymSlot, b: SymSlot) -> SymSlot:
    return SymSlot(*(z3.If(cond, x, y) for x, y in zip(a.leaves(), b.leaves())))
