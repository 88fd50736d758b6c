"""A KV connector's external hits (modelled from vLLM 0.33.0), as what the environment holds.

The spec has no connector.  What one could load for a request is part of the
request: `kv_connector_tokens`, the leading tokens of its sequence a remote store
holds, or None while the connector cannot tell yet, and `kv_connector_async`,
whether it loads them asynchronously.  At an admission from zero computed tokens
vLLM asks the connector for the tokens beyond the local prefix hit (S:1169-1183).
An answer of None skips the request for this step, kept in its place
(S:1185-1190).  Tokens are counted computed; their blocks are new blocks
(K:580-587).  A synchronous load fills them within the step, cached as they fill
like computed ones (S:1217-1257, 1612-1614; K:638-646).  An asynchronous one takes
the blocks and no tokens: the request waits in WAITING_FOR_REMOTE_KVS, holding
them, until the worker reports the load finished (`kv_load_finished`); at the
head of the waiting loop it is then promoted and admitted from its loaded tokens
(S:1336-1338, 1482-1513, 1576-1607, 3616-3681).

A request finished while its load is in flight keeps its blocks, finished but
held, until the worker reports the load (S:3153-3164, 3722-3727).  So does one
whose KV the connector sends once it finishes (`kv_connector_sends`, a KV
producer's request_finished answering delay_free, S:3180-3200, 3517-3536), until
the worker reports the send (finished_sending, S:3730-3733).  Not modelled (the
monitor names them, monitor/scope.py): deferred frees, failed loads and invalid
blocks, deferred load starts.
"""

from __future__ import annotations

from collections import deque

from . import spec_decode
from .config import PRIORITY
from .kv_cache import cdiv
from .request import PREEMPTED, RUNNING, WAITING, Request, RequestStatus
from .state import Working

WAITING_FOR_REMOTE_KVS = RequestStatus.WAITING_FOR_REMOTE_KVS


# vLLM asks only at an admission from zero computed tokens (S:1149); in the spec's scope
# every waiting request has none (a preemption resets them, S:1876), so the rules below
# are applied to the requests the waiting loop reaches, without that test.


def undecided(r: Request) -> bool:
    """The connector cannot tell yet: the waiting loop skips `r` (S:1185-1190); not a
    request that skips the prefix cache, whose answer is replaced by none (S:1182-1183)."""
    return r.kv_connector_tokens is None and not r.skip_reading_prefix_cache


def external_tokens(r: Request, num_local_computed_tokens: int) -> int:
    """The tokens the connector loads for `r` beyond its local prefix hit
    (S:1177-1226); the spec's local hits are whole blocks, so vLLM's sub-block
    tail rule (S:1206-1224) never acts."""
    if r.skip_reading_prefix_cache or not r.kv_connector_tokens:
        return 0
    return max(0, r.kv_connector_tokens - num_local_computed_tokens)


def loads_async(r: Request, external: int) -> bool:
    """The connector loads `external` tokens of `r` asynchronously (S:1177, 1336)."""
    return external > 0 and r.kv_connector_async


def loading(r: Request) -> bool:
    return r.status == WAITING_FOR_REMOTE_KVS


def holds_kv_blocks(r: Request) -> bool:
    """A waiting request holding blocks: one loading, or loaded and promoted
    (S:2764-2774).  vLLM keeps them in their own queue, drained before the others
    (S:1091-1107); the spec's `waiting` lists them first (state.py)."""
    return r.num_computed_tokens > 0 or r.status == WAITING_FOR_REMOTE_KVS


def holds_loaded_blocks(r: Request) -> bool:
    """holds_kv_blocks, for a request whose connector loads asynchronously: in a state
    reached by the calls, the only waiting requests holding blocks; the properties and
    invariants judge the holders' queue by it, and a state that has others is judged
    as before (a waiting request with progress breaks their claims there)."""
    return r.kv_connector_async and holds_kv_blocks(r)


def num_holding(waiting, requests) -> int:
    """How many requests at the front of `waiting` hold KV blocks: vLLM's queue of them."""
    n = 0
    while n < len(waiting) and holds_kv_blocks(requests[waiting[n]]):
        n += 1
    return n


def queue_span(waiting, requests, rid: str) -> tuple[int, int]:
    """The part of `waiting` that request `rid` joins (S:2776-2787): the holders' queue at
    its front if it holds KV blocks itself (a preempted request never does: its computed
    tokens are reset first), else the queue behind it."""
    n = num_holding(waiting, requests)
    return (0, n) if holds_kv_blocks(requests[rid]) else (n, len(waiting))


def holders(waiting, requests) -> frozenset:
    """The requests holding KV blocks in `waiting`, read before a step."""
    return frozenset(waiting[i] for i in range(num_holding(waiting, requests)))


def start_load(s, rid: str, hits, external: int, num_new_blocks: int) -> None:
    """An asynchronous load (S:1576-1607): the request takes the blocks of its hit and
    the loaded tokens, left uncached until the load finishes (K:628-633), counts them
    computed, and leaves the waiting loop for this step (`s.loads`, requeue_holders)."""
    s.kv.allocate(rid, hits, num_new_blocks)
    r = s.request(rid)
    r.status = WAITING_FOR_REMOTE_KVS
    r.num_computed_tokens += len(hits) * s.config.block_size + external
    s.loads.append(s.waiting.popleft())


def requeue_holders(s) -> None:
    """After the waiting loop (its skipped requests back in place): the requests
    whose load started join the holders' queue, at its end (the loop reached them
    after every holder, S:1076-1087, 1675-1681); under PRIORITY a heap of its own."""
    holders = [x for x in s.waiting if holds_kv_blocks(s.requests[x])] + s.loads
    if s.config.policy == PRIORITY:
        holders.sort(key=lambda x: s.requests[x].queue_key)
    s.waiting = deque(holders + [x for x in s.waiting if not holds_kv_blocks(s.requests[x])])


def loads_finished(w, request_ids) -> None:
    """The worker reports these requests' loads finished (S:2648, 3716-3721), which
    promotes them at their next turn in the waiting loop (promote); those of requests
    finished meanwhile free their blocks (free_held)."""
    for rid in request_ids:
        r = w.requests.get(rid)
        if r is not None and r.status.is_finished:
            continue
        if r is None or not loading(r):  # reported twice: a set in vLLM (S:3724), so once
            raise ValueError(f"finished_recving: request {rid!r} is not waiting for remote KVs")
        w.request(rid).kv_load_finished = True


def hold(w, finished) -> frozenset:
    """Of requests finishing, (id, finished status) pairs, those that keep their blocks,
    finished and out of their queue: a load in flight (hold_loading) or a send to come
    (hold_sending); each gets its finished status."""
    return hold_loading(w, finished) | hold_sending(w, finished)


def hold_loading(w, finished) -> frozenset:
    """Of requests finishing (finish_requests, S:3153-3164; vLLM's grammar errors go
    through it too, S:2631-2634), those whose asynchronous load is in flight: kept until
    the worker reports the load (free_held).  One whose load was reported is freed at once."""
    held = frozenset(rid for rid, _ in finished if loading(w.requests[rid]) and not w.requests[rid].kv_load_finished)
    for rid, status in finished:
        if rid in held:
            w.request(rid).status = status
    return held


def hold_sending(w, finished) -> frozenset:
    """Of requests finishing, (id, finished status) pairs, those whose KV the connector
    sends (S:3180-3200): finished and out of their queue, but holding their blocks,
    until the worker reports the send (free_sent)."""
    held = frozenset(rid for rid, _ in finished if w.requests[rid].kv_connector_sends)
    for rid, status in finished:
        if rid in held:
            w.request(rid).status = status
    return held


def dropped_output(w, rid: str, n: int) -> bool:
    """Whether a returning batch's output for `rid` is dropped because the request
    finished meanwhile and is held (for a send): its `n` tokens then leave flight and
    the stale count (S:2362-2381)."""
    if not w.requests[rid].status.is_finished:
        return False
    r = w.request(rid)
    r.num_in_flight_tokens -= n
    if r.num_stale_output_tokens > 0:
        r.num_stale_output_tokens -= n
    return True


def free_sent(state, request_ids):
    """The worker reports these requests' KV sent: their blocks are freed, and they go,
    after the loads reported with them (S:3730-3733)."""
    for rid in request_ids:
        r = state.requests.get(rid)
        if r is None or not (r.status.is_finished and r.kv_connector_sends):  # vLLM asserts it holds it (S:3732)
            raise ValueError(f"finished_sending: request {rid!r} is not finished with its KV being sent")
    return free_held(state, dict.fromkeys(request_ids))


def free_held(state, request_ids):
    """The worker reports the loads of requests finished mid-load: their blocks are
    freed, and they go, after the step's own frees (S:2648, 3722-3727)."""
    gone = [rid for rid in request_ids if rid in state.requests and state.requests[rid].status.is_finished]
    if not gone:
        return state
    w = Working(state)
    for rid in gone:
        w.kv.free(rid)
        del w.requests[rid]
    return w.freeze()


def load_in_flight(r: Request) -> bool:
    """Guard: `r` waits for its KV load, not reported finished yet: the waiting loop
    skips it (S:3671-3675)."""
    return loading(r) and not r.kv_load_finished


def promote(s, rid: str) -> None:
    """A request whose KV load finished, reached at the head of the waiting loop: its
    loaded blocks are cached, a load of the whole sequence gives back its last token to
    compute, and it waits as it did before the load (S:3616-3666, 3676-3681)."""
    r = s.request(rid)
    if r.block_hashes:
        s.kv.cache_blocks(rid, r.block_hashes, spec_decode.cacheable_tokens(s.config, r.num_computed_tokens),
                          s.config.block_size)
    if r.num_computed_tokens == r.num_tokens:
        r.num_computed_tokens -= 1
    r.kv_load_finished = False
    r.status = PREEMPTED if r.num_preemptions else WAITING


def reserved_blocks(s) -> int:
    """The blocks an asynchronous load must leave free (S:1482-1492): what every
    in-flight prefill still needs for its whole sequence (S:3538-3570), and one
    speculative step's blocks.  In flight: a request loading or loaded and not yet
    admitted (S:1604), still when admitted in this step (`s.holders`); one admitted in
    this step with prefill left after its chunk (S:1658-1661); a running one
    mid-prefill (kept until a step ends its prefill, S:1923-1925)."""
    c = s.config
    spec = 1 + c.num_speculative_tokens + c.num_lookahead_tokens if c.num_speculative_tokens else 0
    admitted = set(s.new) | set(s.resumed)
    total = cdiv(spec, c.block_size)
    for rid, r in s.requests.items():
        if r.status == RUNNING:
            in_flight = (rid in s.holders or r.num_computed_tokens + s.scheduled[rid] < r.num_tokens) \
                if rid in admitted else r.is_prefill_chunk
        else:  # not one finished mid-load, which _free_request drops from them (S:3177)
            in_flight = holds_kv_blocks(r) and not r.status.is_finished
        if in_flight:
            total += max(cdiv(min(r.num_tokens, c.max_model_len) + spec, c.block_size) - s.kv.num_blocks(rid), 0)
    return total
