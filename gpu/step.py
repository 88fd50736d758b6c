"""One engine step of S scenarios at once: aborts, arrivals, schedule(), the fake
model of formats.md, update_from_output().  Written from the rule book
(docs/rules.md §0.1: S:839 = line 839 of vLLM 0.34.0's vllm/v1/core/sched/scheduler.py,
K = vllm/v1/core/kv_cache_manager.py, AS = sched/async_scheduler.py, E =
v1/engine/core.py), core scope: prefix caching on or off, async scheduling on or
off.  With prefix caching (a batch with `block_hashes`) the pool is kept block
by block (gpu/pool.py) and admissions run one at a time per scenario (see
`_admit_one_by_one`); without it, the pool is a count.  With async scheduling
(a batch with `async_sched`) the requests carry placeholders, tokens in flight
and stale tokens, and `engine_step_async` keeps one batch in flight per
scenario, applied by `deliver` one step later (docs/rules.md §9).

Every public function maps (Batch, State, ...) to new tensors (the steps of
`schedule` update one `_ScheduleWork`, the step's own); nothing loops over
scenarios or requests.  The one loop is in the running loop of `schedule`: one
pass per preemption (`_schedule_running`).  `schedule` is split as
spec/scheduler.py's `schedule` is: the budget (`_budget`), the running loop
(`_schedule_running`, `_running_pass`, `_choose_victim`, `_preempt`), the
waiting loop (`_schedule_waiting`, or `_admit_one_by_one` and `_admit` with
prefix caching) and the tail (`_update_after_schedule`), over one
`_ScheduleWork` of the step's tensors.

Budgets: vLLM keeps a token budget and an input budget (S:735-738).  Without
speculative decoding both start at their limits, both lose each grant and both
get each refund, and the loop tests both for > 0 and caps `n` by both, so they
act as one budget, `min(max_num_scheduled_tokens, max_num_batched_tokens)`,
here `budget`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from .state import (
    ABORTED,
    I8,
    I32,
    I64,
    LENGTH_CAPPED,
    NOT_ARRIVED,
    PREEMPTED,
    RUNNING,
    STOPPED,
    WAITING,
    Batch,
    Decision,
    State,
)
from .index import argsort_members, nonzero_rc
from .masks import any_rows, both, count_rows, eq, ge, gt, le, lt, within
from .pool import cache, free as free_blocks, lookup, pop, touch

_INF = 2**62


def ceil_div(t: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """ceil(t / d) in t's dtype, for a block ceiling: `d` is Batch.block_size_f,
    broadcast; exact for the step's dividends (gpu/limits.py)."""
    return torch.div(t, d).ceil_().to(t.dtype)


def floor_div(t: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """floor(t / d) in t's dtype, as `ceil_div`."""
    return torch.div(t, d).floor_().to(t.dtype)


def _any(mask: torch.Tensor) -> bool:
    """`mask.any()` as a Python bool.  A bool tensor read as bytes reduces much
    faster than `any` on the CPU."""
    return mask.numel() > 0 and bool(mask.contiguous().view(torch.uint8).max())


def _live(status: torch.Tensor) -> torch.Tensor:
    """Arrived and not finished: WAITING, RUNNING or PREEMPTED."""
    return within(status, WAITING, PREEMPTED)


def _in_waiting(status: torch.Tensor) -> torch.Tensor:
    return eq(status, WAITING) | eq(status, PREEMPTED)


def finish(batch: Batch, state: State, mask: torch.Tensor, status: int | torch.Tensor, step,
           rank: torch.Tensor | None = None) -> State:
    """Finish the requests in `mask` (S, R): their blocks go back to the pool
    (one request after the other in `rank` order, which the block-level pool
    needs) and they leave running and waiting (their status says so)."""
    if not _any(mask):
        return state
    if state.pool is not None:
        pool, freed = free_blocks(state.pool, mask, rank if rank is not None else state.run_pos,
                                  state.num_blocks, batch.unhashed_first)
        state = replace(state, pool=pool)
    else:
        # Selects by arithmetic (x * mask): torch.where branches per element on the
        # CPU and is several times slower on a mixed mask.
        freed = (state.num_blocks * mask).sum(1)
    status = torch.as_tensor(status, dtype=I8, device=mask.device)
    if state.fin_flag is not None:  # finished_req_ids is now non-empty (S:3194)
        state = replace(state, fin_flag=state.fin_flag | any_rows(mask))
    return replace(
        state,
        status=state.status + (status - state.status) * mask,
        num_blocks=state.num_blocks * ~mask,
        finish_step=state.finish_step + (torch.as_tensor(step, dtype=I32, device=mask.device)
                                         - state.finish_step) * mask,
        num_free_blocks=state.num_free_blocks + freed,
    )


def abort(batch: Batch, state: State, mask: torch.Tensor, step) -> tuple[State, torch.Tensor]:
    """finish_requests(..., FINISHED_ABORTED) (S:3100): waiting, running and
    preempted requests; an already finished one is left alone.  The step's
    aborts free their blocks in the scenario's abort order."""
    hit = mask & _live(state.status)
    return finish(batch, state, hit, ABORTED, step, batch.abort_rank), hit


def arrive(batch: Batch, state: State, mask: torch.Tensor) -> State:
    """add_request: WAITING at the back of the FCFS queue (slot index = arrival
    order) or at its heap place under PRIORITY (`queue_rank`, used directly)."""
    mask = mask & (state.status == NOT_ARRIVED)
    slot = torch.arange(mask.shape[1], device=mask.device, dtype=I64).expand_as(state.wait_key)
    return replace(state, status=torch.where(mask, WAITING, state.status).to(I8),
                   wait_key=torch.where(mask, slot, state.wait_key))


def _order(key: torch.Tensor, member: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots sorted by `key` with the members first; and how many members.
    `key` is int64 with |key| < 2**62 (gpu/limits.py).  Members' keys are
    distinct (run_pos: one counter value per admission; FCFS wait_key: the slot
    index or one front-counter value per preemption; queue_rank: a rank), and
    the order of the non-members is never read, so an unstable sort (about
    five times as fast here, gpu/index.py) gives the same member order."""
    return argsort_members(key, member, _INF), count_rows(member)


def waiting_key(batch: Batch, state: State) -> torch.Tensor:
    """The waiting queue's pop order key: FCFS deque position, or heap rank.
    (torch.where on a per-scenario mask: about three times as fast on the CPU
    as the arithmetic select of these int64 (S, R) keys.)"""
    return torch.where(batch.priority_policy[:, None], batch.queue_rank, state.wait_key)


def schedule(batch: Batch, state: State, active: torch.Tensor) -> tuple[Decision, State]:
    """Scheduler.schedule() (S:716-1838) then `_update_after_schedule` (S:1899-1931),
    for the scenarios in `active` (S,).  With async scheduling in the batch, the
    advance also counts the grants in flight and, per AsyncScheduler (AS:18-45),
    gives each granted request that is not mid-prefill one output placeholder:
    `is_prefill_chunk = ncomp < num_tokens + ph` after the advance (S:1917-1919)."""
    decision, new = _schedule(batch, state, active)
    if state.ph is None:
        return decision, new
    grant = decision.num_scheduled_tokens
    granted = gt(grant, 0)
    # ph here is after the step's preemptions reset it; a granted request was not preempted.
    chunk = lt(new.num_computed_tokens, batch.num_prompt_tokens + new.num_output_tokens + new.ph)
    sample = granted & ~chunk
    return replace(decision, sample=sample), replace(
        new, inflight=new.inflight + grant, chunk=(chunk & granted) | (new.chunk & ~granted),
        ph=new.ph + both(sample, batch.async_sched[:, None]))


@dataclass(slots=True)
class _ScheduleWork:
    """One schedule()'s tensors, as spec/scheduler.py's `ScheduleWork` holds one
    schedule()'s working state: the step's constants (set by `_budget`), then
    what the running loop, the waiting loop and the tail read and update.

    Per-request arithmetic is int32 (token and block counts of one request are
    below 2**31, gpu/limits.py); prefix sums over requests and per-scenario
    budgets and pools are int64.  Masks select by multiplication."""

    # the step's constants
    active: torch.Tensor  # (S,) the scenarios scheduled
    pos: torch.Tensor  # (1, R) int32 positions 0 .. R - 1
    num_tokens: torch.Tensor  # prompt plus outputs
    target: torch.Tensor  # the tokens a request's need counts up to (async: with its placeholders)
    schedulable: torch.Tensor | None  # async: not passed over by the max_tokens guard
    L: torch.Tensor  # max_model_len, (S, 1) int32
    bs: torch.Tensor  # block size for the room left in blocks held, (S, 1) int32
    bsf: torch.Tensor  # block size for block floors and ceilings, (S, 1) float
    cap1: torch.Tensor  # the long-prefill cap, (S, 1) int32
    # what the loops update
    budget: torch.Tensor  # (S,) tokens left to grant
    free: torch.Tensor  # (S,) free blocks
    pool: Any  # the block-level pool (prefix caching), else None
    grant: torch.Tensor  # (S, R) int32 tokens granted
    held: torch.Tensor  # (S, R) blocks held
    ncomp: torch.Tensor  # (S, R) num_computed_tokens
    status: torch.Tensor
    running: torch.Tensor  # status == RUNNING
    num_preemptions: torch.Tensor
    wait_key: torch.Tensor
    next_front_key: torch.Tensor
    preempt_order: torch.Tensor  # (S, R) int32: index of the preemption in this step, -1 = none
    preempted: torch.Tensor  # (S,) some request was preempted
    ph: torch.Tensor | None  # async: output placeholders
    stale: torch.Tensor | None  # async: stale tokens in flight


def _schedule(batch: Batch, state: State, active: torch.Tensor) -> tuple[Decision, State]:
    """Scheduler.schedule() (S:716-1838) then the optimistic advance of
    num_computed_tokens (S:1899-1926), for the scenarios in `active` (S,), in
    spec/scheduler.py `schedule`'s steps: the budget, the running loop, the
    waiting loop, the tail (`_update_after_schedule`)."""
    w = _budget(batch, state, active)
    _schedule_running(batch, state, w)

    # ---- The waiting loop (S:1066-1687), skipped after any preemption (S:1066). ----
    in_wait = _in_waiting(w.status)
    if w.stale is not None:
        # Async: a request whose stale output is still in flight is skipped; it
        # keeps its place (S:1123-1128, S:1675-1681).  Skipping changes no budget
        # or slot, so the skipped requests simply drop out of the admission order.
        in_wait = in_wait & eq(w.stale, 0)
    num_running = count_rows(w.running)
    if not _any(any_rows(in_wait) & active):  # no active scenario has a waiting request
        return _update_after_schedule(state, w, torch.zeros_like(w.status), num_running, state.run_pos,
                                      state.next_run_pos, None if w.pool is None else torch.zeros_like(w.grant))
    worder, num_waiting = _order(waiting_key(batch, replace(state, wait_key=w.wait_key)), in_wait)
    if w.pool is not None:
        return _admit_one_by_one(batch, state, w, active & ~w.preempted, worder, num_waiting, num_running)
    return _schedule_waiting(batch, state, w, worder, num_waiting, num_running)


def _budget(batch: Batch, state: State, active: torch.Tensor) -> _ScheduleWork:
    """The start of schedule(): the budget (S:735-738, one budget here, see the
    module's docstring), the long-prefill cap (S:770-779), the async guard, and
    the working tensors the loops update."""
    S, R = batch.shape
    dev = batch.valid.device
    status = state.status
    ncomp = state.num_computed_tokens
    num_tokens = batch.num_prompt_tokens + state.num_output_tokens
    # Block floors and ceilings divide by the block size in floating point (`bsf`,
    # exact: gpu/limits.py).  The room left in the blocks held counts a block
    # larger than max_model_len as max_model_len (`bs`): such a request holds at
    # most one block and its token counts stay below max_model_len, so the
    # ceilings of `n - room` are the same, and int32-safe (held * bs <
    # max_model_len + bs <= 2**31).
    bs = torch.minimum(batch.block_size, batch.max_model_len).to(I32)[:, None]

    running = eq(status, RUNNING)
    # R: the long-prefill cap applies only with more than one eligible request,
    # counted once at the start, and from 0.34.0 only with chunked prefill on, which
    # batch.py's config_row folds into the threshold (S:770-779).
    num_eligible = count_rows(running) + count_rows(_in_waiting(status))
    threshold = torch.where(num_eligible > 1, batch.long_prefill_token_threshold, 0)[:, None]
    # cap 1 as a minimum: threshold 0 caps nothing (threshold <= max_model_len < 2**31)
    cap1 = torch.where(threshold > 0, threshold, 2**31 - 1).to(I32)

    # Async: a decode is scheduled again while its token is in flight, the need
    # counting the placeholders (S:855); a request whose last allowed token is
    # already in flight is passed over, not stopped (the max_tokens guard,
    # S:816-830: ncomp + 2 - ph >= prompt + max_tokens).  The guard is fixed for
    # the step: only a preemption changes ncomp and ph, and takes the request off running.
    ph, stale = state.ph, state.stale
    target = num_tokens
    schedulable = None
    if ph is not None:
        target = num_tokens + ph
        schedulable = ~(gt(ph, 0) & ge(ncomp + 2 - ph, batch.num_prompt_tokens + batch.max_tokens))
    return _ScheduleWork(
        active=active, pos=torch.arange(R, device=dev, dtype=I32)[None, :], num_tokens=num_tokens, target=target,
        schedulable=schedulable, L=batch.max_model_len.to(I32)[:, None], bs=bs, bsf=batch.block_size_f[:, None],
        cap1=cap1, budget=torch.where(active, batch.token_budget, 0), free=state.num_free_blocks, pool=state.pool,
        grant=torch.zeros((S, R), dtype=I32, device=dev), held=state.num_blocks, ncomp=ncomp, status=status,
        running=running, num_preemptions=state.num_preemptions, wait_key=state.wait_key,
        next_front_key=state.next_front_key, preempt_order=torch.full((S, R), -1, dtype=I32, device=dev),
        preempted=torch.zeros(S, dtype=torch.bool, device=dev), ph=ph, stale=stale)


def _schedule_running(batch: Batch, state: State, w: _ScheduleWork) -> None:
    """The running loop (S:809-1052).

    One pass (`_running_pass`) grants every running request from the cursor on,
    in running order: request j gets min(its need, what the budget has left),
    i.e. the differences of the prefix sums of the needs clipped at the budget.
    Its blocks come out of the pool in the same order; the first request whose
    blocks do not fit (K:605) stops the pass: the grants before it stand, one
    victim is preempted (S:928-996), and the next pass retries that request with
    the same n.  So the loop runs once plus once per preemption in the step.
    The pass's prefix sums (of needs, of blocks) are at most R * max_model_len:
    int32 when that fits (gpu/limits.py), with the budget and the free blocks
    they are compared with clipped to int32 (above every sum, so no comparison changes)."""
    S, R = batch.shape
    dev = batch.valid.device
    sums = I32 if R * (batch.longest_model_len + 1) < 2**31 else I64
    cursor = torch.zeros(S, dtype=I32, device=dev)  # index into the running list
    retry_n = torch.zeros(S, dtype=I32, device=dev)  # n of the request at the cursor being retried
    loop_done = ~w.active | ~any_rows(w.running)
    it = 0
    while True:
        todo = ~loop_done
        if not _any(todo):
            break
        n, first_fail, order, num_running = _running_pass(batch, state, w, todo, cursor, retry_n, it, sums)
        has_fail = (first_fail < R) & todo
        loop_done = loop_done | (todo & ~has_fail)
        if not _any(has_fail):
            break

        # One preemption in every scenario whose allocation failed.
        ff = first_fail.clamp(max=R - 1)
        retry = n.gather(1, ff[:, None])[:, 0]
        cursor = torch.where(has_fail, ff, cursor).to(I32)
        victim_pos = _choose_victim(batch, order, num_running, w.pos)
        victim = order.gather(1, victim_pos[:, None])[:, 0]
        self_preempt = victim_pos == ff
        # Removing a victim ahead of the cursor shifts the list left (the fix #49206, S:964).
        cursor = torch.where(has_fail & (victim_pos < cursor), cursor - 1, cursor)
        vmask = torch.zeros((S, R), dtype=torch.bool, device=dev).scatter_(1, victim[:, None], has_fail[:, None])
        _preempt(batch, state, w, vmask, has_fail, it)
        retry_n = torch.where(has_fail & ~self_preempt, retry, 0)
        # Self-preemption: FCFS breaks (the request was the tail, nothing follows);
        # PRIORITY continues with the request now at the cursor (R, S:998-1008).
        loop_done = loop_done | (has_fail & self_preempt & ~batch.priority_policy)
        it += 1


def _running_pass(batch: Batch, state: State, w: _ScheduleWork, todo: torch.Tensor, cursor: torch.Tensor,
                  retry_n: torch.Tensor, it: int, sums: torch.dtype):
    """One pass of the running loop over the scenarios in `todo`: grants and
    blocks from the cursor on, up to the first request whose blocks do not fit.
    Returns (n, first_fail, order, num_running): the grants the pass computed in
    running order (those from first_fail on not applied), the position of the
    first failed allocation (R: none), the running order and its length."""
    S, R = batch.shape
    pos = w.pos
    sums_max = torch.iinfo(sums).max
    # Per slot, then once into running order: the need (zero off the running
    # list) and the room left in the blocks held (0 off the running list).
    need_s = torch.minimum(w.target - w.ncomp, w.cap1)  # S:855, cap 1 (S:860)
    # cap 3: room for the sampled token (S:868); async: 0 for a decode whose token in flight reaches L
    need_s = torch.minimum(need_s, w.L - w.ncomp - 1) * (w.running if w.schedulable is None
                                                         else w.running & w.schedulable)
    room_s = w.held * w.bs - w.ncomp * w.running
    order, num_running = _order(state.run_pos, w.running)
    need = need_s.gather(1, order)
    if it == 0:
        need = need * todo[:, None]
    else:
        need = need * ((pos >= cursor[:, None]) & todo[:, None])
        at_cursor = pos == cursor[:, None]
        need = torch.where(at_cursor & (retry_n[:, None] > 0), retry_n[:, None], need)
    # cap 2, the budget (S:862): the loop also stops once it reaches 0 (S:811).
    cum = need.cumsum(1, dtype=sums)
    b = w.budget.clamp(max=sums_max).to(sums)[:, None]
    n = (torch.minimum(cum, b) - torch.minimum(cum - need, b)).to(I32)
    # allocate_slots for a running request: no watermark, no full-ISL gate (K:539).
    # cdiv(ncomp + n, bs) - held == cdiv(n - room, bs); nothing for n = 0 (S:907).
    blocks = ceil_div(n - room_s.gather(1, order), w.bsf).clamp_(min=0) * gt(n, 0)
    # The block prefix sums only grow, so the requests whose blocks fit are
    # a prefix of the pass: `keep`; the first one outside it fails (K:605).
    keep = le(blocks.cumsum(1, dtype=sums), w.free.clamp(max=sums_max).to(sums)[:, None])
    num_kept = count_rows(keep).long()
    n_kept = n * keep
    blocks_kept = blocks * keep
    if w.pool is not None:
        # The blocks come off the free queue's head in running order (an
        # eviction when one is cached), then each granted request hashes the
        # blocks it fills, so a later admission in this step can hit them.
        pool = pop(batch.num_usable_blocks, w.pool, blocks_kept, order, w.held.gather(1, order))
        n_slot = torch.zeros_like(w.grant).scatter(1, order, n_kept)
        upto = floor_div(torch.minimum(w.ncomp + n_slot, w.num_tokens), w.bsf)
        # each request's place in the running order ranks its caching
        place = torch.empty_like(order).scatter_(1, order, pos.to(order.dtype).expand(S, R))
        w.pool = cache(batch.block_hashes, pool, upto * gt(n_slot, 0), place, ranked=True)
    w.grant = w.grant.scatter_add(1, order, n_kept)
    w.held = w.held.scatter_add(1, order, blocks_kept)
    # both sums are at most what they are clipped to above (b, free): `sums` holds them
    w.budget = w.budget - n_kept.sum(1, dtype=sums)
    w.free = w.free - blocks_kept.sum(1, dtype=sums)
    return n, num_kept, order, num_running


def _choose_victim(batch: Batch, order: torch.Tensor, num_running: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The preemption victim's position in running order (S:948-952, S:986).
    FCFS: the tail of running (S:986).  PRIORITY: the largest (priority,
    arrival_time), the first in running order on a tie, from all of running,
    so possibly already scheduled this step, or the request itself (S:948-952)."""
    R = batch.shape[1]
    in_running = lt(pos, num_running[:, None])
    victim_key = torch.where(in_running, batch.victim_rank.gather(1, order) * (R + 1) + (R - pos), -1)
    return torch.where(batch.priority_policy, victim_key.argmax(1), (num_running - 1).clamp(min=0))


def _preempt(batch: Batch, state: State, w: _ScheduleWork, vmask: torch.Tensor, has_fail: torch.Tensor,
             it: int) -> None:
    """Preempt the requests in `vmask` (one per scenario in `has_fail`), the
    `it`-th preemption of the step."""
    # A victim already scheduled this step gives its grant back (S:967-973).
    w.budget = w.budget + torch.where(vmask, w.grant, 0).sum(1)
    w.grant = torch.where(vmask, 0, w.grant)
    # _preempt_request (S:1853-1897): free the blocks, restart from zero, to waiting.
    if w.pool is not None:
        w.pool, freed = free_blocks(w.pool, vmask, state.run_pos, w.held, batch.unhashed_first)
        w.free = w.free + freed
    else:
        w.free = w.free + torch.where(vmask, w.held, 0).sum(1)
    w.held = torch.where(vmask, 0, w.held)
    w.ncomp = torch.where(vmask, 0, w.ncomp)
    if w.ph is not None:
        # Its tokens in flight become stale (they are still delivered, docs/rules.md §9.3), and
        # its placeholders go (S:1889-1890).
        w.stale = torch.where(vmask, state.inflight, w.stale)
        w.ph = torch.where(vmask, 0, w.ph)
    w.status = torch.where(vmask, PREEMPTED, w.status).to(I8)
    w.running = eq(w.status, RUNNING)
    w.num_preemptions = w.num_preemptions + vmask.to(I32)
    # FCFS: the front of the waiting deque (Q:92-95); PRIORITY: a heap push,
    # whose place `waiting_key` reads from queue_rank.
    w.wait_key = torch.where(vmask, w.next_front_key[:, None], w.wait_key)
    w.next_front_key = w.next_front_key - has_fail.to(I64)
    w.preempt_order = torch.where(vmask, it, w.preempt_order)
    w.preempted = w.preempted | has_fail


def _schedule_waiting(batch: Batch, state: State, w: _ScheduleWork, worder: torch.Tensor,
                      num_waiting: torch.Tensor, num_running: torch.Tensor) -> tuple[Decision, State]:
    """The waiting loop without prefix caching, in one pass, then the tail.

    Admission k (in queue order) is tried only if admissions 0..k-1 succeeded,
    and any failure ends the loop, so the admitted requests are the longest
    prefix of the queue whose conditions all hold, each evaluated with the
    budget and pool left by the admissions before it (prefix sums again)."""
    k = w.pos
    queued = k < num_waiting[:, None]
    w_tokens = w.num_tokens.gather(1, worder)  # num_computed_tokens is 0: no prefix cache
    want = torch.minimum(w_tokens, w.cap1) * queued  # S:1382
    cum = want.cumsum(1, dtype=I64)
    b = w.budget[:, None]
    left = b - torch.minimum(cum - want, b)  # budget left when admission k is tried
    n = torch.minimum(want, left).to(I32)  # S:1396
    ok = queued & (left > 0)  # S:1091, S:1110
    ok &= num_running[:, None] + k < batch.max_num_active_reqs[:, None]  # the run-slot check (S:1093)
    # chunked prefill off: the whole request must fit, else admission stops (S:1387-1394).
    ok &= batch.enable_chunked_prefill[:, None] | (want <= left)
    blocks = ceil_div(n, w.bsf)
    free_k = w.free[:, None] - (blocks.cumsum(1, dtype=I64) - blocks)
    # The watermark: admissions only, not while running is empty (K:539-546).
    wm = batch.watermark_blocks[:, None] * (num_running[:, None] + k > 0)
    # The full-ISL gate: the whole sequence must fit (K:552-569).
    full = ceil_div(w_tokens, w.bsf)
    ok &= ~batch.reserve_full_isl[:, None] | (full + wm <= free_k)
    ok &= blocks + wm <= free_k  # K:605
    ok &= (w.active & ~w.preempted)[:, None]
    admit = ok.to(I8).cumprod(1).bool()
    n_adm = n * admit
    blocks_adm = blocks * admit
    num_admitted = admit.sum(1)
    amask = torch.zeros_like(admit).scatter_(1, worder, admit)
    admitted = (amask * (2 - ((w.status == WAITING) | batch.resumed_as_new[:, None]).to(I8))).to(I8)
    w.grant = w.grant.scatter_add(1, worder, n_adm)
    w.held = w.held.scatter_add(1, worder, blocks_adm)
    w.free = w.free - blocks_adm.sum(1)
    run_pos_adm = torch.zeros_like(state.run_pos).scatter_(1, worder, state.next_run_pos[:, None] + k)
    run_pos = torch.where(amask, run_pos_adm, state.run_pos)
    w.status = torch.where(amask, RUNNING, w.status).to(I8)
    return _update_after_schedule(state, w, admitted, num_running + num_admitted, run_pos,
                                  state.next_run_pos + num_admitted, None)


def _update_after_schedule(state: State, w: _ScheduleWork, admitted: torch.Tensor, num_running: torch.Tensor,
                           run_pos: torch.Tensor, next_run_pos: torch.Tensor,
                           hit_tokens: torch.Tensor | None) -> tuple[Decision, State]:
    """The tail: _update_after_schedule's optimistic advance (S:1912), and the
    step's decision and state."""
    decision = Decision(num_scheduled_tokens=w.grant, admitted=admitted, preempt_order=w.preempt_order,
                        num_running=num_running, hit_tokens=hit_tokens)
    return decision, replace(
        state, status=w.status, num_computed_tokens=w.ncomp + w.grant, num_preemptions=w.num_preemptions,
        num_blocks=w.held, run_pos=run_pos, wait_key=w.wait_key, num_free_blocks=w.free, next_run_pos=next_run_pos,
        next_front_key=w.next_front_key, pool=w.pool, ph=w.ph, stale=w.stale)


def _admit_one_by_one(batch: Batch, state: State, w: _ScheduleWork, cont: torch.Tensor, worder: torch.Tensor,
                      num_waiting: torch.Tensor, num_running: torch.Tensor) -> tuple[Decision, State]:
    """The waiting loop with the block-level pool (S:1066-1687, K:318-329,
    K:401-648), then the tail: admission k of every scenario at once, k = 0, 1,
    ... while some scenario goes on, since admission k's hit depends on what
    admissions 0..k-1 cached, evicted and touched.  A scenario stops at its
    first admission that fails (budget, run slot, chunked prefill off, blocks)."""
    S, R = batch.shape
    dev = batch.valid.device
    a = _Admissions(
        rows=torch.arange(S, device=dev), i=torch.arange(batch.block_hashes.shape[2], dtype=I64, device=dev)[None, :],
        bsz=w.bs[:, 0].to(I64), Lz=w.L[:, 0].to(I64), cap=w.cap1[:, 0].to(I64), nrun=num_running.to(I64),
        run_pos=state.run_pos, admitted=torch.zeros_like(w.status), hit_tokens=torch.zeros_like(w.grant))
    w.budget = w.budget.clone()
    k = 0
    while True:
        # S:1091-1113: budget left, a request waiting, a run slot free.
        cont = cont & (k < num_waiting) & (w.budget > 0) & (a.nrun < batch.max_num_active_reqs)
        if not _any(cont):
            break
        r = worder[:, min(k, R - 1)]
        cont = _admit(batch, state, w, a, r, cont, num_running)
        if not _any(cont):
            break
        k += 1
    num_admitted = a.nrun - num_running
    return _update_after_schedule(state, w, a.admitted, a.nrun, a.run_pos, state.next_run_pos + num_admitted,
                                  a.hit_tokens)


@dataclass(slots=True)
class _Admissions:
    """`_admit_one_by_one`'s constants and what its admissions update besides `_ScheduleWork`."""

    rows: torch.Tensor  # (S,) 0 .. S - 1
    i: torch.Tensor  # (1, H) block positions
    bsz: torch.Tensor  # (S,) int64 `_ScheduleWork.bs`
    Lz: torch.Tensor  # (S,) int64 max_model_len
    cap: torch.Tensor  # (S,) int64 the long-prefill cap
    nrun: torch.Tensor  # (S,) int64 len(running)
    run_pos: torch.Tensor
    admitted: torch.Tensor
    hit_tokens: torch.Tensor


def _admit(batch: Batch, state: State, w: _ScheduleWork, a: _Admissions, r: torch.Tensor, cont: torch.Tensor,
           num_running: torch.Tensor) -> torch.Tensor:
    """One admission per scenario in `cont`: request `r` (S,), with its
    prefix-cache hit; returns the scenarios that admitted it."""
    S, R = batch.shape
    dev = batch.valid.device
    rows, bsf, pool, budget, free, status = a.rows, batch.block_size_f, w.pool, w.budget, w.free, w.status
    ntok = w.num_tokens[rows, r].to(I64)
    # The hit (S:1149-1166): num_computed_tokens is 0 for every waiting request
    # here; at most num_tokens - 1 tokens, whole blocks.
    hits, hblocks = lookup(pool, batch.block_hashes[rows, r], floor_div(ntok - 1, bsf) * cont)
    hits = hits.to(I64)
    hvalid = a.i[:, : hblocks.shape[1]] < hits[:, None]
    evictable = ((pool.ref.gather(1, hblocks.clamp(min=0)) == 0) & hvalid).sum(1)
    comp = hits * a.bsz
    want = torch.minimum(ntok - comp, a.cap)  # S:1356, S:1382
    ok = cont & (batch.enable_chunked_prefill | (want <= budget))  # S:1387-1394
    n = torch.minimum(want, budget)  # S:1396
    wm = batch.watermark_blocks * (a.nrun > 0)  # K:539-546
    full = (ceil_div(torch.minimum(ntok, a.Lz), bsf) - hits).clamp(min=0)  # K:552-569
    ok &= ~batch.reserve_full_isl | (full + evictable + wm <= free)
    new = (ceil_div(torch.minimum(comp + n, a.Lz), bsf) - hits).clamp(min=0)  # K:571-609
    ok &= new + evictable + wm <= free
    if not _any(ok):
        return ok
    # allocate_slots (K:611-648): touch the hits, they open the block table,
    # then the new blocks; then cache what the grant fills.
    hv = hvalid & ok[:, None]
    pool = touch(pool, hblocks, hv)
    hs, hi = nonzero_rc(hv)
    pool.table[hs, r[hs], hi] = hblocks[hs, hi].to(I32)
    onehot = torch.zeros((S, R), dtype=torch.bool, device=dev)
    onehot[rows, r] = ok
    pool = replace(pool, ncached=torch.where(onehot, hits.to(I32)[:, None], pool.ncached))
    new_ok = new * ok
    pool = pop(batch.num_usable_blocks, pool, new_ok[:, None], r[:, None], hits[:, None])
    upto = floor_div(torch.minimum(comp + n, ntok), bsf)
    pool = cache(batch.block_hashes, pool, (upto[:, None] * onehot).to(I32), torch.zeros_like(a.run_pos),
                 ranked=True)
    w.pool = pool
    w.free = free - (evictable + new) * ok
    n_ok = (n * ok).to(I32)
    w.grant = w.grant.clone()
    w.grant[rows, r] += n_ok
    w.held = w.held.clone()
    w.held[rows, r] = torch.where(ok, (hits + new).to(I32), w.held[rows, r])
    w.ncomp = w.ncomp.clone()
    w.ncomp[rows, r] = torch.where(ok, comp.to(I32), w.ncomp[rows, r])
    a.hit_tokens[rows, r] = torch.where(ok, comp.to(I32), a.hit_tokens[rows, r])
    kind = (2 - ((status[rows, r] == WAITING) | batch.resumed_as_new[rows]).to(I8)).to(I8)  # 1 new, 2 resumed
    a.admitted[rows, r] = torch.where(ok, kind, a.admitted[rows, r])
    a.run_pos = a.run_pos.clone()
    a.run_pos[rows, r] = torch.where(ok, state.next_run_pos + a.nrun - num_running, a.run_pos[rows, r])
    status = status.clone()
    status[rows, r] = torch.where(ok, torch.tensor(RUNNING, dtype=I8, device=dev), status[rows, r])
    w.status = status
    w.budget = budget - n * ok
    a.nrun = a.nrun + ok
    return ok


def fake_model(batch: Batch, state: State, decision: Decision) -> tuple[torch.Tensor, torch.Tensor]:
    """formats.md's model, after the advance: a scheduled request whose prefill is
    complete samples one token, EOS when it is its output_len-th output token.
    Returns (sampled, eos) masks (S, R)."""
    num_tokens = batch.num_prompt_tokens + state.num_output_tokens
    sampled = (decision.num_scheduled_tokens > 0) & (state.num_computed_tokens >= num_tokens)
    eos = sampled & (batch.output_len == state.num_output_tokens + 1)
    return sampled, eos


def update(batch: Batch, state: State, sampled: torch.Tensor, eos: torch.Tensor, step) -> State:
    """update_from_output (S:2301-2618) with one token per sampling request:
    append it, then check_stop (U:98): EOS first, then length."""
    sampled = sampled & _live(state.status)  # output of a finished request is ignored
    return _append_and_stop(batch, state, sampled, eos, step)


def _append_and_stop(batch: Batch, state: State, sampled: torch.Tensor, eos: torch.Tensor, step) -> State:
    """`update` for `sampled` requests that are all live."""
    num_output = state.num_output_tokens + sampled
    step_t = torch.as_tensor(step, dtype=I32, device=sampled.device)
    first = state.first_token_step
    first = first + (step_t - first) * (sampled & (first < 0))  # a select by arithmetic, as in `finish`
    state = replace(state, num_output_tokens=num_output, first_token_step=first)
    stopped, length = check_stop(batch, sampled, eos, num_output)
    # The stopped requests free their blocks in scheduled (running) order (S:2607-2618).
    return finish(batch, state, stopped, length.to(I8) + STOPPED, step, state.run_pos)


def check_stop(batch: Batch, sampled: torch.Tensor, eos: torch.Tensor, num_output: torch.Tensor):
    """check_stop (U:98-140) after one appended token per `sampled` request: EOS
    first (FINISHED_STOPPED), then length (num_tokens >= L or max_tokens
    outputs: FINISHED_LENGTH_CAPPED).  Returns (stopped, length) masks."""
    L = batch.max_model_len.to(I32)[:, None]  # <= 2**30 (gpu/limits.py)
    length = sampled & ~eos & (ge(batch.num_prompt_tokens + num_output, L) | ge(num_output, batch.max_tokens))
    assert LENGTH_CAPPED == STOPPED + 1
    return (sampled & eos) | length, length


def aborts_and_arrivals(batch: Batch, state: State, step: int, active: torch.Tensor, aborts: bool,
                        arrivals: bool):
    """formats.md's engine step k, parts 1 and 2, for the scenarios in `active`:
    (state, aborted).  False `aborts` / `arrivals`: none at this step anywhere."""
    act = active[:, None]
    if aborts:
        state, aborted = abort(batch, state, (batch.abort_step == step) & act, step)
    else:
        aborted = torch.zeros_like(batch.valid)
    if arrivals:
        state = arrive(batch, state, (batch.arrival_step == step) & act & batch.valid)
    return state, aborted


def engine_step(batch: Batch, state: State, step: int, active: torch.Tensor,
                aborts: bool = True, arrivals: bool = True):
    """formats.md's engine step k for the scenarios in `active`: aborts, arrivals,
    schedule, fake model, update.  Returns (state, decision, aborted, sampled).
    `aborts` / `arrivals` False: the caller knows no scenario has any at this step."""
    state, aborted = aborts_and_arrivals(batch, state, step, active, aborts, arrivals)
    decision, state = schedule(batch, state, active)
    sampled, eos = fake_model(batch, state, decision)
    # fake_model samples only scheduled, hence running, requests: no liveness check
    state = _append_and_stop(batch, state, sampled, eos, step)
    return state, decision, aborted, sampled


def deliver(batch: Batch, state: State, grant: torch.Tensor, tokens: torch.Tensor, eos: torch.Tensor,
            key: torch.Tensor, step) -> tuple[State, torch.Tensor, torch.Tensor]:
    """update_from_output (S:2301-2618) of a batch that may be older than the
    last schedule() (async), given as its grants (S, R), the requests that got a
    token (`tokens`, one each; `eos`: that token is EOS) and its grant order `key`.
    Returns the state, the requests that got their token and those it stopped.

    Per granted request still live (a finished or aborted one is passed over,
    S:2373-2381): its tokens leave flight (S:2362); with stale output (a
    preemption since, docs/rules.md §9.3) they leave the stale count too and the token is
    appended with no other change (S:2362-2369); otherwise a returned token
    replaces a placeholder (S:2902-2904) and, if the request is RUNNING, hashes
    the blocks now full up to ncomp - in_flight, the tokens whose output has
    returned (S:2454-2471).  Then check_stop (EOS, then length, U:98-140); the
    stopped requests free their blocks in grant order (S:2607-2618).  With one
    token per request nothing is discarded after a stop (S:2891-2898)."""
    live = _live(state.status)
    mine = gt(grant, 0) & live
    tokens = tokens & mine
    was_stale = mine & gt(state.stale, 0)
    fresh = tokens & ~was_stale
    had_ph = gt(state.ph, 0)
    inflight = state.inflight - grant * mine
    was_running = eq(state.status, RUNNING)
    state = replace(state, inflight=inflight, stale=state.stale - grant * was_stale,
                    ph=state.ph - (fresh & had_ph).to(I32))
    num_output = state.num_output_tokens + tokens
    step_t = torch.as_tensor(step, dtype=I32, device=grant.device)
    first = state.first_token_step
    first = first + (step_t - first) * (tokens & lt(first, 0))
    state = replace(state, num_output_tokens=num_output, first_token_step=first)
    hashing = fresh & had_ph & was_running
    if state.pool is not None and _any(hashing):
        known = batch.num_prompt_tokens + num_output
        upto = floor_div(torch.minimum(state.num_computed_tokens - inflight, known), batch.block_size_f[:, None])
        # blocks are cached in grant order (`key`)
        state = replace(state, pool=cache(batch.block_hashes, state.pool, upto * hashing, key))
    stopped, length = check_stop(batch, tokens, eos, num_output)
    return finish(batch, state, stopped, length.to(I8) + STOPPED, step, key), tokens, stopped


def engine_step_async(batch: Batch, state: State, step: int, active: torch.Tensor,
                      aborts: bool = True, arrivals: bool = True):
    """The engine step of a batch with async scheduling (formats.md "Engine step k
    with async_scheduling", EngineCore.step_with_batch_queue, E:758-871, with a
    queue of two batches, V:560-566), for every scenario of it at once; the
    synchronous scenarios of the batch apply their batch in the step that
    scheduled it, as `engine_step` does.

    Async, per scenario: schedule() runs when the scheduler has requests (live
    ones, or ids finished since the last schedule()); the batch it makes (even an
    empty one) joins the batch in flight.  If that makes two, the older one is
    applied; if it is alone, it stays in flight when it has tokens or requests
    are left, else it is applied now.  When schedule() is not called, the batch
    in flight, if any, is applied.  The fake model's choice of who samples is
    fixed at schedule time (not mid-prefill), the token itself (EOS or not) when
    applied.

    Returns (state, decision, aborted, sampled, stopped, called, applied_step,
    applied_key): `sampled` and `stopped` are of the batch applied, `applied_step`
    (S,) its step or -1 when none was applied, `applied_key` its grant order."""
    state, aborted = aborts_and_arrivals(batch, state, step, active, aborts, arrivals)
    is_async = batch.async_sched
    live_any = any_rows(_live(state.status))  # has_requests() after schedule() (no finish there)
    called = active & (~is_async | live_any | state.fin_flag)
    decision, state = schedule(batch, state, called)
    state = replace(state, fin_flag=state.fin_flag & ~called)  # schedule() flushes finished ids (S:1930)
    grant = decision.num_scheduled_tokens
    tokens = any_rows(gt(grant, 0))
    old = state.pend_valid & active  # a batch in flight from an earlier step
    new_now = active & (~is_async | (~old & called & ~(tokens | live_any)))
    applied = old | new_now
    stays = is_async & called & (old | tokens | live_any)
    o, n = old[:, None], new_now[:, None]
    # The int32 grants are selected by arithmetic on the (S, 1) masks, twice as
    # fast as torch.where on the CPU: `old` and `new_now` never hold together
    # (new_now needs ~old in an async scenario, and a synchronous one never
    # keeps a batch in flight).  The int64 keys: torch.where, which is faster
    # there (73 against 176 µs at (2048, 32)).
    app_grant = state.pend_grant * o + grant * n
    app_sample = both(state.pend_sample, o) | both(decision.sample, n)
    app_key = torch.where(o, state.pend_key, state.run_pos)
    applied_step = torch.where(old, state.pend_step, torch.where(applied, step, -1).to(I32))
    s = stays[:, None]
    state = replace(state, pend_grant=grant * s, pend_sample=both(decision.sample, s),
                    pend_key=state.run_pos * s, pend_valid=stays,
                    pend_step=torch.full_like(state.pend_step, step))
    eos = app_sample & eq(batch.output_len, state.num_output_tokens + 1)
    state, sampled, stopped = deliver(batch, state, app_grant, app_sample, eos, app_key, step)
    return state, decision, aborted, sampled, stopped, called, applied_step, app_key


def pending(batch: Batch, state: State) -> torch.Tensor:
    """(S,) whether a scenario still has a request that has not finished."""
    return any_rows(batch.valid & le(state.status, PREEMPTED))
