"""vLLM's V1 scheduler, core scope, as functions from state to state: the rules of the
newest modelled release, older releases' rules behind the gates of spec/versions.py.

S = vllm/v1/core/sched/scheduler.py, U = sched/utils.py, Q = sched/request_queue.py
(docs/rules.md).  Scope: a decoder-only generate model, one full-attention KV group,
prefix caching, async scheduling and speculative decoding (a drafter with no rows
of its own, as n-gram) on or off; a comment marks each seam where connectors,
encoder inputs, LoRA, pause or DP would act.  Each
public call takes a `SchedulerState` and returns a new one; the named steps inside
change one working copy (state.py `Working`), guards first, then effects.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import replace
from typing import Iterable, Mapping, Sequence

from .config import PRIORITY, ConfigError, SchedulerConfig, long_prefill_threshold, step_budget
from .kv_cache import allocate_slots
from .request import PREEMPTED, RUNNING, WAITING, Request, RequestStatus, last_token_in_flight
from . import (cache_aware_admission, encoder_inputs, kv_connector, lora, prefill_throttle, spec_decode, stale_output,
               structured_output)
from .spec_decode import update_draft_token_ids  # noqa: F401 - a public call of the spec, as the others
from .structured_output import grammar_compiled  # noqa: F401 - the environment's event, beside the calls
from .state import PAUSED_ALL, UNPAUSED, SchedulerOutput, SchedulerState, Working
from .guards import (Admission, PrefixHit, cap_long_prefill, chunk_budget, has_budget, prefix_hit, skips_head,
                     stops_admission, wanted_tokens_waiting)
from .versions import INPUT_BUDGET, PRIORITY_SELF_PREEMPTION_CONTINUES, RESUMED_SENT_AS_NEW, has


def enqueue(policy: str, waiting: deque[str], requests: Mapping[str, Request], rid: str, front: bool) -> None:
    """FCFS: a deque, `front` for preempted requests (Q:92-95).  PRIORITY: a heap, where
    prepending is a plain push (Q:159-164), kept as a sorted deque: its pop order.  In its
    queue: the KV holders' or the others' (kv_connector.queue_span)."""
    lo, hi = kv_connector.queue_span(waiting, requests, rid)
    if policy == PRIORITY:
        key = requests[rid].queue_key
        waiting.insert(bisect.bisect_left(waiting, key, lo, hi, key=lambda w: requests[w].queue_key), rid)
    else:
        waiting.insert(lo if front else hi, rid)


def add_request(state: SchedulerState, request: Request) -> SchedulerState:
    """A new request joins the waiting queue (S:3065-3098).

    Contracts (PEP 316; CrossHair's search bounds are in tests/test_crosshair.py):
    pre: all(w in state.requests for w in state.waiting)
    pre: request.request_id not in state.requests
    post: len(__return__.waiting) == len(state.waiting) + 1 and set(__return__.waiting) == set(state.waiting) | {request.request_id}
    post: __return__.requests[request.request_id] is request and len(__return__.requests) == len(state.requests) + 1
    post: __return__.running == state.running and __return__.kv_cache == state.kv_cache
    """
    if request.request_id in state.requests:
        raise ConfigError("id", f"duplicate request id {request.request_id!r}")
    requests = {**state.requests, request.request_id: request}
    waiting = deque(state.waiting)
    enqueue(state.config.policy, waiting, requests, request.request_id, front=False)
    return replace(state, requests=requests, waiting=tuple(waiting),
                   prefill_cadence=prefill_throttle.enqueued(state, request))


class ScheduleWork(Working):
    """One `schedule()`'s working state: budgets and decisions besides what `Working` holds."""

    def __init__(self, state: SchedulerState, throttle_prefills: bool = False):
        Working.__init__(self, state)
        c = state.config
        self.token_budget = c.token_budget if self.pause_state != PAUSED_ALL else 0  # S:735, 739-741
        self.input_budget = c.max_num_batched_tokens if has(c, INPUT_BUDGET) else self.token_budget  # S:738
        self.draft_slots = c.max_num_new_slots_for_drafting  # a drafter's rows per request (S:737, 813, 1019)
        self.threshold = long_prefill_threshold(c, len(self.running) + len(self.waiting))  # S:770-788
        self.cursor = 0  # the running loop's position in `running`
        self.scheduled: dict[str, int] = {}  # insertion order is grant order
        self.scheduled_running, self.new, self.resumed, self.preempted = [], [], [], []
        self.prefix_hits: list[tuple[str, int]] = []
        self.kv_connector_hits: list[tuple[str, int]] = []
        self.drafts_sent: dict[str, tuple[int, ...]] = {}  # the drafts sent to the model, by request
        self.prefill_scheduled = False  # whether the running loop scheduled a prefill chunk (S:1016)
        self.loads: list[str] = []  # requests whose asynchronous KV load started (kv_connector.py)
        self.holders = kv_connector.holders(self.waiting, self.requests)  # (S:1604, kv_connector.py)
        self.defer_prefills = prefill_throttle.defers_prefills(self, throttle_prefills)  # S:766-768, 796-807
        self.encoder_budget = c.encoder_compute_budget  # S:745
        self.encoder_inputs: dict[str, tuple[int, ...]] = {}  # the items each request encodes (S:744)
        self.encoder_plan: tuple = ((), 0, ())  # encoder_inputs.plan's, for the request being scheduled

    def output(self) -> SchedulerOutput:
        return SchedulerOutput(
            num_scheduled_tokens=tuple(self.scheduled.items()), scheduled_new_reqs=tuple(self.new),
            scheduled_resumed_reqs=tuple(self.resumed), scheduled_running_reqs=tuple(self.scheduled_running),
            preempted_req_ids=tuple(self.preempted), prefix_hits=tuple(self.prefix_hits),
            scheduled_spec_decode_tokens=tuple(self.drafts_sent.items()),
            kv_connector_hits=tuple(self.kv_connector_hits),
            scheduled_encoder_inputs=tuple(self.encoder_inputs.items()),
            free_encoder_mm_hashes=self.encoder.freed_mm_hashes())


def schedule(state: SchedulerState, throttle_prefills: bool = False) -> tuple[SchedulerOutput, SchedulerState]:
    """One `Scheduler.schedule(throttle_prefills)` (S:716-1838), then `_update_after_schedule`
    (S:1899-1931), which advances num_computed_tokens optimistically.

    Contracts (PEP 316; CrossHair's search bounds are in tests/test_crosshair.py), for
    the newest release (before 0.28.0 a step may exceed max_num_batched_tokens: versions.INPUT_BUDGET);
    the preconditions are the state invariant:
    pre: all(k in state.requests for k in state.running + state.waiting) and len(set(state.running + state.waiting)) == len(state.running + state.waiting)
    pre: all(0 <= r.num_computed_tokens < r.num_tokens < state.config.max_model_len for r in state.requests.values())
    pre: state.num_free_blocks >= 0 and all(v >= 0 for v in state.req_to_num_blocks.values()) and len(state.running) <= state.config.max_num_active_reqs
    post: __return__[0].total_num_scheduled_tokens <= step_budget(state.config)
    post: all(n >= 1 for _, n in __return__[0].num_scheduled_tokens) and len(__return__[0].scheduled) == len(__return__[0].num_scheduled_tokens)
    post: __return__[1].num_free_blocks >= 0 and (state.block_pool is not None or __return__[1].num_free_blocks + sum(__return__[1].req_to_num_blocks.values()) == state.num_free_blocks + sum(state.req_to_num_blocks.values()))
    post: len(__return__[1].running) <= state.config.max_num_active_reqs and (not __return__[0].preempted_req_ids or not __return__[0].admitted)
    post: sorted(__return__[1].running + __return__[1].waiting) == sorted(state.running + state.waiting)
    """
    s = ScheduleWork(state, throttle_prefills)
    schedule_running(s)
    if not s.preempted and s.pause_state != PAUSED_ALL:  # no admission in a step that preempted (S:1066)
        cache_aware_admission.reorder_waiting(s)  # from 0.34.0, off by default (S:1067-1068)
        schedule_waiting(s)
    s.cadence = prefill_throttle.after_step(s)
    assert s.token_budget >= 0 and s.input_budget >= 0  # S:1704-1705
    assert len(s.running) <= s.config.max_num_seqs  # S:1706
    update_after_schedule(s)
    s.finished_req_ids = ()  # schedule() hands the finished ids on (interface.py:205-208)
    return s.output(), s.freeze()


def cut_chunk(s: ScheduleWork, r: Request, num_computed_tokens: int, n: int) -> int:
    """A chunk's last cuts, in both loops: before an encoder input it cannot encode (S:1422-1436;
    the plan references cache hits and evicts room, as vLLM's does, whatever comes of the
    chunk), then for a multi-module MTP drafter's lookahead (S:902-905, 1438-1442)."""
    if r.mm_features:  # [seam: Mamba alignment (S:875-879)]
        n = encoder_inputs.plan(s, r, num_computed_tokens, n)
    return spec_decode.reserve_prefill_lookahead(s.config, r, num_computed_tokens, n)


def schedule_running(s: ScheduleWork) -> None:
    """The running loop (S:809-1052), in running order while budget is left (S:811-813)."""
    while s.cursor < len(s.running) and has_budget(s):
        rid = s.running[s.cursor]
        n = num_new_tokens_running(s, s.requests[rid])
        if n == 0:  # nothing to compute this step: skip it, do not stop the scan (S:907-925)
            s.cursor += 1
            continue
        if not allocate_or_preempt(s, rid, n):
            # `rid` preempted itself.  PRIORITY goes on with the next request, which the cursor
            # already points at; FCFS has preempted everything after it (S:998-1008).
            if s.config.policy == PRIORITY and has(s.config, PRIORITY_SELF_PREEMPTION_CONTINUES):
                continue
            break
        grant(s, rid, n)
        s.scheduled_running.append(rid)
        s.prefill_scheduled |= s.requests[rid].is_prefill_chunk
        spec_decode.schedule_drafts(s, rid, n)
        s.cursor += 1


def num_new_tokens_running(s: ScheduleWork, r: Request) -> int:
    """The tokens a running request gets if its blocks can be had: what it lacks,
    under three caps (S:855-872), then cut_chunk's; 0 skips it."""
    if last_token_in_flight(r) or (s.defer_prefills and r.is_prefill_chunk):  # async (S:816-830); S:838
        return 0
    # [seams: PP cadence, EC pending (S:832-853)]
    n = r.num_tokens_with_spec + r.num_output_placeholders - r.num_computed_tokens  # S:855
    n = min(cap_long_prefill(s, n), chunk_budget(s))  # caps 1 and 2 (S:860, S:862-864)
    n = min(n, s.config.max_model_len - r.num_computed_tokens - 1)  # cap 3: 1 sampled token (S:868)
    return cut_chunk(s, r, r.num_computed_tokens, n)


def allocate_or_preempt(s: ScheduleWork, rid: str, n: int) -> bool:
    """Get the blocks for `n` more tokens of running request `rid`, preempting the
    victims the policy names until they fit (S:928-996).  False when `rid` itself
    was the victim."""
    while (num_new_blocks := blocks_to_allocate(s, rid, n)) is None:
        # [seam: connector with pending block frees (S:941)]
        victim = choose_victim(s)
        preempt(s, victim)
        if victim == rid:
            return False
    allocate(s, rid, n, (), num_new_blocks)
    return True


def choose_victim(s: ScheduleWork) -> str:
    """FCFS: the tail of running (S:954, S:986).  PRIORITY: the lowest priority, i.e. the
    largest (priority, arrival_time), first in running order on a tie; it may
    already be scheduled this step, or be the request being scheduled (S:948-984)."""
    if s.config.policy == PRIORITY:
        return max(s.running, key=lambda x: s.requests[x].priority_key)
    return s.running[-1]


def preempt(s: ScheduleWork, victim: str) -> None:
    """Take `victim` off running, refund a grant it got this step (S:967-973), free
    its blocks, reset its progress and put it at the front of waiting (S:1853-1897).
    Async: its output in flight becomes stale; it is still delivered later."""
    v = s.running.index(victim)
    del s.running[v]
    if v < s.cursor:  # the cursor fix #49206 (S:964)
        s.cursor -= 1
    if victim in s.scheduled:
        refund = s.scheduled.pop(victim)
        s.scheduled_running.remove(victim)
        s.drafts_sent.pop(victim, None)
        s.token_budget += refund
        s.input_budget += refund + s.draft_slots  # S:971
    s.kv.free(victim)
    encoder_inputs.release(s, victim)
    r = s.request(victim)
    r.status = PREEMPTED
    r.num_computed_tokens = 0
    r.spec_token_ids = ()  # S:1877
    r.num_preemptions += 1
    stale_output.make_stale(r, s.config.requires_kv_delivery)
    r.num_output_placeholders = 0
    enqueue(s.config.policy, s.waiting, s.requests, victim, front=True)
    s.preempted.append(victim)


def blocks_to_allocate(s: ScheduleWork, rid: str, n: int, hits: Sequence[int] = (), external: int = 0,
                       full_sequence_must_fit: bool = False, has_scheduled_reqs: bool = True, load_async: bool = False
                       ) -> int | None:
    """How many new blocks `rid` needs for `n` more tokens after its `hits` and `external`
    tokens, or None when the pool cannot give them (kv_cache.allocate_slots).  Changes nothing."""
    return allocate_slots(s.config, s.requests[rid], n, s.kv.num_blocks(rid), s.kv.num_free_blocks,
                          full_sequence_must_fit=full_sequence_must_fit, has_scheduled_reqs=has_scheduled_reqs,
                          num_hit_blocks=len(hits), num_evictable_hit_blocks=s.kv.num_evictable(hits) if hits else 0,
                          num_external_computed_tokens=external, num_lookahead_tokens=0 if load_async else None,
                          reserved_blocks=kv_connector.reserved_blocks(s) if load_async else 0)


def allocate(s: ScheduleWork, rid: str, n: int, hits: Sequence[int], num_new_blocks: int, external: int = 0) -> None:
    """Give `rid` its hit blocks and `num_new_blocks` new ones, and cache the full
    blocks it will have computed, so a later request in this step can hit them
    (K:611-648)."""
    r = s.requests[rid]
    if hits or num_new_blocks:  # else it holds the blocks already: most decode steps
        s.kv.allocate(rid, hits, num_new_blocks)
    if r.block_hashes:  # only full blocks are cached, and only prefix caching hashes them
        done = min(r.num_computed_tokens + len(hits) * s.config.block_size + external + n, r.num_tokens)  # K:643
        s.kv.cache_blocks(rid, r.block_hashes, spec_decode.cacheable_tokens(s.config, done), s.config.block_size)


def grant(s: ScheduleWork, rid: str, n: int) -> None:
    """`rid` is scheduled `n` tokens, charged to both budgets, and the encoder inputs
    its plan chose, the last one made (S:1044-1052, 1664-1673)."""
    s.scheduled[rid] = n
    s.token_budget, s.input_budget = s.token_budget - n, s.input_budget - n - s.draft_slots
    if s.requests[rid].mm_features:
        encoder_inputs.commit(s, rid)


def schedule_waiting(s: ScheduleWork) -> None:
    """The waiting loop (S:1066-1687): admit from the head while budget, a run slot
    (S:1094-1113) and blocks last; requests holding KV blocks first, and only those
    under PAUSED_NEW (S:1100-1107); skipped requests keep their place (S:1675-1681)."""
    skipped: list[str] = []
    loras = lora.running_loras(s.requests[x] for x in s.running)
    while has_budget(s) and s.waiting and len(s.running) < s.config.max_num_active_reqs \
            and (s.pause_state == UNPAUSED or kv_connector.holds_kv_blocks(s.requests[s.waiting[0]])):
        rid = s.waiting[0]
        skip = skips_head(s, rid, loras)  # the guards, on the head as the loop reaches it
        handle_blocked(s, rid)
        outcome = Admission.SKIPPED if skip else admit(s, rid)
        if outcome is Admission.SKIPPED:  # admitting nothing: loras stay (S:1456-1460)
            skipped.append(s.waiting.popleft())
        elif outcome is Admission.STOPPED:
            break
        elif outcome is Admission.ADMITTED:
            loras.update(lora.running_loras(s.requests[x] for x in s.running[-1:]))  # S:1627-1629
    s.waiting.extendleft(reversed(skipped))
    if s.loads:
        kv_connector.requeue_holders(s)
    s.cadence = prefill_throttle.after_waiting_loop(s, skipped + s.loads)  # a load start skips it (S:1607)


def handle_blocked(s: ScheduleWork, rid: str) -> None:
    """The loop reaches the head, skipped or not (`_handle_blocked_waiting_request`,
    S:3616-3681, 3685-3697): a finished KV load promotes it; a compiled grammar makes it
    WAITING, a failed one is noted."""
    if kv_connector.loading(s.requests[rid]) and not kv_connector.load_in_flight(s.requests[rid]):
        kv_connector.promote(s, rid)
    structured_output.grammar_reached(s, rid)


def admit(s: ScheduleWork, rid: str) -> Admission:
    """Admit the head of waiting from its prefix hit if its tokens and blocks fit, or start
    its asynchronous KV load (S:1141-1523, async S:1336-1338, 1465-1513)."""
    r = s.requests[rid]
    hit = prefix_hit(s, r)
    if kv_connector.loads_async(r, hit.external):
        return start_kv_load(s, rid, hit)
    if s.defer_prefills and prefill_throttle.has_prefill_left(hit.num_computed_tokens, r.num_tokens):  # S:1340
        return Admission.STOPPED
    if stops_admission(s, r, hit.num_computed_tokens):
        return Admission.STOPPED
    n = num_new_tokens_waiting(s, r, hit.num_computed_tokens)  # its encoder plan's effects stand (cut_chunk)
    if n == 0:  # no chunk outside an MTP drafter's lookahead, or an unchunked prompt split
        return Admission.SKIPPED
    num_new_blocks = blocks_to_allocate(s, rid, n, hit.blocks, hit.external, s.config.scheduler_reserve_full_isl,
                                        has_scheduled_reqs=bool(s.running))  # S:1511-1513
    if num_new_blocks is None:
        s.encoder.free(rid)  # the references its plan took (S:1518-1523)
        return Admission.STOPPED
    enter_running(s, rid, n, hit, num_new_blocks)
    return Admission.ADMITTED


def start_kv_load(s: ScheduleWork, rid: str, hit: PrefixHit) -> Admission:
    """An asynchronous KV load starts if the blocks of the hit and the loaded tokens fit
    beside those in-flight prefills need (S:1482-1513); it computes nothing this step."""
    num_new_blocks = blocks_to_allocate(s, rid, 0, hit.blocks, hit.external, s.config.scheduler_reserve_full_isl,
                                        bool(s.running), load_async=True)
    if num_new_blocks is None:
        return Admission.STOPPED
    kv_connector.start_load(s, rid, hit.blocks, hit.external, num_new_blocks)
    return Admission.LOAD_STARTED


def enter_running(s: ScheduleWork, rid: str, n: int, hit: PrefixHit, num_new_blocks: int) -> None:
    """An admission's effects: its blocks, the running queue, its grant (S:1523-1673)."""
    c = s.config
    r = s.requests[rid]
    padded = spec_decode.pads_new_decode(s, r, hit.num_computed_tokens)
    allocate(s, rid, n, hit.blocks, num_new_blocks, hit.external)
    s.waiting.popleft()
    s.running.append(rid)
    (s.new if r.status == WAITING or has(c, RESUMED_SENT_AS_NEW) else s.resumed).append(rid)  # S:1619-1626
    if c.enable_prefix_caching and hit.looked_up:
        s.prefix_hits.append((rid, hit.num_computed_tokens - hit.external))
    if hit.external:
        s.kv_connector_hits.append((rid, hit.external))
    grant(s, rid, n)
    if padded:
        # vLLM asserts this (S:1643); a long-prefill cap below 1 + num_speculative_tokens
        # breaks it, and the scheduler raises (docs/rules.md, speculative decoding).
        assert n == 1 + c.num_speculative_tokens, "S:1643: a padded new decode was cut by the long-prefill cap"
        s.drafts_sent[rid] = (-1,) * c.num_speculative_tokens
    r = s.request(rid)
    r.status = RUNNING
    r.num_computed_tokens = hit.num_computed_tokens


def num_new_tokens_waiting(s: ScheduleWork, r: Request, num_computed_tokens: int) -> int:
    """The tokens an admission that stops_admission lets on gets (S:1345-1442), cut_chunk's
    cuts included; 0, a skip, when no chunk ends outside a multi-module MTP drafter's
    lookahead, or the encoder plan would split a prompt with chunked prefill off."""
    n = wanted_tokens_waiting(s, r, num_computed_tokens)
    n = min(n, chunk_budget(s))  # S:1345
    n = cut_chunk(s, r, num_computed_tokens, n)
    return encoder_inputs.unsplit_unchunked(s, r, num_computed_tokens, n) if r.mm_features else n  # S:1444-1455


def update_after_schedule(s: ScheduleWork) -> None:
    """`_update_after_schedule`: computed tokens advance by the grant before the model
    runs (S:1899-1931); AsyncScheduler adds one output placeholder per request that
    is not mid-prefill, and one per draft it verifies, and gives it
    num_speculative_tokens -1 drafts for the next step (async_scheduler.py:24-56)."""
    drafts = (-1,) * s.config.num_speculative_tokens
    for rid, n in s.scheduled.items():
        r = s.request(rid)
        r.num_computed_tokens += n
        r.num_in_flight_tokens += n
        r.is_prefill_chunk = r.num_computed_tokens < r.num_tokens + r.num_output_placeholders
        if not r.is_prefill_chunk and s.config.async_scheduling:
            r.num_output_placeholders += 1 + len(s.drafts_sent.get(rid, ()))
            r.spec_token_ids = drafts


def update_from_output(state: SchedulerState, output: SchedulerOutput, sampled_token_ids: Mapping[str, Sequence[int]],
                       finished_recving: Iterable[str] = (), finished_sending: Iterable[str] = ()
                       ) -> tuple[tuple[tuple[str, RequestStatus], ...], SchedulerState]:
    """Append sampled tokens, stop requests, free their blocks (S:2301-2618); returns the requests
    finished, in scheduled order.  Async: `output` may be an older batch; outputs of requests finished
    meanwhile are dropped (S:2373-2381), of those preempted meanwhile stale (`deliver_stale_output`).

    Contracts (PEP 316; CrossHair's search bounds are in tests/test_crosshair.py):
    pre: state.block_pool is None
    pre: all(rid in state.requests and (kv_connector.loading(state.requests[rid]) or state.requests[rid].status.is_finished) for rid in finished_recving)
    pre: all(rid in state.requests and state.requests[rid].status.is_finished and state.requests[rid].kv_connector_sends for rid in finished_sending)
    post: {rid for rid, _ in __return__[0]} <= {rid for rid, _ in output.num_scheduled_tokens} and all(st.is_finished for _, st in __return__[0])
    post: set(__return__[1].requests) == set(state.requests) - ({rid for rid, _ in __return__[0]} - {k for k, r in state.requests.items() if r.kv_connector_sends}) - (set(finished_recving) & {k for k, r in state.requests.items() if r.status.is_finished}) - set(finished_sending)
    post: __return__[1].num_free_blocks + sum(__return__[1].req_to_num_blocks.values()) == state.num_free_blocks + sum(state.req_to_num_blocks.values())
    """
    w = Working(state)
    kv_connector.loads_finished(w, finished_recving)
    finished: list[tuple[str, RequestStatus]] = []
    drafts = dict(output.scheduled_spec_decode_tokens)
    for rid, n in output.num_scheduled_tokens:
        if rid not in w.requests or kv_connector.dropped_output(w, rid, n):  # finished meanwhile
            continue
        tokens = sampled_token_ids.get(rid, ())  # a non-final prefill chunk samples none
        if w.requests[rid].num_stale_output_tokens > 0:
            status = deliver_stale_output(w, rid, n, tokens)
        else:
            status = deliver_output(w, rid, n, tokens, len(drafts.get(rid, ())))
        if status is not None:
            finished.append((rid, status))
    # Then those whose grammar failed, with an error (S:2619-2641; from a set, in no set order).
    finished += [(rid, RequestStatus.FINISHED_ERROR) for rid in structured_output.take_grammar_errors(w)]
    # Stopped requests leave their queue once, at the end (S:2607-2618), then any held (S:2648).
    done = remove_finished(w, [x for x, _ in finished], kv_connector.hold(w, finished))
    return tuple(finished), kv_connector.free_sent(kv_connector.free_held(done, finished_recving), finished_sending)


def deliver_output(w: Working, rid: str, n: int, tokens: Sequence[int], num_drafts: int = 0
                   ) -> RequestStatus | None:
    """Rejected drafts roll num_computed_tokens and their placeholders back (S:2392-2426);
    tokens past a stop are discarded, rolling num_computed_tokens back (S:2891-2897);
    a returned token replaces an output placeholder (S:2898-2905) and caches the
    blocks it completes (S:2450-2471)."""
    r = w.request(rid)
    r.num_in_flight_tokens -= n
    if num_drafts and tokens:
        spec_decode.reject_drafts(r, num_drafts - (len(tokens) - 1))
    if r.mm_features:
        encoder_inputs.free_computed(w, r)
    was_running, had_placeholders = r.status == RUNNING, r.num_output_placeholders > 0
    status, discarded = append_output_tokens(r, tokens, w.config)
    if discarded:
        r.num_computed_tokens -= discarded
    if tokens:
        if had_placeholders:
            r.num_output_placeholders -= len(tokens)
        if was_running and (had_placeholders or w.config.num_speculative_tokens > 0):
            w.kv.cache_blocks(rid, r.block_hashes, spec_decode.cacheable_tokens(
                w.config, r.num_computed_tokens - r.num_in_flight_tokens), w.config.block_size)
    return status


def deliver_stale_output(w: Working, rid: str, n: int, tokens: Sequence[int]) -> RequestStatus | None:
    """Async: a batch scheduled before the request's preemption (stale_output.py)."""
    r = w.request(rid)
    if not stale_output.drain(r, n):
        return None
    if r.mm_features:
        encoder_inputs.free_computed(w, r)
    status, _ = append_output_tokens(r, tokens, w.config)
    return status


def append_output_tokens(r: Request, tokens: Sequence[int], c: SchedulerConfig) -> tuple[RequestStatus | None, int]:
    """Append `tokens` to working copy `r` until one stops it; the finished status
    (or None) and how many tokens past the stop were discarded."""
    for k, token in enumerate(tokens, 1):
        r.append_output_token(token, c.block_size, c.enable_prefix_caching)
        status = check_stop(r, token, c.max_model_len)
        if status is not None:
            r.status = status
            return status, len(tokens) - k
    return None, 0


def check_stop(request: Request, last_token_id: int, max_model_len: int) -> RequestStatus | None:
    """The finished status after appending `last_token_id`, or None (U:98-140).
    The order: EOS, then stop tokens, then length."""
    if last_token_id == request.eos_token_id or last_token_id in request.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    # [seams: min_tokens, repetition detection]
    return None


def remove_finished(w: Working, done: Sequence[str], held: frozenset = frozenset()) -> SchedulerState:
    """The state without the finished requests `done`, whose blocks go back to the pool in
    that order (S:3170-3201), but those `held`, and with their ids noted as finished."""
    if not done:
        return w.freeze()
    for rid in done if w.encoder.refs else ():
        w.encoder.free(rid)  # held ones too (S:3191)
    for rid in (x for x in done if x not in held):
        w.kv.free(rid)
        del w.requests[rid]
    w.cadence = prefill_throttle.forget(w.cadence, done)
    gone = set(done)
    w.running = [x for x in w.running if x not in gone]
    w.waiting = deque(x for x in w.waiting if x not in gone)
    w.finished_req_ids += tuple(done)
    return w.freeze()


def finish_requests(state: SchedulerState, request_ids: Iterable[str], finished_status: RequestStatus
                    ) -> tuple[tuple[str, ...], SchedulerState]:
    """Finish requests from outside, e.g. an abort, from running or waiting (S:3100-3168),
    one mid-load or whose KV is sent held (kv_connector.hold).  Unknown and finished ids are ignored.

    Contracts (PEP 316; CrossHair's search bounds are in tests/test_crosshair.py):
    pre: finished_status.is_finished and state.block_pool is None
    post: set(__return__[0]) == set(request_ids) & {k for k, r in state.requests.items() if not r.status.is_finished} and len(set(__return__[0])) == len(__return__[0])
    post: set(state.requests) - set(request_ids) <= set(__return__[1].requests) <= set(state.requests) and __return__[1].running == tuple(k for k in state.running if k not in __return__[0]) and __return__[1].waiting == tuple(k for k in state.waiting if k not in __return__[0])
    post: __return__[1].num_free_blocks == state.num_free_blocks + sum(state.req_to_num_blocks.get(k, 0) for k in __return__[0] if k not in __return__[1].requests)
    """
    assert finished_status.is_finished
    done = tuple(dict.fromkeys(x for x in request_ids if x in state.requests and not state.requests[x].status.is_finished))
    return done, remove_finished(w := Working(state), done, kv_connector.hold(w, [(x, finished_status) for x in done]))
