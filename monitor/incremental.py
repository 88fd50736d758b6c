"""The monitor's incremental check: what one call changed, read from vLLM and
compared with the spec's post-state, without reading vLLM's whole state.

In an engine nothing but the scheduler's own methods changes it between calls
(monitor/shadow.py), so the state the spec computed after call n is the state
call n + 1 starts from: the monitor carries it.  After each call it reads from
vLLM only

- the requests the call named (granted, preempted, finished, added, updated) or
  the spec changed, each lifted alone (vllm_lift.lift_request);
- the queues' orders as request ids, the finished set, the pause state, the
  prefill cadence and the grammar errors (a pass over ids, no request read);
- of the KV pool: the free count, each touched request's table where it grew or
  shrank, the reference counts and hashes of the blocks it gained, the number of
  prefix-cache entries, and the first and last FREE_ENDS blocks of the free queue.

None of these grows with the pool.  What they cannot see (a block's place in the
middle of the free queue, a request vLLM changed without naming it) is what the
full check every `full_every` calls compares (monitor.py).  A difference found
here is confirmed by a full lift before it is reported (monitor.py
`Monitor.post_difference`).

The carried state is the spec's post-state with the block hashes the call
created renamed to vLLM's (check.py hash_renaming): a later request whose
prompt holds those tokens is hashed by vLLM, so the carried pool must know the
block under vLLM's hash for the spec to find the same prefix hit.
"""

from __future__ import annotations

from itertools import islice
from operator import attrgetter
from types import SimpleNamespace
from typing import Any, Iterable, Mapping

from schedspec.reference import vllm_lift
from schedspec.spec.block_pool import BlockPool
from schedspec.spec.kv_cache import BlockCounts
from schedspec.spec.state import SchedulerState

from . import check
from .check import REQUEST_FIELDS, Difference, hash_renaming, jsonable, renamed

FREE_ENDS = 4  # blocks read at each end of vLLM's free queue per call
_request_id, _block_id, _ref_cnt = attrgetter("request_id"), attrgetter("block_id"), attrgetter("ref_cnt")


def touched_ids(pre: SchedulerState, post: SchedulerState, named: Iterable[str]) -> list[str]:
    """The requests to read: those the call named, those whose spec value changed
    (a new object: the spec builds a new Request for every change), those it removed."""
    out = dict.fromkeys(named)
    before, added = pre.requests, 0
    for rid, r in post.requests.items():
        if before.get(rid) is not r:
            out[rid] = None
            added += rid not in before
    if len(before) + added > len(post.requests):  # some request left the spec's state
        out.update(dict.fromkeys(rid for rid in before if rid not in post.requests))
    return list(out)


def check_delta(sched: Any, pre: SchedulerState, post: SchedulerState, named: Iterable[str],
                gone: Mapping[str, tuple[tuple, tuple]] | None = None) -> tuple[Difference | None, SchedulerState]:
    """(the first difference found between `post`, the spec's state after the call,
    and what the call changed in vLLM's scheduler `sched`, or None; the state to
    carry to the next call).  `named`: the request ids vLLM's answer names;
    `gone`: check.hash_renaming's."""
    config = pre.config
    ids = touched_ids(pre, post, named)
    loaded = getattr(sched, "finished_recving_kv_req_ids", None) or ()
    spec_requests, observed = {}, {}
    for rid in ids:
        r = post.requests.get(rid)
        v = sched.requests.get(rid)
        v = v if v is not None and vllm_lift.held_by_spec(v) else None
        if (r is None) != (v is None):
            return Difference(f"post_state.requests.{rid}", "<absent>" if r is None else "<present>",
                              "<absent>" if v is None else "<present>"), post
        if r is not None:
            spec_requests[rid] = r
            observed[rid] = vllm_lift.lift_request(v, config, r, rid in loaded)
    rename = hash_renaming(pre, SimpleNamespace(requests=spec_requests), SimpleNamespace(requests=observed), gone) \
        if post.block_pool is not None else {}
    if isinstance(rename, Difference):
        return rename, post
    carried = renamed(post, rename)
    for rid, b in observed.items():
        a = carried.requests[rid]
        if a is not b and a.__dict__ != b.__dict__:
            name = next(n for n in REQUEST_FIELDS if getattr(a, n) != getattr(b, n))
            return Difference(f"post_state.requests.{rid}.{name}", jsonable(getattr(a, name)),
                              jsonable(getattr(b, name))), post
    small = read_small_parts(sched, config)
    difference = check.queues_difference(carried, small) or check.encoder_difference(carried, small) \
        or kv_difference(sched, pre, carried, ids)
    return difference, carried


def read_small_parts(sched: Any, config: Any) -> SimpleNamespace:
    """vLLM's queues, finished set, small state and encoder cache, read whole (none of
    them is read through a request or a block), as check.queues_difference and
    check.encoder_difference compare them."""
    return SimpleNamespace(
        running=tuple(map(_request_id, sched.running)), waiting=vllm_lift.waiting_order(sched),
        finished_req_ids=sched.finished_req_ids,
        grammar_compile_error_reqs=getattr(sched, "grammar_compile_error_reqs", None) or (),
        pause_state=vllm_lift.lift_pause_state(sched), prefill_cadence=vllm_lift.lift_prefill_cadence(sched, config),
        encoder_cache=vllm_lift.lift_encoder_cache(sched))


def kv_difference(sched: Any, pre: SchedulerState, post: SchedulerState, ids: list[str]) -> Difference | None:
    """The KV pool, where the call could have changed it (see the module's docstring)."""
    kv, spec = sched.kv_cache_manager, post.kv_cache
    pool = kv.block_pool
    free = pool.get_num_free_blocks()
    if free != spec.num_free_blocks:
        return Difference("post_state.kv_cache.num_free_blocks", spec.num_free_blocks, free)
    managers = kv.coordinator.single_type_managers
    if isinstance(spec, BlockCounts):
        for rid in ids:
            n = max((len(m.req_to_blocks.get(rid) or ()) for m in managers), default=0)
            if n != spec.req_to_num_blocks.get(rid, 0):
                return Difference(f"post_state.kv_cache.req_to_num_blocks.{rid}", spec.req_to_num_blocks.get(rid, 0), n)
        return None
    (manager,) = managers  # the full lift refuses several groups before any call is carried
    before = pre.kv_cache if isinstance(pre.kv_cache, BlockPool) else None
    for rid in ids:
        difference = table_difference(manager, before, spec, rid)
        if difference is not None:
            return difference
    entries = len(pool.cached_block_hash_to_block._cache)  # noqa: SLF001 - one entry per hash, as the spec's map
    if entries != len(spec.cached):
        return Difference("post_state.kv_cache.cached", f"{len(spec.cached)} hashes", f"{entries} hashes")
    head, tail = free_queue_ends(pool.free_block_queue, min(FREE_ENDS, free))
    spec_head, spec_tail = spec_free_ends(spec, min(FREE_ENDS, free))
    if head != spec_head or tail != spec_tail:
        return Difference("post_state.kv_cache.free_queue", {"first": list(spec_head), "last": list(spec_tail)},
                          {"first": list(head), "last": list(tail)})
    return None


def table_difference(manager: Any, pre: BlockPool | None, spec: BlockPool, rid: str) -> Difference | None:
    """Request `rid`'s block table: its length, the blocks it gained in the call (ids,
    reference counts), its count of cached blocks, and the hash of each block the call
    gained or cached."""
    blocks = manager.req_to_blocks.get(rid) or ()
    mine = spec.req_to_blocks.get(rid, ())
    where = f"post_state.kv_cache.req_to_blocks.{rid}"
    if len(blocks) != len(mine):
        return Difference(where, list(mine), list(map(_block_id, blocks)))
    before = pre.req_to_blocks.get(rid, ()) if pre is not None else ()
    # A table only grows until it is freed whole (T:596-604): blocks it held before keep their place.
    kept = len(before) <= len(mine) and (mine is before or mine[:len(before)] == before)
    start = len(before) if kept else 0
    if start < len(mine):
        new = blocks[start:]
        ids = tuple(map(_block_id, new))
        if ids != mine[start:]:
            return Difference(where, list(mine), list(map(_block_id, blocks)))
        counts = list(map(_ref_cnt, new))
        if counts != list(map(spec.ref_cnt.get, ids)):
            return Difference("post_state.kv_cache.ref_cnt", dict(zip(ids, map(spec.ref_cnt.get, ids))),
                              dict(zip(ids, counts)))
    cached = manager.num_cached_block.get(rid, 0) if blocks else 0
    spec_cached = spec.num_cached_block.get(rid, 0) if mine else 0
    if cached != spec_cached:
        return Difference(f"post_state.kv_cache.num_cached_block.{rid}", spec_cached, cached)
    # Hashes the call may have set: on the blocks cached since (a held block gains its hash
    # when it fills, T:482-546) and on those it gained.
    since = min(pre.num_cached_block.get(rid, 0) if kept and pre is not None else 0, start)
    for i in range(since, len(mine)):
        key = blocks[i].block_hash
        theirs, h = (key[:-4] if key is not None else None), spec.block_hash.get(mine[i])
        if theirs != h:
            return Difference(f"post_state.kv_cache.block_hash.{mine[i]}", jsonable(h), jsonable(theirs))
    return None


def free_queue_ends(queue: Any, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The first and last `k` block ids of vLLM's free queue (kv_cache_utils.py:486-505)."""
    head, b = [], queue.fake_free_list_head.next_free_block
    for _ in range(k):
        head.append(b.block_id)
        b = b.next_free_block
    tail, b = [], queue.fake_free_list_tail.prev_free_block
    for _ in range(k):
        tail.append(b.block_id)
        b = b.prev_free_block
    return tuple(head), tuple(reversed(tail))


def spec_free_ends(pool: BlockPool, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The first and last `k` blocks of the spec's free queue in pop order (spec/block_pool.py),
    without building it."""
    fresh = range(pool.next_fresh, pool.num_gpu_blocks)
    head = tuple(islice((b for part in (pool.free_front, fresh, pool.free_back) for b in part), k))
    tail = tuple(islice((b for part in (reversed(pool.free_back), reversed(fresh), reversed(pool.free_front))
                         for b in part), k))
    return head, tuple(reversed(tail))


__all__ = ["FREE_ENDS", "check_delta", "free_queue_ends", "kv_difference", "read_small_parts",
           "spec_free_ends", "table_difference", "touched_ids"]
