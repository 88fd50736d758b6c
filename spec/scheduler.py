"""vLLM 0.33.0's V1 scheduler, core scope, as functions from state to state.

S = vllm/v1/core/sched/scheduler.py, U = sched/utils.py, Q = sched/request_queue.py.
Core scope: decoder-only generate model, one full-attention KV group, synchronous
scheduling, no prefix caching, speculative tokens, connectors, encoder inputs,
LoRA, pause or DP throttling.  Where those would act, a comment marks the seam.

Each public function takes a `SchedulerState` and returns a new one; the local
lists and dicts inside `schedule()` are its working copy, as vLLM's own loop
mutates its queues in place.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Iterable, Mapping, Sequence

from .config import PRIORITY, ConfigError
from .kv_cache import allocate_slots
from .request import EOS_TOKEN_ID, Request, RequestStatus
from .state import SchedulerOutput, SchedulerState


def _enqueue(policy: str, waiting: deque[str], requests: Mapping[str, Request], rid: str, front: bool) -> None:
    """FCFS: a deque, `front` for preempted requests (Q:92-95).  PRIORITY: a heap,
    where prepending is a plain push (Q:159-164); kept here as a sorted list, which
    is the heap's pop order."""
    if policy == PRIORITY:
        keys = [requests[w].queue_key for w in waiting]
        waiting.insert(bisect.bisect_left(keys, requests[rid].queue_key), rid)
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
    waiting = deque(state.waiting)
    _enqueue(state.config.policy, waiting, requests, request.request_id, front=False)
    return SchedulerState(state.config, requests, state.running, tuple(waiting),
                          state.req_to_num_blocks, state.num_free_blocks)


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
    post: __return__[1].num_free_blocks >= 0 and __return__[1].num_free_blocks + sum(__return__[1].req_to_num_blocks.values()) == state.num_free_blocks + sum(state.req_to_num_blocks.values())
    post: len(__return__[1].running) <= state.config.max_num_active_reqs and (not __return__[0].preempted_req_ids or not __return__[0].admitted)
    post: sorted(__return__[1].running + __return__[1].waiting) == sorted(state.running + state.waiting)
    """
    c = state.config
    reqs = dict(state.requests)
    running = list(state.running)
    waiting = deque(state.waiting)
    blocks = dict(state.req_to_num_blocks)
    free = state.num_free_blocks

    scheduled: dict[str, int] = {}  # insertion order is grant order
    scheduled_running: list[str] = []
    new: list[str] = []
    resumed: list[str] = []
    preempted: list[str] = []

    token_budget = c.token_budget  # S:716
    input_budget = c.max_num_batched_tokens  # S:719; draft_slots = 0 without spec decoding
    # R only: the long-prefill cap applies when more than one request is eligible (S:752-758).
    num_eligible = len(running) + len(waiting)
    threshold = c.long_prefill_token_threshold if num_eligible > 1 else 0

    def preempt(victim: str) -> None:
        """S:1799-1843: free the blocks, reset progress, back to waiting."""
        nonlocal free
        free += blocks.pop(victim, 0)
        r = reqs[victim]
        reqs[victim] = r.evolve(status=RequestStatus.PREEMPTED, num_computed_tokens=0,
                                num_preemptions=r.num_preemptions + 1)
        _enqueue(c.policy, waiting, reqs, victim, front=True)
        preempted.append(victim)

    # The running loop (S:793-1036).  The budget test is the loop condition (S:795).
    i = 0
    while i < len(running) and token_budget > 0:
        rid = running[i]
        r = reqs[rid]
        if input_budget <= 0:  # S:797: input_budget <= draft_slots
            break
        # [seams: async max_tokens guard, PP cadence, deferred prefill, EC pending (S:800-837)]
        n = r.num_tokens - r.num_computed_tokens  # S:839 (no spec tokens, no placeholders)
        if 0 < threshold < n:  # cap 1 (S:844)
            n = threshold
        n = min(n, token_budget, input_budget)  # cap 2 (S:846)
        n = min(n, c.max_model_len - r.num_computed_tokens - 1)  # cap 3 (S:852); 1 sampled token
        # [seams: mamba alignment, encoder budget, MTP lookahead (S:860-889)]
        if n == 0:  # S:891-909: skip, do not stop the scan
            i += 1
            continue
        while True:  # S:912-980
            new_blocks = allocate_slots(c, r, n, blocks.get(rid, 0), free)
            if new_blocks is not None:
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
        if new_blocks is None:
            if c.policy == PRIORITY and reqs[rid].status == RequestStatus.PREEMPTED:
                continue  # R: self-preempted; `i` already points at the next one (S:982-992)
            break
        blocks[rid] = blocks.get(rid, 0) + new_blocks
        free -= new_blocks
        scheduled[rid] = n
        scheduled_running.append(rid)
        token_budget -= n
        input_budget -= n
        i += 1

    # The waiting loop (S:1050-1614), skipped entirely after any preemption (S:1050).
    if not preempted:
        while token_budget > 0:  # S:1062
            if not waiting or input_budget <= 0:  # S:1068
                break
            if len(running) >= c.max_num_active_reqs:  # the run-slot check (S:1071-1073)
                break
            rid = waiting[0]
            r = reqs[rid]
            # [seams: blocked statuses, stale async output, LoRA, prefix-cache and
            #  connector hits (S:1075-1300); without them the hit is 0 tokens]
            num_computed_tokens = r.num_computed_tokens
            request_token_budget = min(token_budget, input_budget)  # S:1305
            # num_tokens, not num_prompt_tokens: a resumed request replays its outputs (S:1315).
            n = r.num_tokens - num_computed_tokens
            if 0 < threshold < n:  # S:1337
                n = threshold
            if not c.enable_chunked_prefill and n > request_token_budget:
                break  # chunked prefill off: the whole request must fit, else stop admission (S:1342)
            n = min(n, request_token_budget)  # S:1345; asserted > 0, so R's `n == 0` skip
            # (S:1386) is unreachable in the core scope.
            new_blocks = allocate_slots(
                c, r, n, blocks.get(rid, 0), free,
                full_sequence_must_fit=c.scheduler_reserve_full_isl,  # S:1446
                has_scheduled_reqs=bool(running),  # S:1448
            )
            if new_blocks is None:
                break  # admission never preempts (S:1451-1458)
            waiting.popleft()
            running.append(rid)
            (new if r.status == RequestStatus.WAITING else resumed).append(rid)
            blocks[rid] = blocks.get(rid, 0) + new_blocks
            free -= new_blocks
            scheduled[rid] = n
            token_budget -= n
            input_budget -= n
            reqs[rid] = r.evolve(status=RequestStatus.RUNNING, num_computed_tokens=num_computed_tokens)

    assert token_budget >= 0 and input_budget >= 0  # S:1629-1630
    assert len(running) <= c.max_num_seqs  # S:1631

    # _update_after_schedule: the optimistic advance (S:1857-1860).
    for rid, n in scheduled.items():
        r = reqs[rid]
        reqs[rid] = r.evolve(num_computed_tokens=r.num_computed_tokens + n)

    output = SchedulerOutput(
        num_scheduled_tokens=tuple(scheduled.items()),
        scheduled_new_reqs=tuple(new),
        scheduled_resumed_reqs=tuple(resumed),
        scheduled_running_reqs=tuple(scheduled_running),
        preempted_req_ids=tuple(preempted),
    )
    return output, SchedulerState(c, reqs, tuple(running), tuple(waiting), blocks, free)


def check_stop(request: Request, last_token_id: int, max_model_len: int) -> RequestStatus | None:
    """The finished status after appending `last_token_id`, or None (U:98-140).
    0.33.0's order: EOS, then stop tokens (none here), then length."""
    if last_token_id == EOS_TOKEN_ID:
        return RequestStatus.FINISHED_STOPPED
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    # [seams: min_tokens, repetition detection]
    return None


def _without(state: SchedulerState, done: set[str]) -> SchedulerState:
    """`state` less the finished requests `done`, their blocks back in the pool."""
    if not done:
        return state
    blocks = {k: v for k, v in state.req_to_num_blocks.items() if k not in done}
    freed = sum(state.req_to_num_blocks.get(k, 0) for k in done)
    return SchedulerState(
        state.config,
        {k: v for k, v in state.requests.items() if k not in done},
        tuple(x for x in state.running if x not in done),
        tuple(x for x in state.waiting if x not in done),
        blocks,
        state.num_free_blocks + freed,
    )


def update_from_output(
    state: SchedulerState,
    output: SchedulerOutput,
    sampled_token_ids: Mapping[str, Sequence[int]],
) -> tuple[tuple[tuple[str, RequestStatus], ...], SchedulerState]:
    """Append sampled tokens, stop requests, free their blocks (S:2259-2551).

    Returns the requests finished, in scheduled order, with their status.

    Contracts (PEP 316, checked by CrossHair: tests/test_crosshair.py):
    pre: len(state.requests) <= 2 and len(state.req_to_num_blocks) <= 2 and state.config.max_model_len <= 32
    pre: all(len(v) <= 2 for v in sampled_token_ids.values()) and len(output.num_scheduled_tokens) <= 2
    post: {rid for rid, _ in __return__[0]} <= {rid for rid, _ in output.num_scheduled_tokens} and all(st.is_finished for _, st in __return__[0])
    post: set(__return__[1].requests) == set(state.requests) - {rid for rid, _ in __return__[0]}
    post: __return__[1].num_free_blocks + sum(__return__[1].req_to_num_blocks.values()) == state.num_free_blocks + sum(state.req_to_num_blocks.values())
    """
    c = state.config
    reqs = dict(state.requests)
    finished: list[tuple[str, RequestStatus]] = []
    for rid, _ in output.num_scheduled_tokens:
        r = reqs.get(rid)
        if r is None:  # finished or aborted meanwhile: its output is ignored (S:2322-2331)
            continue
        tokens = list(sampled_token_ids.get(rid, ()))  # a non-final prefill chunk samples none
        for k, token in enumerate(tokens, 1):
            r = r.evolve(num_output_tokens=r.num_output_tokens + 1)
            status = check_stop(r, token, c.max_model_len)
            if status is not None:
                # Discarded tokens past the stop roll num_computed_tokens back (S:2756-2762).
                r = r.evolve(status=status, num_computed_tokens=r.num_computed_tokens - (len(tokens) - k))
                finished.append((rid, status))
                break
        reqs[rid] = r
    # Stopped requests are freed and leave their queue once, at the end (S:2541-2551).
    after = SchedulerState(c, reqs, state.running, state.waiting, state.req_to_num_blocks, state.num_free_blocks)
    return tuple(finished), _without(after, {rid for rid, _ in finished})


def finish_requests(
    state: SchedulerState, request_ids: Iterable[str], finished_status: RequestStatus
) -> tuple[tuple[str, ...], SchedulerState]:
    """Finish requests from outside, e.g. an abort, from running or waiting
    (S:2964-3029).  Unknown and already-finished ids are ignored.

    Contracts (PEP 316, checked by CrossHair: tests/test_crosshair.py):
    pre: len(state.requests) <= 3 and len(state.running) + len(state.waiting) <= 3 and len(state.req_to_num_blocks) <= 3
    pre: finished_status.is_finished and len(request_ids) <= 3
    post: set(__return__[0]) == set(request_ids) & set(state.requests) and len(set(__return__[0])) == len(__return__[0])
    post: set(__return__[1].requests) == set(state.requests) - set(request_ids) and __return__[1].running == tuple(k for k in state.running if k not in __return__[0]) and __return__[1].waiting == tuple(k for k in state.waiting if k not in __return__[0])
    post: __return__[1].num_free_blocks == state.num_free_blocks + sum(state.req_to_num_blocks.get(k, 0) for k in __return__[0]) and sum(__return__[1].req_to_num_blocks.values()) + __return__[1].num_free_blocks == sum(state.req_to_num_blocks.values()) + state.num_free_blocks
    """
    assert finished_status.is_finished
    done: list[str] = []
    for rid in request_ids:
        if rid in state.requests and rid not in done:
            done.append(rid)
    return tuple(done), _without(state, set(done))
