"""vLLM 0.33.0's V1 scheduler, core scope, as functions from state to state.

S = vllm/v1/core/sched/scheduler.py, U = sched/utils.py, Q = sched/request_queue.py.
Scope: decoder-only generate model, one full-attention KV group, with or without
prefix caching (block_pool.py) and async scheduling (`AsyncScheduler`,
sched/async_scheduler.py: output placeholders); no speculative tokens,
connectors, encoder inputs, LoRA, pause or DP throttling.  Where those would
act, a comment marks the seam.

Each public function takes a `SchedulerState` and returns a new one; the local
lists and dicts inside `schedule()` are its working copy, as vLLM's own loop
mutates its queues in place.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Iterable, Mapping, Sequence

from .block_pool import PoolWork
from .config import PRIORITY, ConfigError
from .kv_cache import allocate_slots, cdiv
from .request import EOS_TOKEN_ID, Request, RequestStatus
from .state import SchedulerOutput, SchedulerState


def _enqueue(policy: str, waiting: deque[str], requests: Mapping[str, Request], rid: str, front: bool) -> None:
    """FCFS: a deque, `front` for preempted requests (Q:92-95).  PRIORITY: a heap,
    where prepending is a plain push (Q:159-164); kept here as a sorted list, which
    is the heap's pop order."""
    if policy == PRIORITY:
        key = requests[rid].queue_key
        waiting.insert(bisect.bisect_left(waiting, key, key=lambda w: requests[w].queue_key), rid)
    elif front:
        waiting.appendleft(rid)
    else:
        waiting.append(rid)


def add_request(state: SchedulerState, request: Request) -> SchedulerState:
    """A new request joins the waiting queue (S:2931-2962).

    Contracts (PEP 316, checked by CrossHair: tests/test_crosshair.py):
    pre: len(state.waiting) <= 3 and all(w in state.requests for w in state.waiting)
    pre: request.request_id not in state.requests
    post: len(__return__.waiting) == len(state.waiting) + 1 and set(__return__.waiting) == set(state.waiting) | {request.request_id}
    post: __return__.requests[request.request_id] is request and len(__return__.requests) == len(state.requests) + 1
    post: __return__.running == state.running and __return__.num_free_blocks == state.num_free_blocks and __return__.req_to_num_blocks == state.req_to_num_blocks
    """
    if request.request_id in state.requests:
        raise ConfigError("id", f"duplicate request id {request.request_id!r}")
    requests = {**state.requests, request.request_id: request}
    waiting = list(state.waiting)
    if state.config.policy == PRIORITY:
        _enqueue(PRIORITY, waiting, requests, request.request_id, front=False)
    else:
        waiting.append(request.request_id)
    return SchedulerState(state.config, requests, state.running, tuple(waiting),
                          state.req_to_num_blocks, state.num_free_blocks, state.block_pool,
                          state.finished_req_ids)


def schedule(state: SchedulerState) -> tuple[SchedulerOutput, SchedulerState]:
    """One `Scheduler.schedule()` (S:699-1784) followed by `_update_after_schedule`
    (S:1845-1877), which advances num_computed_tokens optimistically.

    Contracts (PEP 316, checked by CrossHair: tests/test_crosshair.py); the
    preconditions are the state invariant on a small state:
    pre: len(state.requests) <= 3 and state.num_free_blocks >= 0 and 1 <= state.config.block_size <= 4 and state.config.max_model_len <= 32
    pre: all(k in state.requests for k in state.running + state.waiting) and len(set(state.running + state.waiting)) == len(state.running + state.waiting)
    pre: all(0 <= r.num_computed_tokens < r.num_tokens < state.config.max_model_len for r in state.requests.values()) and all(v >= 0 for v in state.req_to_num_blocks.values())
    pre: 1 <= state.config.token_budget <= 16 and 1 <= state.config.max_num_batched_tokens <= 16 and len(state.running) <= state.config.max_num_active_reqs <= state.config.max_num_seqs and state.config.policy in ("fcfs", "priority")
    pre: 0.0 <= state.config.watermark < 1.0 and 1 <= state.config.num_gpu_blocks <= 64
    post: __return__[0].total_num_scheduled_tokens <= min(state.config.token_budget, state.config.max_num_batched_tokens)
    post: all(n >= 1 for _, n in __return__[0].num_scheduled_tokens) and len(__return__[0].scheduled) == len(__return__[0].num_scheduled_tokens)
    post: __return__[1].num_free_blocks >= 0 and (state.block_pool is not None or __return__[1].num_free_blocks + sum(__return__[1].req_to_num_blocks.values()) == state.num_free_blocks + sum(state.req_to_num_blocks.values()))
    post: len(__return__[1].running) <= state.config.max_num_active_reqs and (not __return__[0].preempted_req_ids or not __return__[0].admitted)
    post: sorted(__return__[1].running + __return__[1].waiting) == sorted(state.running + state.waiting)
    """
    c = state.config
    reqs = dict(state.requests)
    running = list(state.running)
    waiting = deque(state.waiting)
    blocks = dict(state.req_to_num_blocks)
    free = state.num_free_blocks
    pool = PoolWork(state.block_pool) if state.block_pool is not None else None

    scheduled: dict[str, int] = {}  # insertion order is grant order
    scheduled_running: list[str] = []
    new: list[str] = []
    resumed: list[str] = []
    preempted: list[str] = []
    prefix_hits: list[tuple[str, int]] = []

    token_budget = c.token_budget  # S:716
    input_budget = c.max_num_batched_tokens  # S:719; draft_slots = 0 without spec decoding
    # R only: the long-prefill cap applies when more than one request is eligible (S:752-758).
    num_eligible = len(running) + len(waiting)
    threshold = c.long_prefill_token_threshold if num_eligible > 1 else 0

    def allocate(rid: str, n: int, hits: Sequence[int] = (), **gates) -> bool:
        """allocate_slots (K:380-627): the count rule, then, with prefix caching,
        the blocks themselves: touch the hits, pop new blocks, hash the full ones."""
        nonlocal free
        r = reqs[rid]
        need = allocate_slots(c, r, n, blocks.get(rid, 0), free, num_hit_blocks=len(hits),
                              num_new_computed_tokens=len(hits) * c.block_size,
                              num_evictable_hit_blocks=pool.num_evictable(hits) if pool else 0, **gates)
        if need is None:
            return False
        if pool is None:
            blocks[rid] = blocks.get(rid, 0) + need
            free -= need
            return True
        if hits:
            pool.add_hits(rid, hits)
        total = min(r.num_computed_tokens + len(hits) * c.block_size, c.max_model_len)
        num_slots = min(total + n, c.max_model_len)
        pool.allocate_new_blocks(rid, max(cdiv(num_slots, c.block_size) - len(pool.req_to_blocks.get(rid, ())), 0))
        pool.cache_blocks(rid, r.block_hashes, min(total + n, r.num_tokens), c.block_size)
        blocks[rid] = len(pool.req_to_blocks[rid])
        free = pool.num_free_blocks
        return True

    def preempt(victim: str) -> None:
        """S:1799-1843: free the blocks, reset progress, back to waiting.  Async: the
        victim's in-flight output becomes stale; it is still delivered later."""
        nonlocal free
        if pool is None:
            free += blocks.pop(victim, 0)
        else:
            pool.free(victim)
            blocks.pop(victim, None)
            free = pool.num_free_blocks
        r = reqs[victim]
        reqs[victim] = r.evolve(status=RequestStatus.PREEMPTED, num_computed_tokens=0,
                                num_preemptions=r.num_preemptions + 1,
                                num_stale_output_tokens=r.num_in_flight_tokens,
                                num_output_placeholders=0)
        _enqueue(c.policy, waiting, reqs, victim, front=True)
        preempted.append(victim)

    # The running loop (S:793-1036).  The budget test is the loop condition (S:795).
    i = 0
    while i < len(running) and token_budget > 0:
        rid = running[i]
        r = reqs[rid]
        if input_budget <= 0:  # S:797: input_budget <= draft_slots
            break
        # Async: the last token max_tokens allows is already in flight (S:800-812).
        if (r.num_output_placeholders > 0 and r.num_computed_tokens + 2 - r.num_output_placeholders
                >= r.num_prompt_tokens + r.max_tokens):
            i += 1
            continue
        # [seams: PP cadence, deferred prefill, EC pending (S:814-837)]
        n = r.num_tokens + r.num_output_placeholders - r.num_computed_tokens  # S:839 (no spec tokens)
        if 0 < threshold < n:  # cap 1 (S:844)
            n = threshold
        n = min(n, token_budget, input_budget)  # cap 2 (S:846)
        n = min(n, c.max_model_len - r.num_computed_tokens - 1)  # cap 3 (S:852); 1 sampled token
        # [seams: mamba alignment, encoder budget, MTP lookahead (S:860-889)]
        if n == 0:  # S:891-909: skip, do not stop the scan
            i += 1
            continue
        while True:  # S:912-980
            ok = allocate(rid, n)
            if ok:
                break
            # [seam: connector with pending block frees (S:925)]
            if c.policy == PRIORITY:
                # The lowest-priority running request, first in running order on a tie,
                # possibly already scheduled this step or `r` itself (S:940-969).
                victim = max(running, key=lambda x: reqs[x].priority_key)
                v = running.index(victim)
                del running[v]
                if v < i:  # the cursor fix #49206 (S:948)
                    i -= 1
                if victim in scheduled:  # refund its grant (S:951-957)
                    refund = scheduled.pop(victim)
                    scheduled_running.remove(victim)
                    token_budget += refund
                    input_budget += refund
            else:
                victim = running.pop()  # FCFS: the tail (S:971)
            preempt(victim)
            if victim == rid:
                break
        if not ok:
            if c.policy == PRIORITY and reqs[rid].status == RequestStatus.PREEMPTED:
                continue  # R: self-preempted; `i` already points at the next one (S:982-992)
            break
        scheduled[rid] = n
        scheduled_running.append(rid)
        token_budget -= n
        input_budget -= n
        i += 1

    # The waiting loop (S:1050-1614), skipped entirely after any preemption (S:1050).
    skipped: list[str] = []
    if not preempted:
        while token_budget > 0:  # S:1062
            if not waiting or input_budget <= 0:  # S:1068
                break
            if len(running) >= c.max_num_active_reqs:  # the run-slot check (S:1071-1073)
                break
            rid = waiting[0]
            r = reqs[rid]
            # [seams: blocked statuses, LoRA (S:1075-1100)]
            if r.num_stale_output_tokens > 0:
                # Async: its output from before the preemption is still in flight;
                # resuming now could resample a position that output delivers (S:1084).
                skipped.append(waiting.popleft())
                continue
            hits: list[int] = []
            if pool is not None and r.num_computed_tokens == 0:  # S:1107-1130
                hits = pool.get_computed_blocks(r.block_hashes, r.num_tokens, c.block_size)
            # [seam: connector hits]
            num_computed_tokens = r.num_computed_tokens + len(hits) * c.block_size
            request_token_budget = min(token_budget, input_budget)  # S:1305
            # num_tokens, not num_prompt_tokens: a resumed request replays its outputs (S:1315).
            n = r.num_tokens - num_computed_tokens
            if 0 < threshold < n:  # S:1337
                n = threshold
            if not c.enable_chunked_prefill and n > request_token_budget:
                break  # chunked prefill off: the whole request must fit, else stop admission (S:1342)
            n = min(n, request_token_budget)  # S:1345; asserted > 0, so R's `n == 0` skip
            # (S:1386) is unreachable in this scope.
            if not allocate(rid, n, hits,
                            full_sequence_must_fit=c.scheduler_reserve_full_isl,  # S:1446
                            has_scheduled_reqs=bool(running)):  # S:1448
                break  # admission never preempts (S:1451-1458)
            waiting.popleft()
            running.append(rid)
            (new if r.status == RequestStatus.WAITING else resumed).append(rid)
            if pool is not None:
                prefix_hits.append((rid, num_computed_tokens))
            scheduled[rid] = n
            token_budget -= n
            input_budget -= n
            reqs[rid] = r.evolve(status=RequestStatus.RUNNING, num_computed_tokens=num_computed_tokens)
        # Skipped requests go back to the front, in their order (S:1606-1610).
        waiting.extendleft(reversed(skipped))

    assert token_budget >= 0 and input_budget >= 0  # S:1629-1630
    assert len(running) <= c.max_num_seqs  # S:1631

    # _update_after_schedule: the optimistic advance (S:1845-1877); AsyncScheduler
    # then adds one output placeholder per request that is not mid-prefill
    # (async_scheduler.py:24-56).
    for rid, n in scheduled.items():
        r = reqs[rid]
        ncomp = r.num_computed_tokens + n
        chunk = ncomp < r.num_tokens + r.num_output_placeholders
        placeholders = r.num_output_placeholders + (1 if c.async_scheduling and not chunk else 0)
        reqs[rid] = r.evolve(num_computed_tokens=ncomp, num_in_flight_tokens=r.num_in_flight_tokens + n,
                             is_prefill_chunk=chunk, num_output_placeholders=placeholders)

    output = SchedulerOutput(
        num_scheduled_tokens=tuple(scheduled.items()),
        scheduled_new_reqs=tuple(new),
        scheduled_resumed_reqs=tuple(resumed),
        scheduled_running_reqs=tuple(scheduled_running),
        preempted_req_ids=tuple(preempted),
        prefix_hits=tuple(prefix_hits),
    )
    return output, SchedulerState(c, reqs, tuple(running), tuple(waiting), blocks, free,
                                  pool.freeze() if pool is not None else None)


def check_stop(request: Request, last_token_id: int, max_model_len: int) -> RequestStatus | None:
    """The finished status after appending `last_token_id`, or None (U:98-140).
    0.33.0's order: EOS, then stop tokens (none here), then length."""
    if last_token_id == EOS_TOKEN_ID:
        return RequestStatus.FINISHED_STOPPED
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    # [seams: min_tokens, repetition detection]
    return None


def _without(state: SchedulerState, reqs: Mapping[str, Request], done: Sequence[str],
             pool: PoolWork | None = None) -> SchedulerState:
    """`state` with requests `reqs`, less the finished requests `done`, whose blocks
    go back to the pool in that order (S:3031-3061)."""
    if pool is None and state.block_pool is not None:
        pool = PoolWork(state.block_pool)
    blocks = dict(state.req_to_num_blocks)
    free = state.num_free_blocks
    for rid in done:
        if pool is not None:
            pool.free(rid)
        free += blocks.pop(rid, 0)
    gone = set(done)
    return SchedulerState(
        state.config,
        {k: v for k, v in reqs.items() if k not in gone},
        tuple(x for x in state.running if x not in gone),
        tuple(x for x in state.waiting if x not in gone),
        blocks,
        pool.num_free_blocks if pool is not None else free,
        pool.freeze() if pool is not None else None,
        state.finished_req_ids + tuple(done),
    )


def update_from_output(
    state: SchedulerState,
    output: SchedulerOutput,
    sampled_token_ids: Mapping[str, Sequence[int]],
) -> tuple[tuple[tuple[str, RequestStatus], ...], SchedulerState]:
    """Append sampled tokens, stop requests, free their blocks (S:2259-2551).

    Returns the requests finished, in scheduled order, with their status.  Under
    async scheduling `output` may be an older batch: outputs of requests finished
    meanwhile are dropped, and those of requests preempted meanwhile are stale:
    appended (and able to finish the request while it waits) but leaving
    num_computed_tokens and the placeholders alone (S:2316-2338, 2745-2770).

    Contracts (PEP 316, checked by CrossHair: tests/test_crosshair.py):
    pre: len(state.requests) <= 2 and len(state.req_to_num_blocks) <= 2 and state.config.max_model_len <= 32
    pre: all(len(v) <= 2 for v in sampled_token_ids.values()) and len(output.num_scheduled_tokens) <= 2 and state.block_pool is None
    post: {rid for rid, _ in __return__[0]} <= {rid for rid, _ in output.num_scheduled_tokens} and all(st.is_finished for _, st in __return__[0])
    post: set(__return__[1].requests) == set(state.requests) - {rid for rid, _ in __return__[0]}
    post: state.block_pool is not None or __return__[1].num_free_blocks + sum(__return__[1].req_to_num_blocks.values()) == state.num_free_blocks + sum(state.req_to_num_blocks.values())
    """
    c = state.config
    caching = state.block_pool is not None
    pool = PoolWork(state.block_pool) if caching else None
    reqs = dict(state.requests)
    finished: list[tuple[str, RequestStatus]] = []
    for rid, n in output.num_scheduled_tokens:
        r = reqs.get(rid)
        if r is None:  # finished or aborted meanwhile: its output is ignored (S:2322-2331)
            continue
        stale = r.num_stale_output_tokens > 0
        r = r.evolve(num_in_flight_tokens=r.num_in_flight_tokens - n,
                     num_stale_output_tokens=r.num_stale_output_tokens - n if stale else 0)
        tokens = list(sampled_token_ids.get(rid, ()))  # a non-final prefill chunk samples none
        status_before = r.status
        had_placeholders = r.num_output_placeholders > 0
        for k, token in enumerate(tokens, 1):
            r = r.with_output_token(token, c.block_size, caching)
            status = check_stop(r, token, c.max_model_len)
            if status is not None:
                # Discarded tokens past the stop roll num_computed_tokens back (S:2756-2762).
                if not stale:
                    r = r.evolve(num_computed_tokens=r.num_computed_tokens - (len(tokens) - k))
                r = r.evolve(status=status)
                finished.append((rid, status))
                break
        if tokens and not stale and r.num_output_placeholders > 0:
            r = r.evolve(num_output_placeholders=r.num_output_placeholders - len(tokens))
        if pool is not None and tokens and not stale and status_before == RequestStatus.RUNNING \
                and had_placeholders:
            # Async: blocks the returned token completes are hashed now (S:2407-2415).
            pool.cache_blocks(rid, r.block_hashes, r.num_computed_tokens - r.num_in_flight_tokens,
                              c.block_size)
        reqs[rid] = r
    # Stopped requests leave their queue once, at the end (S:2541-2551).
    return tuple(finished), _without(state, reqs, [rid for rid, _ in finished], pool)


def finish_requests(
    state: SchedulerState, request_ids: Iterable[str], finished_status: RequestStatus
) -> tuple[tuple[str, ...], SchedulerState]:
    """Finish requests from outside, e.g. an abort, from running or waiting
    (S:2964-3029).  Unknown and already-finished ids are ignored.

    Contracts (PEP 316, checked by CrossHair: tests/test_crosshair.py):
    pre: len(state.requests) <= 3 and len(state.running) + len(state.waiting) <= 3 and len(state.req_to_num_blocks) <= 3
    pre: finished_status.is_finished and len(request_ids) <= 3 and state.block_pool is None
    post: set(__return__[0]) == set(request_ids) & set(state.requests) and len(set(__return__[0])) == len(__return__[0])
    post: set(__return__[1].requests) == set(state.requests) - set(request_ids) and __return__[1].running == tuple(k for k in state.running if k not in __return__[0]) and __return__[1].waiting == tuple(k for k in state.waiting if k not in __return__[0])
    post: state.block_pool is not None or __return__[1].num_free_blocks == state.num_free_blocks + sum(state.req_to_num_blocks.get(k, 0) for k in __return__[0]) and sum(__return__[1].req_to_num_blocks.values()) + __return__[1].num_free_blocks == sum(state.req_to_num_blocks.values()) + state.num_free_blocks
    """
    assert finished_status.is_finished
    done: list[str] = []
    for rid in request_ids:
        if rid in state.requests and rid not in done:
            done.append(rid)
    return tuple(done), _without(state, state.requests, done)
