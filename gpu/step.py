"""One engine step of S scenarios at once: aborts, arrivals, schedule(), the fake
model of formats.md, update_from_output().  Written from the rule book
(v1-scheduler-rules.md, "R" = vLLM 0.33.0; S:839 = v1/core/sched/scheduler.py
line 839, K = kv_cache_manager.py), core scope: synchronous, no prefix caching.

Every function maps (Batch, State, ...) to new tensors; nothing loops over
scenarios or requests.  The one loop is in the running loop of `schedule`: one
pass per preemption (see there).

Budgets: vLLM keeps a token budget and an input budget (S:716-719).  Without
speculative decoding both start at their limits, both lose each grant and both
get each refund, and the loop tests both for > 0 and caps `n` by both, so they
act as one budget, `min(max_num_scheduled_tokens, max_num_batched_tokens)`,
here `budget`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .state import (ABORTED, I8, I32, I64, LENGTH_CAPPED, NOT_ARRIVED, PREEMPTED, RUNNING, STOPPED, WAITING,
                    Batch, Decision, State)

_INF = 2**62


def _cdiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a + b - 1) // b


def _live(status: torch.Tensor) -> torch.Tensor:
    """Arrived and not finished: WAITING, RUNNING or PREEMPTED."""
    return (status >= WAITING) & (status <= PREEMPTED)


def _in_waiting(status: torch.Tensor) -> torch.Tensor:
    return (status == WAITING) | (status == PREEMPTED)


def finish(state: State, mask: torch.Tensor, status: int | torch.Tensor, step) -> State:
    """Finish the requests in `mask` (S, R): their blocks go back to the pool
    and they leave running and waiting (their status says so)."""
    freed = torch.where(mask, state.num_blocks, 0).sum(1, dtype=I64)
    return replace(
        state,
        status=torch.where(mask, torch.as_tensor(status, dtype=I8, device=mask.device), state.status),
        num_blocks=torch.where(mask, 0, state.num_blocks),
        finish_step=torch.where(mask, torch.as_tensor(step, dtype=I32, device=mask.device), state.finish_step),
        num_free_blocks=state.num_free_blocks + freed,
    )


def abort(state: State, mask: torch.Tensor, step) -> tuple[State, torch.Tensor]:
    """finish_requests(..., FINISHED_ABORTED) (S:2964): waiting, running and
    preempted requests; an already finished one is left alone."""
    hit = mask & _live(state.status)
    return finish(state, hit, ABORTED, step), hit


def arrive(batch: Batch, state: State, mask: torch.Tensor) -> State:
    """add_request: WAITING at the back of the FCFS queue (slot index = arrival
    order) or at its heap place under PRIORITY (`queue_rank`, used directly)."""
    mask = mask & (state.status == NOT_ARRIVED)
    slot = torch.arange(mask.shape[1], device=mask.device, dtype=I64).expand_as(state.wait_key)
    return replace(state, status=torch.where(mask, WAITING, state.status).to(I8),
                   wait_key=torch.where(mask, slot, state.wait_key))


def _order(key: torch.Tensor, member: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots sorted by `key` with the members first; and how many members."""
    order = torch.argsort(torch.where(member, key, _INF), dim=1, stable=True)
    return order, member.sum(1)


def waiting_key(batch: Batch, state: State) -> torch.Tensor:
    """The waiting queue's pop order key: FCFS deque position, or heap rank."""
    return torch.where(batch.priority_policy[:, None], batch.queue_rank, state.wait_key)


def schedule(batch: Batch, state: State, active: torch.Tensor) -> tuple[Decision, State]:
    """Scheduler.schedule() (S:699-1784) then the optimistic advance of
    num_computed_tokens (S:1845-1872), for the scenarios in `active` (S,)."""
    S, R = batch.shape
    dev = batch.valid.device
    pos = torch.arange(R, device=dev)[None, :]
    status = state.status
    ncomp = state.num_computed_tokens.to(I64)
    num_tokens = (batch.num_prompt_tokens + state.num_output_tokens).to(I64)
    held = state.num_blocks.to(I64)
    L = batch.max_model_len[:, None]
    bs = batch.block_size[:, None]

    running = status == RUNNING
    # R: the long-prefill cap applies only with more than one eligible request,
    # counted once at the start (S:752-758).
    num_eligible = running.sum(1) + _in_waiting(status).sum(1)
    threshold = torch.where(num_eligible > 1, batch.long_prefill_token_threshold, 0)[:, None]
    budget = torch.where(active, batch.token_budget, 0)
    free = state.num_free_blocks.clone()

    grant = torch.zeros((S, R), dtype=I64, device=dev)
    preempt_order = torch.full((S, R), -1, dtype=I32, device=dev)
    num_preemptions = state.num_preemptions
    wait_key = state.wait_key
    next_front_key = state.next_front_key
    preempted = torch.zeros(S, dtype=torch.bool, device=dev)

    # ---- The running loop (S:793-1036). ----
    # One pass grants every running request from the cursor on, in running order:
    # request j gets min(its need, what the budget has left), i.e. the differences
    # of the prefix sums of the needs clipped at the budget.  Its blocks come out
    # of the pool in the same order; the first request whose blocks do not fit
    # (K:584) stops the pass: the grants before it stand, one victim is preempted
    # (S:912-980), and the next pass retries that request with the same n.  So
    # the loop runs once plus once per preemption in the step.
    cursor = torch.zeros(S, dtype=I64, device=dev)  # index into the running list
    retry_n = torch.zeros(S, dtype=I64, device=dev)  # n of the request at the cursor being retried
    loop_done = ~active | ~running.any(1)
    it = 0
    while True:
        todo = ~loop_done
        if not bool(todo.any()):
            break
        order, num_running = _order(state.run_pos, running)
        in_running = pos < num_running[:, None]
        o_ncomp = ncomp.gather(1, order)
        o_held = held.gather(1, order)
        need = num_tokens.gather(1, order) - o_ncomp  # S:839
        need = torch.where(threshold > 0, torch.minimum(need, threshold), need)  # cap 1 (S:844)
        need = torch.minimum(need, L - o_ncomp - 1)  # cap 3: room for the sampled token (S:852)
        ahead = in_running & (pos >= cursor[:, None]) & todo[:, None]
        need = torch.where(ahead, need, 0)
        at_cursor = pos == cursor[:, None]
        need = torch.where(at_cursor & (retry_n[:, None] > 0), retry_n[:, None], need)
        # cap 2, the budget (S:846): the loop also stops once it reaches 0 (S:795).
        cum = need.cumsum(1)
        b = budget[:, None]
        n = torch.minimum(cum, b) - torch.minimum(cum - need, b)
        # allocate_slots for a running request: no watermark, no full-ISL gate (K:518).
        blocks = torch.where(n > 0, (_cdiv(o_ncomp + n, bs) - o_held).clamp(min=0), 0)
        fails = (n > 0) & (blocks.cumsum(1) > free[:, None])
        has_fail = fails.any(1) & todo
        first_fail = torch.where(has_fail, fails.to(I8).argmax(1), R)
        keep = pos < first_fail[:, None]
        n_kept = torch.where(keep, n, 0)
        blocks_kept = torch.where(keep, blocks, 0)
        grant = grant + torch.zeros_like(grant).scatter_(1, order, n_kept)
        held = held + torch.zeros_like(held).scatter_(1, order, blocks_kept)
        budget = budget - n_kept.sum(1)
        free = free - blocks_kept.sum(1)
        loop_done = loop_done | (todo & ~has_fail)
        if not bool(has_fail.any()):
            break

        # One preemption in every scenario whose allocation failed.
        ff = first_fail.clamp(max=R - 1)
        retry = n.gather(1, ff[:, None])[:, 0]
        cursor = torch.where(has_fail, ff, cursor)
        # FCFS: the tail of running (S:971).  PRIORITY: the largest (priority,
        # arrival_time), the first in running order on a tie, from all of running,
        # so possibly already scheduled this step, or the request itself (S:940).
        victim_key = torch.where(in_running, batch.victim_rank.gather(1, order) * (R + 1) + (R - pos), -1)
        victim_pos = torch.where(batch.priority_policy, victim_key.argmax(1), (num_running - 1).clamp(min=0))
        victim = order.gather(1, victim_pos[:, None])[:, 0]
        self_preempt = victim_pos == ff
        # Removing a victim ahead of the cursor shifts the list left (the fix #49206, S:948).
        cursor = torch.where(has_fail & (victim_pos < cursor), cursor - 1, cursor)
        vmask = torch.zeros((S, R), dtype=torch.bool, device=dev).scatter_(1, victim[:, None], has_fail[:, None])
        # A victim already scheduled this step gives its grant back (S:951-957).
        budget = budget + torch.where(vmask, grant, 0).sum(1)
        grant = torch.where(vmask, 0, grant)
        # _preempt_request (S:1799-1843): free the blocks, restart from zero, to waiting.
        free = free + torch.where(vmask, held, 0).sum(1)
        held = torch.where(vmask, 0, held)
        ncomp = torch.where(vmask, 0, ncomp)
        status = torch.where(vmask, PREEMPTED, status).to(I8)
        running = status == RUNNING
        num_preemptions = num_preemptions + vmask.to(I32)
        # FCFS: the front of the waiting deque (Q:92-95); PRIORITY: a heap push,
        # whose place `waiting_key` reads from queue_rank.
        wait_key = torch.where(vmask, next_front_key[:, None], wait_key)
        next_front_key = next_front_key - has_fail.to(I64)
        preempt_order = torch.where(vmask, it, preempt_order)
        preempted = preempted | has_fail
        retry_n = torch.where(has_fail & ~self_preempt, retry, 0)
        # Self-preemption: FCFS breaks (the request was the tail, nothing follows);
        # PRIORITY continues with the request now at the cursor (R, S:982-992).
        loop_done = loop_done | (has_fail & self_preempt & ~batch.priority_policy)
        it += 1

    # ---- The waiting loop (S:1050-1614), skipped after any preemption (S:1050). ----
    in_wait = _in_waiting(status)
    if not bool((in_wait.any(1) & active & ~preempted).any()):  # nothing to admit anywhere
        ncomp = ncomp + grant
        num_running = running.sum(1)
        decision = Decision(num_scheduled_tokens=grant, admitted=torch.zeros_like(status),
                            preempt_order=preempt_order, num_running=num_running)
        return decision, replace(
            state, status=status, num_computed_tokens=ncomp.to(I32), num_preemptions=num_preemptions,
            num_blocks=held.to(I32), wait_key=wait_key, num_free_blocks=free, next_front_key=next_front_key)
    # Admission k (in queue order) is tried only if admissions 0..k-1 succeeded,
    # and any failure ends the loop, so the admitted requests are the longest
    # prefix of the queue whose conditions all hold, each evaluated with the
    # budget and pool left by the admissions before it (prefix sums again).
    worder, num_waiting = _order(waiting_key(batch, replace(state, wait_key=wait_key)), in_wait)
    num_running = running.sum(1)
    k = pos
    w_tokens = num_tokens.gather(1, worder)  # num_computed_tokens is 0: no prefix cache
    want = torch.where(threshold > 0, torch.minimum(w_tokens, threshold), w_tokens)  # S:1337
    want = torch.where(k < num_waiting[:, None], want, 0)
    cum = want.cumsum(1)
    b = budget[:, None]
    left = b - torch.minimum(cum - want, b)  # budget left when admission k is tried
    n = torch.minimum(want, left)  # S:1345
    ok = (k < num_waiting[:, None]) & (left > 0)  # S:1062, S:1068
    ok &= num_running[:, None] + k < batch.max_num_active_reqs[:, None]  # the run-slot check (S:1071)
    # chunked prefill off: the whole request must fit, else admission stops (S:1342).
    ok &= batch.enable_chunked_prefill[:, None] | (want <= left)
    blocks = _cdiv(n, bs)
    free_k = free[:, None] - (blocks.cumsum(1) - blocks)
    # The watermark: admissions only, not while running is empty (K:518-525).
    wm = torch.where(num_running[:, None] + k > 0, batch.watermark_blocks[:, None], 0)
    # The full-ISL gate: the whole sequence must fit (K:531-548).
    full = _cdiv(w_tokens, bs)
    ok &= ~batch.reserve_full_isl[:, None] | (full + wm <= free_k)
    ok &= blocks + wm <= free_k  # K:584
    ok &= (active & ~preempted)[:, None]
    admit = ok.to(I8).cumprod(1).bool()
    n_adm = torch.where(admit, n, 0)
    blocks_adm = torch.where(admit, blocks, 0)
    num_admitted = admit.sum(1)
    amask = torch.zeros_like(admit).scatter_(1, worder, admit)
    admitted = torch.where(amask, torch.where(status == WAITING, 1, 2), 0).to(I8)
    grant = grant + torch.zeros_like(grant).scatter_(1, worder, n_adm)
    held = held + torch.zeros_like(held).scatter_(1, worder, blocks_adm)
    free = free - blocks_adm.sum(1)
    run_pos_adm = torch.zeros_like(state.run_pos).scatter_(1, worder, state.next_run_pos[:, None] + k)
    run_pos = torch.where(amask, run_pos_adm, state.run_pos)
    status = torch.where(amask, RUNNING, status).to(I8)

    # _update_after_schedule: the optimistic advance (S:1857).
    ncomp = ncomp + grant
    decision = Decision(num_scheduled_tokens=grant, admitted=admitted, preempt_order=preempt_order,
                        num_running=num_running + num_admitted)
    return decision, replace(
        state, status=status, num_computed_tokens=ncomp.to(I32), num_preemptions=num_preemptions,
        num_blocks=held.to(I32), run_pos=run_pos, wait_key=wait_key, num_free_blocks=free,
        next_run_pos=state.next_run_pos + num_admitted, next_front_key=next_front_key)


def fake_model(batch: Batch, state: State, decision: Decision) -> tuple[torch.Tensor, torch.Tensor]:
    """formats.md's model, after the advance: a scheduled request whose prefill is
    complete samples one token, EOS when it is its output_len-th output token.
    Returns (sampled, eos) masks (S, R)."""
    num_tokens = batch.num_prompt_tokens + state.num_output_tokens
    sampled = (decision.num_scheduled_tokens > 0) & (state.num_computed_tokens >= num_tokens)
    eos = sampled & (batch.output_len == state.num_output_tokens + 1)
    return sampled, eos


def update(batch: Batch, state: State, sampled: torch.Tensor, eos: torch.Tensor, step) -> State:
    """update_from_output (S:2259-2551) with one token per sampling request:
    append it, then check_stop (U:98): EOS first, then length."""
    sampled = sampled & _live(state.status)  # output of a finished request is ignored
    num_output = state.num_output_tokens + sampled.to(I32)
    step_t = torch.as_tensor(step, dtype=I32, device=sampled.device)
    first = torch.where(sampled & (state.first_token_step < 0), step_t, state.first_token_step)
    state = replace(state, num_output_tokens=num_output, first_token_step=first)
    length = sampled & ~eos & ((batch.num_prompt_tokens + num_output >= batch.max_model_len[:, None])
                               | (num_output >= batch.max_tokens))
    return finish(state, (sampled & eos) | length, torch.where(length, LENGTH_CAPPED, STOPPED).to(I8), step)


def engine_step(batch: Batch, state: State, step: int, active: torch.Tensor,
                aborts: bool = True, arrivals: bool = True):
    """formats.md's engine step k for the scenarios in `active`: aborts, arrivals,
    schedule, fake model, update.  Returns (state, decision, aborted, sampled).
    `aborts` / `arrivals` False: the caller knows no scenario has any at this step."""
    act = active[:, None]
    if aborts:
        state, aborted = abort(state, (batch.abort_step == step) & act, step)
    else:
        aborted = torch.zeros_like(batch.valid)
    if arrivals:
        state = arrive(batch, state, (batch.arrival_step == step) & act & batch.valid)
    decision, state = schedule(batch, state, active)
    sampled, eos = fake_model(batch, state, decision)
    state = update(batch, state, sampled, eos, step)
    return state, decision, aborted, sampled


def pending(batch: Batch, state: State) -> torch.Tensor:
    """(S,) whether a scenario still has a request that has not finished."""
    return (batch.valid & (state.status <= PREEMPTED)).any(1)
