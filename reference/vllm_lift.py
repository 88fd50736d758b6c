"""`lift`: vLLM's scheduler objects (0.20.0 ... 0.34.0) as the spec's values.

A `Scheduler` (or `AsyncScheduler`) becomes a `SchedulerState`, a vLLM
`Request` a spec `Request`, a vLLM `SchedulerOutput` a spec `SchedulerOutput`.
The vLLM adapter reports its state with these (`observe`), and the runtime
monitor (monitor/) checks every scheduler call from the lifted
pre-state.  Nothing here imports vLLM at module load: the objects are read by
their attributes, and vLLM's helpers are imported on first use.

Releases 0.20.0 to 0.34.0 lift alike; where a release lacks a structure
(`kv_holding_waiting`, the stale-output counters, the second-hash map, 0.34.0's
`resumed_req_ids` and `req_id_to_index`), has another (0.34.0's `async_kv_waiting`,
its prefix-cache map of block ids, its `prefix_cache_hit_limit`) or orders one
differently (`skipped_waiting`, 0.20.0's free queue), a commented "Bridge" says
so, with the release's source lines.

Scope: what the spec models (one full-attention KV group, no speculative
tokens, encoder inputs, LoRA, connectors, ...).  A state outside it still
lifts; whether a call may be compared is the monitor's scope check.
"""

from __future__ import annotations

import enum
import os
from concurrent.futures import Future
from dataclasses import fields as dataclass_fields
from itertools import chain, compress, repeat
from operator import attrgetter, eq, is_
from typing import Any, Iterable, Mapping, Sequence

from schedspec.spec.block_pool import BlockPool
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.encoder_cache import EMPTY_ENCODER_CACHE, EncoderCache, MultiModalFeature
from schedspec.spec import prefill_throttle
from schedspec.spec.kv_cache import BlockCounts
from schedspec.spec.prefill_throttle import PrefillCadence
from schedspec.spec.request import Request, RequestStatus
from schedspec.spec.state import PAUSE_STATES, SchedulerOutput, SchedulerState
from schedspec.spec.versions import FIELDS_SINCE, UNHASHED_FREE_BLOCKS_FIRST, has, spec_release_for


class LiftError(RuntimeError):
    """vLLM's objects say something the spec's values cannot hold."""


# The fields vLLM's Request and the spec's share, name and meaning (RQ:88-226).
SHARED_REQUEST_FIELDS = (
    "num_prompt_tokens", "max_tokens", "priority", "arrival_time", "num_computed_tokens", "num_output_tokens",
    "num_preemptions", "num_output_placeholders", "num_in_flight_tokens", "num_stale_output_tokens",
    "drop_stale_output", "is_prefill_chunk", "skip_reading_prefix_cache")

# vLLM's SchedulerConfig fields the spec's config has under the same name.  Of
# those 0.34.0 brought (C:78 max_num_inflight_kv_loads, C:223 and :237 the cache-aware
# admission window and threshold), the ones the spec's config has.
SCHEDULER_CONFIG_FIELDS = tuple(f for f in (
    "max_num_batched_tokens", "max_num_scheduled_tokens", "max_num_seqs", "max_num_active_seqs",
    "enable_chunked_prefill", "long_prefill_token_threshold", "policy", "watermark",
    "scheduler_reserve_full_isl", "max_num_inflight_kv_loads", "cache_aware_admission_window",
    "cache_aware_admission_threshold") if f in SchedulerConfig.__dataclass_fields__)


def is_async(sched: Any) -> bool:
    """An AsyncScheduler adds output placeholders (async_scheduler.py:24-56)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    return isinstance(sched, AsyncScheduler)


def lift_config(sched: Any) -> SchedulerConfig:
    """The config the scheduler runs with.  Not validated as a scenario file is:
    vLLM's tests build schedulers directly, skipping the engine's start-up checks
    (e.g. a pool smaller than one max_model_len sequence)."""
    sc = sched.scheduler_config
    # Bridge (fields): a field the release lacks lifts as the value that means
    # its behaviour (spec/versions.py FIELDS_SINCE), e.g. no watermark = 0.0.
    fields = {f: getattr(sc, f) for f in SCHEDULER_CONFIG_FIELDS if hasattr(sc, f)}
    fields.update({f: FIELDS_SINCE[f][1] if f in FIELDS_SINCE else SchedulerConfig.__dataclass_fields__[f].default
                   for f in SCHEDULER_CONFIG_FIELDS if f not in fields})
    fields["policy"] = str(getattr(fields["policy"], "value", fields["policy"])).lower()
    return SchedulerConfig(
        **fields,
        max_model_len=sched.max_model_len,
        block_size=sched.block_size,
        num_gpu_blocks=sched.kv_cache_manager.block_pool.num_gpu_blocks,
        enable_prefix_caching=bool(sched.kv_cache_manager.enable_caching),
        async_scheduling=is_async(sched),
        # Speculative decoding: the drafts per step and the drafter's KV lookahead (S:299-300).
        num_speculative_tokens=getattr(sched, "num_spec_tokens", 0),
        num_lookahead_tokens=getattr(sched, "num_lookahead_tokens", 0),
        # The prompt tokens past a chunk the drafter reads (S:317); bridge: 0.33.0 has it.
        num_prefill_lookahead_tokens=getattr(sched, "num_prefill_lookahead", 0) or 0,
        # The drafter's rows per request, read by schedule() from the config (S:736-737).
        max_num_new_slots_for_drafting=getattr(sched.vllm_config.speculative_config,
                                               "max_num_new_slots_for_drafting", 0) or 0,
        max_loras=sched.lora_config.max_loras if getattr(sched, "lora_config", None) else None,
        # The interval the scheduler applies itself: the config's on an engine without data
        # parallelism, else 1 (S:403-407).  Bridge: no local interval in 0.30.0.
        prefill_schedule_interval=getattr(sched, "local_prefill_interval", 1),
        # Bridge: from 0.31.0 (S:142-144); 0.30.0 has no adaptive threshold.
        long_prefill_token_threshold_adaptive=bool(getattr(sched, "adaptive_long_prefill_threshold", False)),
        # Bridge: 0.33.0 (S:170-201); earlier releases do not have it.
        requires_kv_delivery=bool(getattr(sched, "requires_kv_delivery", False)),
        # The engine's hasher's lookahead (E:242-252); each request's own hasher is lifted with it.
        num_hash_lookahead_tokens=getattr(sched, "num_hash_lookahead_tokens", 0)
        if sched.kv_cache_manager.enable_caching else 0,
        # An EAGLE-family drafter's drop of a prefix hit's last block (S:330-345): the
        # KV cache manager was built with it (S:356).  Bridge: 0.33.0 names it so.
        use_eagle_block_drop=bool(getattr(sched, "use_eagle_block_drop", False)),
        # Encoder inputs: the budget and the cache the scheduler was built with (S:282-295).
        **encoder_budget(sched),
        disable_chunked_mm_input=bool(getattr(sc, "disable_chunked_mm_input", False)),
        vllm_version=spec_release(),
    )


def encoder_budget(sched: Any) -> dict[str, int | None]:
    """The scheduler's encoder budget and cache capacity, as the spec's config holds them.
    A model with no multimodal input gets no budget: vLLM builds its scheduler with 0 for
    both (S:282-285), where the spec's config holds None, the default (it admits no 0).
    No request of such a model carries an encoder input (its input processor refuses
    one), so neither value decides anything there.  A multimodal model's values, 0
    included, are lifted as they are."""
    budget = getattr(sched, "max_num_encoder_input_tokens", 0)
    capacity = getattr(getattr(sched, "encoder_cache_manager", None), "cache_size", 0)
    model = getattr(getattr(sched, "vllm_config", None), "model_config", None)
    if budget == capacity == 0 and not getattr(model, "is_multimodal_model", False):
        return {"max_num_encoder_input_tokens": None, "encoder_cache_size": None}
    return {"max_num_encoder_input_tokens": budget, "encoder_cache_size": capacity}


# Set by `schedspec keep-up X --against Y` in the processes that run vLLM X: states and
# configs are lifted as release Y's, to see what the spec at Y must learn.
COMPARE_WITH_ENV = "SCHEDSPEC_COMPARE_WITH"


def spec_release() -> str:
    """The release the spec models for this process's vLLM: its own, or the newest
    modelled one at or below it (a later release, a development build), or the one
    `schedspec keep-up` compares it with."""
    import vllm

    return os.environ.get(COMPARE_WITH_ENV) or spec_release_for(vllm.__version__) or vllm.__version__


def hasher_lookahead(r: Any) -> int | None:
    """The tokens after each block that request `r`'s block hasher covers: the
    `num_hash_lookahead_tokens` that vLLM's get_request_block_hasher (KU:949-1028)
    closed over; 0 for none or a hasher without it (before 0.33.0); None for a
    hasher of another kind, which the lift cannot read."""
    hasher = r.__dict__.get("_block_hasher")
    if hasher is None:
        return 0
    code = getattr(hasher, "__code__", None)
    if code is None or getattr(hasher, "__qualname__", "") != "get_request_block_hasher.<locals>.request_block_hasher":
        return None
    if "num_hash_lookahead_tokens" not in code.co_freevars:
        return 0
    value = hasher.__closure__[code.co_freevars.index("num_hash_lookahead_tokens")].cell_contents
    return value if type(value) is int and value >= 0 else None


def lift_status(status: Any) -> RequestStatus:
    """vLLM's status by name; both enums number them alike (RQ:422-438)."""
    try:
        return _STATUS[status.name]
    except KeyError:
        raise LiftError(f"request status {status.name} has no counterpart in the spec") from None


_STATUS = {s.name: s for s in RequestStatus}


REQUEST_FIELD_NAMES = tuple(f.name for f in dataclass_fields(Request))
LIFTED_OTHERWISE = ("request_id", "status", "eos_token_id", "stop_token_ids", "prompt_token_ids", "block_hashes",
                    "partial_block_token_ids", "spec_token_ids", "lora_int_id", "grammar", "kv_connector_tokens",
                    "kv_connector_async", "kv_load_finished", "kv_connector_sends", "num_hash_lookahead_tokens",
                    "mm_features")
# A field added to the spec's Request must be lifted too: fail at import, not lift it silently wrong.
if set(REQUEST_FIELD_NAMES) != set(SHARED_REQUEST_FIELDS) | set(LIFTED_OTHERWISE):
    raise ImportError("vllm_lift: the spec's Request fields changed; lift_request does not cover "
                      f"{sorted(set(REQUEST_FIELD_NAMES) ^ (set(SHARED_REQUEST_FIELDS) | set(LIFTED_OTHERWISE)))}")
_shared = attrgetter(*SHARED_REQUEST_FIELDS)


_shared_but_skip = attrgetter(*SHARED_REQUEST_FIELDS[:-1])
assert SHARED_REQUEST_FIELDS[-1] == "skip_reading_prefix_cache"  # _shared_of replaces the last


def _shared_of(r: Any) -> tuple:
    """The shared fields of vLLM request `r`, where one is not an attribute of it.

    Bridge (prefix-cache reads): 0.34.0 replaced `skip_reading_prefix_cache` by
    `prefix_cache_hit_limit`, the leading tokens a prefix hit may cover, 0 for a
    request that skips cache reads, None for no limit (0.34.0 v1/request.py:245,
    364-377); the spec's flag is a limit of 0.  (A limit above 0, a prompt-logprobs
    request's, is outside the spec's scope: monitor/scope.py.)

    Bridge (request counters): 0.25.0 and earlier have no `num_in_flight_tokens`,
    `num_stale_output_tokens` nor `drop_stale_output` (0.28.0 v1/request.py:155-168
    brought them with stale-output handling); they lift as 0 and False, what they
    are outside async scheduling."""
    if "prefix_cache_hit_limit" in r.__dict__:
        try:
            return _shared_but_skip(r) + (r.prefix_cache_hit_limit == 0,)
        except AttributeError:
            pass
    return tuple(getattr(r, f, False if f in ("drop_stale_output", "skip_reading_prefix_cache") else 0)
                 for f in SHARED_REQUEST_FIELDS)


def skips_prefix_cache(r: Any) -> bool:
    """vLLM request `r` reads nothing from the prefix cache (the spec's
    skip_reading_prefix_cache); see `_shared_of` for 0.34.0's limit."""
    if "prefix_cache_hit_limit" in getattr(r, "__dict__", ()):
        return r.prefix_cache_hit_limit == 0
    return bool(getattr(r, "skip_reading_prefix_cache", False))


def skips_external_kv(r: Any) -> bool:
    """vLLM request `r`'s KV connector answer is replaced by none at its admission:
    0.34.0 asks `skip_reading_external_kv` (0.34.0 scheduler.py:1182; true for any
    prefix_cache_hit_limit, v1/request.py:358-362), 0.33.0 `skip_reading_prefix_cache`
    (0.33.0 scheduler.py:1143)."""
    if "prefix_cache_hit_limit" in getattr(r, "__dict__", ()):
        return r.prefix_cache_hit_limit is not None
    return bool(getattr(r, "skip_reading_prefix_cache", False))


LIFT_ATTR = "schedspec_lift"  # on a vLLM Request: (fixed fields, last key, last lifted Request)
# On a vLLM Request: what its KV connector last answered, as the spec's kv_connector_tokens
# (spec/kv_connector.py); the monitor's watch of the connector records it (monitor/scope.py).
KV_CONNECTOR_ATTR = "schedspec_kv_connector_tokens"
KV_ASYNC_ATTR = "schedspec_kv_connector_async"  # and whether it answered an asynchronous load
# A request finished while its asynchronous load was in flight, which vLLM keeps, with its
# blocks, until the load ends (S:3153-3164): the spec's request finished mid-load (spec/kv_connector.py).
HELD_LOAD_ATTR = "schedspec_held_for_load"
# Whether its KV connector answers delay_free when it finishes (S:3180-3200): the spec's
# kv_connector_sends, set where the connector's answer is known (the vLLM adapter's store).
KV_SENDS_ATTR = "schedspec_kv_connector_sends"


def loads_in_flight(sched: Any, request_ids: Iterable[str]) -> list:
    """The vLLM requests among `request_ids` waiting for an asynchronous KV load the
    worker has not reported: finish_requests keeps those (S:3153-3164).  Read before
    the call; `mark_held` after it."""
    loaded = getattr(sched, "finished_recving_kv_req_ids", None) or ()
    requests = getattr(sched, "requests", {})
    return [r for rid in request_ids if (r := requests.get(rid)) is not None
            and r.status.name == "WAITING_FOR_REMOTE_KVS" and rid not in loaded]


def mark_held(sched: Any, requests: Iterable[Any]) -> None:
    """Of `loads_in_flight`'s requests, tag those finish_requests finished and kept:
    the lift then holds them, finished, as the spec does."""
    for r in requests:
        if sched.requests.get(r.request_id) is r and r.is_finished():
            r.__dict__[HELD_LOAD_ATTR] = True
_STATUS_OF: dict[Any, tuple[Any, RequestStatus]] = {}  # vLLM status member -> (it, lift_status(it))


def _spec_status(status: Any) -> RequestStatus:
    """`lift_status`, remembered per vLLM enum member (an enum's `.name` is a slow property)."""
    known = _STATUS_OF.get(status)
    if known is not None and known[0] is status:
        return known[1]
    lifted = lift_status(status)
    if isinstance(status, enum.Enum):
        _STATUS_OF[status] = (status, lifted)
    return lifted


def lift_grammar(r: Any) -> str:
    """Where the request's grammar compilation stands (spec/structured_output.py), read
    as the scheduler reads it (structured_output/request.py `grammar`) without
    resolving the future: "" no structured output; None or a pending future
    "compiling"; an exception "failed"; a grammar "compiled"."""
    so = getattr(r, "structured_output_request", None)
    if so is None:
        return ""
    # A test's stand-in (a Mock) has no future inside: its `grammar` is what the scheduler reads.
    g = so.__dict__.get("_grammar") if "_grammar" in getattr(so, "__dict__", {}) else getattr(so, "grammar", None)
    if isinstance(g, Future):
        if not g.done():
            return "compiling"
        return "failed" if g.exception() is not None else "compiled"
    if g is None:
        return "compiling"
    return "failed" if isinstance(g, Exception) else "compiled"


def lift_request(r: Any, config: SchedulerConfig, like: Request | None = None, load_finished: bool = False) -> Request:
    """One vLLM Request.  Token ids and block hashes only under prefix caching,
    as the spec keeps them (spec/request.py).

    Lifted requests are cached on the vLLM request, keyed by every value the
    spec's request is made of, so an unchanged request lifts to the same object:
    a state compared with the last one then compares it by identity.  What a
    request is made with (its prompt, its stop tokens) is read once.  `like`, a
    spec request (the monitor passes the spec's answer), is returned itself when
    every field the lift would give equals its own: the same value, compared by
    identity afterwards.  `load_finished`: the worker reported its KV load finished
    (the scheduler's finished_recving_kv_req_ids)."""
    cache = r.__dict__.get(LIFT_ATTR)
    if cache is None or cache[0][0] is not config:
        params = r.sampling_params
        fixed = (config, r.request_id,
                 params.eos_token_id if params is not None else None,
                 tuple(params.stop_token_ids or ()) if params is not None else (),
                 tuple(r.prompt_token_ids or ()) if config.enable_prefix_caching else (),
                 r.lora_request.lora_int_id if getattr(r, "lora_request", None) is not None else 0,
                 (hasher_lookahead(r) or 0) if config.enable_prefix_caching else 0,
                 lift_mm_features(r))
        cache = r.__dict__[LIFT_ATTR] = [fixed, None, None]
    fixed = cache[0]
    try:
        shared = _shared(r)
    except AttributeError:
        shared = _shared_of(r)
    if config.enable_prefix_caching:
        hashes = tuple(r.block_hashes)
        tokens = r.all_token_ids
        # A ConstantList's items are its list's (v1/utils.py:79-80): slice that, not through a method call.
        tail = tuple(getattr(tokens, "_x", tokens)[len(hashes) * config.block_size:])
    else:
        hashes = tail = ()
    drafts = tuple(r.spec_token_ids) if r.spec_token_ids else ()
    grammar = lift_grammar(r) if getattr(r, "structured_output_request", None) is not None else ""
    external = r.__dict__.get(KV_CONNECTOR_ATTR, 0)
    kv = (r.__dict__.get(KV_ASYNC_ATTR, False), load_finished, r.__dict__.get(KV_SENDS_ATTR, False))
    key = (shared, r.status, hashes, tail, drafts, grammar, external, kv)
    if key == cache[1]:
        return cache[2]
    status = _spec_status(r.status)
    if like is not None and like.status is status and _shared(like) == shared \
            and (like.block_hashes, like.partial_block_token_ids, like.request_id, like.eos_token_id,
                 like.spec_token_ids, like.lora_int_id, like.grammar, like.kv_connector_tokens,
                 (like.kv_connector_async, like.kv_load_finished, like.kv_connector_sends),
                 like.num_hash_lookahead_tokens) == \
            (hashes, tail, fixed[1], fixed[2], drafts, fixed[5], grammar, external, kv, fixed[6]) \
            and _same(like.stop_token_ids, fixed[3]) and _same(like.prompt_token_ids, fixed[4]) \
            and _same(like.mm_features, fixed[7]):
        cache[1], cache[2] = key, like
        return like
    values = dict(zip(SHARED_REQUEST_FIELDS, shared))
    values.update(request_id=fixed[1], status=status, eos_token_id=fixed[2],
                  stop_token_ids=fixed[3], prompt_token_ids=fixed[4], block_hashes=hashes,
                  partial_block_token_ids=tail, spec_token_ids=drafts, lora_int_id=fixed[5], grammar=grammar,
                  kv_connector_tokens=external, kv_connector_async=kv[0], kv_load_finished=kv[1], kv_connector_sends=kv[2],
                  num_hash_lookahead_tokens=fixed[6], mm_features=fixed[7])
    lifted = Request.__new__(Request)
    lifted.__dict__ = values  # every field, by name: what Request(...) would hold
    cache[1], cache[2] = key, lifted
    return lifted


def lift_mm_features(r: Any) -> tuple:
    """A request's encoder inputs (RQ `mm_features`): position and identifier.  Every
    placeholder token lifts as an embedding; the spec does not model an is_embed mask."""
    return tuple(MultiModalFeature(f.mm_position.offset, f.mm_position.length, f.identifier)
                 for f in (getattr(r, "mm_features", None) or ()))


def lift_encoder_cache(sched: Any) -> EncoderCache:
    """The encoder cache manager's bookkeeping (ECM:77-94): entries and who references them,
    each request's referenced inputs, and the freeable entries in eviction order.
    Bridge: a release whose manager keeps no `num_embeds_by_hash` lifts it empty;
    the spec models encoder inputs for 0.33.0 only."""
    m = getattr(sched, "encoder_cache_manager", None)
    embeds = getattr(m, "num_embeds_by_hash", None)
    if not embeds or type(embeds) is not dict:  # none, or a test's stand-in (the monitor's scope says so)
        return EMPTY_ENCODER_CACHE
    refs = {rid: {i: sched.requests[rid].mm_features[i].identifier for i in ids}
            for rid, ids in m.request_cached_ids.items() if ids}
    return EncoderCache(cached={h: frozenset(ids) for h, ids in m.cached.items()}, num_embeds=dict(embeds),
                        refs=refs, freeable=tuple(m.freeable))


def _same(a: Any, b: Any) -> bool:
    """a == b, by identity first (a tuple or dict compared with itself is still walked)."""
    return a is b or a == b


def waiting_order(sched: Any) -> tuple[str, ...]:
    """Pop order: block holders are drained first (S:1100-1102); iterating a
    priority queue yields heap pop order (request_queue.py:193-197)."""
    # Bridge (kv_holding_waiting): the queue of waiting requests that hold blocks
    # exists from 0.31.0 (S:1100-1102); 0.30.0 and earlier have `waiting` only.
    holding = getattr(sched, "kv_holding_waiting", ())
    waiting = list(sched.waiting)
    # Bridge (skipped_waiting): up to 0.28.0 requests skipped in a step wait in their
    # own queue, popped before `waiting` under FCFS and by comparing heads under
    # PRIORITY (0.28.0 scheduler.py:2152-2162); 0.31.0 puts them back in `waiting`.
    skipped = list(getattr(sched, "skipped_waiting", ()))
    if skipped:
        waiting = sorted(skipped + waiting) if lift_config_policy(sched) == "priority" else skipped + waiting
    # Bridge (async_kv_waiting): 0.34.0 keeps the requests a KV connector may load
    # asynchronously in a third queue, with max_num_inflight_kv_loads set
    # (0.34.0 scheduler.py:235-238, 2781-2786); `_next_waiting_queue` pops the head of
    # it or of `waiting` whichever goes first (:2830-2840).  Merged in that order.
    parked = list(getattr(sched, "async_kv_waiting", None) or ())
    if parked:
        waiting = merge_queues(waiting, parked, lift_config_policy(sched) == "priority")
    return tuple(r.request_id for r in holding) + tuple(r.request_id for r in waiting)


def merge_queues(waiting: list, parked: list, priority: bool) -> list:
    """`waiting` and `parked` (each in its pop order) as one pop order: the parked
    head first where it goes first, by priority order (Request.__lt__) under
    PRIORITY, by arrival time under FCFS; on a tie `waiting`'s head (0.34.0
    scheduler.py:2830-2840)."""
    out, i, j = [], 0, 0
    while i < len(waiting) and j < len(parked):
        a, b = parked[j], waiting[i]
        if (a < b) if priority else (a.arrival_time < b.arrival_time):
            out.append(a)
            j += 1
        else:
            out.append(b)
            i += 1
    return out + waiting[i:] + parked[j:]


def lift_config_policy(sched: Any) -> str:
    policy = sched.scheduler_config.policy
    return str(getattr(policy, "value", policy)).lower()


def lift_block_counts(sched: Any) -> BlockCounts:
    kv = sched.kv_cache_manager
    blocks: dict[str, int] = {}
    for manager in kv.coordinator.single_type_managers:
        for rid, blks in manager.req_to_blocks.items():
            if blks:
                blocks[rid] = max(blocks.get(rid, 0), len(blks))
    return BlockCounts(kv.block_pool.get_num_free_blocks(), blocks)


POOL_ATTR = "schedspec_lift"  # on vLLM's BlockPool: the last lifted hash map and what it was read from
_block_id, _ref_cnt = attrgetter("block_id"), attrgetter("ref_cnt")


def lift_hash_map(pool: Any) -> tuple[dict, dict]:
    """(hash -> block ids, block id -> hash) from vLLM's prefix-cache map, keys
    without their group id (kv_cache_utils.py:72).

    The map is large and changes little between two calls, mostly by blocks
    cached at its end, so the last lift is reused: whole when the map's keys
    and entries are the same (both compared by identity, in order, and an entry
    holding several blocks, a dict that can change in place, by its block ids
    too), extended when the old map is a prefix of the new one, read again
    otherwise.  Each test is one pass of map() in C.

    Bridge (map entries): up to 0.33.0 an entry is the block itself, or a dict of
    block id -> block, in caching order, for a hash several blocks hold (0.33.0
    block_pool.py:53-135).  0.34.0 keeps a block id per hash, the first of those
    blocks, and the ids of a hash several blocks hold, in caching order, in a map of
    its own, `_dup_ids` (0.34.0 block_pool.py:55-104), which the last lift is reused
    only while it is unchanged (it is seldom anything but empty)."""
    hmap = pool.cached_block_hash_to_block
    cache = hmap._cache  # noqa: SLF001 - vLLM's map has no public view
    dup_ids = hmap.__dict__.get("_dup_ids")
    dups = tuple((key, tuple(ids)) for key, ids in dup_ids.items()) if dup_ids else ()
    last = pool.__dict__.get(POOL_ATTR)
    start, cached, block_hash, multi = 0, {}, {}, []
    if last is not None and last[5] == dups:
        n = len(last[0])
        if n <= len(cache) and all(map(is_, cache, last[0])) and all(map(is_, cache.values(), last[1])) \
                and all(tuple(entry) == ids for entry, ids in last[2]):
            if n == len(cache):
                return last[3], last[4]
            start, cached, block_hash, multi = n, dict(last[3]), dict(last[4]), list(last[2])
    keys, entries = list(cache), list(cache.values())
    several = dict(dups)
    for key, entry in zip(keys[start:], entries[start:]):
        h = key[:-4]  # the hash without its 4-byte group id
        if type(entry) is int:  # 0.34.0: a block id
            blocks = several.get(key) or (entry,)
        elif type(entry) is dict:
            blocks = tuple(entry)
            multi.append((entry, blocks))
        else:
            blocks = (entry.block_id,)
        cached[h] = blocks
        for b in blocks:
            block_hash[b] = h
    pool.__dict__[POOL_ATTR] = (keys, entries, multi, cached, block_hash, dups)
    return cached, block_hash


TABLES_ATTR = "schedspec_tables"  # on vLLM's block-table manager: each table's blocks and ids, last lifted


def lift_tables(manager: Any, like: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, tuple[int, ...]], list[list]]:
    """Each request's block ids (tables holding no block left out), and the tables.

    A block's id never changes (its index in the pool, kv_cache_utils.py:166), so
    a table holding the very blocks it held at the last lift (by identity, in
    order: a pass of map() in C over the list, touching no block) has the same
    ids, and one that starts with them only needs the blocks appended since read.
    Ids equal to `like`'s (the spec's tables) are kept as `like`'s own tuple."""
    # First, all at once in C: the tables hold exactly `like`'s ids, in its order.
    held = manager.req_to_blocks
    tables = list(filter(None, held.values()))
    if len(tables) == len(like) and all(map(eq, compress(held, held.values()), like)) \
            and list(map(len, tables)) == list(map(len, like.values())) \
            and list(map(_block_id, chain.from_iterable(tables))) == list(chain.from_iterable(like.values())):
        return like, tables
    last = manager.__dict__.get(TABLES_ATTR) or {}
    seen, req_to_blocks, tables = {}, {}, []
    for rid, blks in manager.req_to_blocks.items():
        if blks:
            entry = last.get(rid)
            if entry is None or len(blks) != len(entry[0]) or not all(map(is_, blks, entry[0])):
                entry = (list(blks), table_ids(blks, entry))
            had = like.get(rid)
            if had is not None and had is not entry[1] and had == entry[1]:
                entry = (entry[0], had)
            seen[rid] = entry
            req_to_blocks[rid] = entry[1]
            tables.append(blks)
    manager.__dict__[TABLES_ATTR] = seen
    return req_to_blocks, tables


def table_ids(blks: list, last: tuple[list, tuple] | None) -> tuple[int, ...]:
    if last is not None:
        nodes, ids = last
        n = len(nodes)
        if n < len(blks) and all(map(is_, blks, nodes)):
            return ids + tuple(map(_block_id, blks[n:]))
    return tuple(map(_block_id, blks))


def lift_ref_cnt(req_to_blocks: Mapping[str, tuple[int, ...]], tables: list[list],
                 like: Mapping[int, int] | None) -> Mapping[int, int]:
    """Block id -> vLLM's ref_cnt, for the held blocks: a block in several tables
    is one block, with one id and one count; the null block (P:164) is nobody's.
    `like` itself when equal: each (id, count) read is `like`'s, and `like` has no
    other key (it has as many as there are distinct ids), all in C."""
    ids = list(chain.from_iterable(req_to_blocks.values()))
    counts = list(map(_ref_cnt, chain.from_iterable(tables)))
    if like is not None and list(map(like.get, ids)) == counts and len(like) == len(set(ids)) and 0 not in like:
        return like
    ref_cnt = dict(zip(ids, counts))  # one dict(zip): a dict.update per table costs several times more
    ref_cnt.pop(0, None)
    return ref_cnt


_UNHASHED_FIRST: dict[str, bool] = {}  # vLLM release -> has(it, UNHASHED_FREE_BLOCKS_FIRST)


def lift_block_pool(sched: Any, config: SchedulerConfig | None = None, like: BlockPool | None = None) -> BlockPool:
    """vLLM's pool block by block (spec/block_pool.py): the free queue in pop
    order (kv_cache_utils.py:486), vLLM's block ids and hashes.  `like`, a pool
    of the spec (the monitor passes the spec's answer): each part equal to its
    own is taken from it (equal values), and it is returned itself when every
    part is, so that comparing the two is one identity test (see lift_request)."""
    kv = sched.kv_cache_manager
    pool = kv.block_pool
    managers = kv.coordinator.single_type_managers
    if len(managers) != 1:
        raise LiftError(f"{len(managers)} KV cache groups; the spec models one")
    (manager,) = managers
    # Bridge (second hashes): the map of a block's extra hashes exists from 0.25.0;
    # 0.20.0's BlockPool has none (0.20.0 v1/core/block_pool.py:158-182).
    if getattr(pool, "cached_block_hashes_by_block", None):
        # Only partial-block caching (hash block < block size) adds these.
        raise LiftError("a block carries a second prefix-cache hash")
    # Held blocks are those in some block table, hashed ones those in the hash
    # map (a block's hash and its map entry are set and reset together,
    # block_pool.py:630-686): neither needs a pass over the whole pool.
    req_to_blocks, tables = lift_tables(manager, like.req_to_blocks if like is not None else {})
    ref_cnt = lift_ref_cnt(req_to_blocks, tables, like.ref_cnt if like is not None else None)
    cached, block_hash = lift_hash_map(pool)
    free = []
    append = free.append
    b = pool.free_block_queue.fake_free_list_head.next_free_block
    nxt = b.next_free_block
    while nxt is not None:  # the fake tail has none (kv_cache_utils.py:486-505)
        append(b.block_id)
        b, nxt = nxt, nxt.next_free_block
    # The spec keeps the queue as unhashed blocks, then hashed ones (spec/block_pool.py):
    # vLLM prepends what it frees without a hash and appends what it frees with one
    # (P:799-839), and a free block gains no hash, so that is the only order in
    # which hashed and unhashed free blocks can sit.
    # Bridge (free order): 0.20.0 appends every freed block, hashed or not (spec/versions.py
    # UNHASHED_FREE_BLOCKS_FIRST): its queue is kept whole as the back, in order.
    release = (config or lift_config(sched)).vllm_version
    unhashed_first = _UNHASHED_FIRST.get(release)
    if unhashed_first is None:
        unhashed_first = _UNHASHED_FIRST[release] = has(release, UNHASHED_FREE_BLOCKS_FIRST)
    k = len(free) if unhashed_first else 0
    while k and free[k - 1] in block_hash:
        k -= 1
    if k and not block_hash.keys().isdisjoint(free[:k]):
        stray = next(b for b in free[:k] if b in block_hash)
        raise LiftError(f"free block {stray} has a prefix-cache hash but sits before unhashed free blocks")
    # Blocks never handed out stay a range in the spec (spec/block_pool.py): the unhashed part's
    # longest tail of consecutive ids up to the pool's last is lifted as that range, so a
    # mostly unused pool of a million blocks is a few numbers to the spec's steps.
    # Which blocks sit where such a run ending at the last id would put them: one pass of
    # map() in C, then the trailing matches counted in C (a loop in Python cost as much as
    # the walk).
    n, run = pool.num_gpu_blocks, 0
    if k and free[k - 1] == n - 1:
        placed = list(map(eq, reversed(free[:k]), range(n - 1, n - k - 1, -1)))
        try:
            run = placed.index(False)
        except ValueError:
            run = k
    j = k - run
    parts = (n, tuple(free[:j]), n - (k - j), tuple(free[k:]), ref_cnt, block_hash,
             cached, req_to_blocks, dict(manager.num_cached_block), unhashed_first)
    if like is not None:
        theirs = tuple(map(getattr, repeat(like), POOL_PARTS))
        same = tuple(map(_same, parts[:5] + parts[7:], theirs[:5] + theirs[7:]))
        # The hash maps (parts 5, 6), large, are compared only when all else agrees and their
        # newest keys do: a hash made in the call is the spec's, not vLLM's (check.py renames it).
        if all(same) and newest(cached) == newest(like.cached) and _same(cached, like.cached) \
                and _same(block_hash, like.block_hash):
            return like
        # The hash maps are the last lift's objects while vLLM's map is unchanged (lift_hash_map): kept.
        parts = tuple(b if eq else a for a, b, eq in zip(parts, theirs, same[:5] + (False, False) + same[5:]))
    return BlockPool(*parts)


def newest(d: Mapping) -> Any:
    """The last key inserted into a dict (None if empty, or not a dict: then no shortcut is taken)."""
    return next(reversed(d), None) if type(d) is dict else None


POOL_PARTS = tuple(f.name for f in dataclass_fields(BlockPool))
if POOL_PARTS != ("num_gpu_blocks", "free_front", "next_fresh", "free_back", "ref_cnt", "block_hash", "cached",
                  "req_to_blocks", "num_cached_block", "unhashed_first"):  # lift_block_pool builds it by position
    raise ImportError(f"vllm_lift: the spec's BlockPool fields changed: {POOL_PARTS}")


def held_by_spec(r: Any) -> bool:
    """Whether vLLM request `r` is one of the spec state's requests: unfinished, or
    finished mid-load (mark_held) or with its KV being sent (KV_SENDS_ATTR)."""
    return not r.is_finished() or bool(r.__dict__.get(HELD_LOAD_ATTR) or r.__dict__.get(KV_SENDS_ATTR))


def lift_state(sched: Any, config: SchedulerConfig | None = None,
               finish_order: Sequence[str] = (), like: SchedulerState | None = None) -> SchedulerState:
    """The scheduler's state.  vLLM keeps the ids finished since the last
    schedule() in a set (S:223); `finish_order` gives the order they finished in
    where the caller recorded it, the rest follow sorted.  `like`: see lift_request."""
    config = config or lift_config(sched)
    alike = like.requests if like is not None else {}
    loaded = getattr(sched, "finished_recving_kv_req_ids", None) or ()
    requests = {rid: lift_request(r, config, alike.get(rid), rid in loaded) for rid, r in sched.requests.items()
                if held_by_spec(r)}
    pool = like.block_pool if like is not None else None
    vset = sched.finished_req_ids
    finished = [rid for rid in dict.fromkeys(finish_order) if rid in vset]
    finished += sorted(set(vset) - set(finished))
    return SchedulerState(
        config=config,
        requests=requests,
        running=tuple(r.request_id for r in sched.running),
        waiting=waiting_order(sched),
        kv_cache=lift_block_pool(sched, config, pool) if config.enable_prefix_caching else lift_block_counts(sched),
        finished_req_ids=tuple(finished),
        grammar_compile_error_reqs=tuple(getattr(sched, "grammar_compile_error_reqs", None) or ()),
        pause_state=lift_pause_state(sched),
        prefill_cadence=lift_prefill_cadence(sched, config),
        encoder_cache=lift_encoder_cache(sched),
    )


def lift_prefill_cadence(sched: Any, config: SchedulerConfig) -> PrefillCadence:
    """Prefill throttling's state (spec/prefill_throttle.py), for the release the spec
    models it for; the initial one for the others, as the spec keeps it there."""
    if not prefill_throttle.modelled(config):
        return PrefillCadence()
    interval = config.prefill_schedule_interval
    local = interval > 1  # the spec counts steps under a local interval only (prefill_throttle.py)
    last = sched.last_prefill_step
    return PrefillCadence(
        num_executed_steps=sched.num_executed_steps if local else 0,
        last_prefill_step=last if local and last != -interval else None,  # -interval: none yet (S:420)
        capacity_bound=bool(sched.prefill_capacity_bound),
        deferred_waiting=tuple(sorted(r.request_id for r in sched.deferred_waiting)))


def lift_pause_state(sched: Any) -> str:
    """vLLM's PauseState by name (sched/interface.py:24-32; every release from 0.20.0)."""
    state = getattr(sched, "_pause_state", None)
    if state is None:
        return "UNPAUSED"
    name = getattr(state, "name", None)
    if name not in PAUSE_STATES:
        raise LiftError(f"pause state {state!r} has no counterpart in the spec")
    return name


def waiting_status(r: Any) -> str:
    """vLLM request `r`'s status name before a schedule(), as lift_output's
    `status_before` needs it: for one waiting for remote KVs, the one its promotion
    will give it, which tells a resumed request from a new one (S:3676-3681)."""
    name = r.status.name
    if name == "WAITING_FOR_REMOTE_KVS":
        return "PREEMPTED" if r.num_preemptions else "WAITING"
    return name


def lift_output(out: Any, preempted: Sequence[str], *, prefix_caching: bool,
                status_before: Mapping[str, str] | None = None,
                external: Mapping[str, int] | None = None, holders: Iterable[str] = ()) -> SchedulerOutput:
    """vLLM's SchedulerOutput as the spec's.  `preempted` is the order of the
    `_preempt_request` calls (vLLM keeps the ids in a set, S:1853).  With the V2
    model runner resumed requests travel as new ones; `status_before` (status
    names before the call) tells them apart.  `external`: the tokens a KV
    connector answered in the call, by request, which an admission's
    num_computed_tokens counts beside its prefix hit (S:1255-1257).  `holders`: waiting
    requests that held KV blocks before the call (a KV load's); their admission
    looks nothing up (S:1301-1311), so it has no prefix hit."""
    grants = tuple(out.num_scheduled_tokens.items())  # insertion order = grant order
    new = [d.req_id for d in out.scheduled_new_reqs]
    cached = out.scheduled_cached_reqs
    # Bridge (resumed requests): 0.34.0 sends every admission, a resumed one too, among
    # the new requests (0.34.0 scheduler.py:1619-1626) and its CachedRequestData has no
    # resumed_req_ids (0.34.0 sched/output.py:139-158); the spec's output for 0.34.0 has
    # no resumed requests either (spec/versions.py RESUMED_SENT_AS_NEW).
    resumed_ids = getattr(cached, "resumed_req_ids", None) or ()
    resumed = [rid for rid in cached.req_ids if rid in resumed_ids]
    running = [rid for rid in cached.req_ids if rid not in resumed_ids]
    # The tokens each admitted request found in the prefix cache: its
    # num_computed_tokens as admission set it, which the output records before
    # _update_after_schedule advances it (S:1714-1732, 1991-2014).
    hits_at = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
    hits_at.update((rid, n) for rid, n in zip(cached.req_ids, cached.num_computed_tokens) if rid in resumed_ids)
    if status_before is not None:
        resumed = [rid for rid in new if status_before.get(rid) == "PREEMPTED"] + resumed
        new = [rid for rid in new if status_before.get(rid) != "PREEMPTED"]
    preempted = tuple(preempted)
    if set(preempted) != set(out.preempted_req_ids) or len(set(preempted)) != len(preempted):
        raise LiftError(f"preemption record {list(preempted)} does not match vLLM's "
                        f"preempted_req_ids {sorted(out.preempted_req_ids)}")
    granted = [rid for rid, _ in grants]
    admitted = set(new) | set(resumed)
    admission_order = [rid for rid in granted if rid in admitted]
    if granted != running + admission_order or sorted(granted) != sorted(running + new + resumed):
        raise LiftError(f"grant order {granted} is not the running loop's {running} "
                        f"followed by admissions {new + resumed}")
    loaded = {rid: external[rid] for rid in admission_order if external and external.get(rid)}
    return SchedulerOutput(
        num_scheduled_tokens=grants, scheduled_new_reqs=tuple(new), scheduled_resumed_reqs=tuple(resumed),
        scheduled_running_reqs=tuple(running), preempted_req_ids=preempted,
        prefix_hits=tuple((rid, hits_at[rid] - loaded.get(rid, 0)) for rid in admission_order if rid not in holders)
        if prefix_caching else (),
        kv_connector_hits=tuple(loaded.items()),
        scheduled_spec_decode_tokens=tuple((rid, tuple(ids)) for rid, ids in
                                           (getattr(out, "scheduled_spec_decode_tokens", None) or {}).items()),
        scheduled_encoder_inputs=tuple((rid, tuple(ids)) for rid, ids in
                                       (getattr(out, "scheduled_encoder_inputs", None) or {}).items()),
        free_encoder_mm_hashes=tuple(getattr(out, "free_encoder_mm_hashes", None) or ()))


def sampled_tokens(model_runner_output: Any, req_ids: Iterable[str]) -> dict[str, list[int]]:
    """The tokens the model sampled for each of `req_ids`, from a ModelRunnerOutput
    (v1/outputs.py): [] for a request it reports nothing for.  A request's row is its
    position in the output's `req_ids`, as 0.34.0's update_from_output finds it
    (0.34.0 scheduler.py:2355-2358); up to 0.33.0 the output's `req_id_to_index`,
    which the scheduler read instead (0.33.0 scheduler.py:2341), is that where given."""
    index = getattr(model_runner_output, "req_id_to_index", None)
    if index is None:
        index = {rid: i for i, rid in enumerate(model_runner_output.req_ids or ())}
    sampled = model_runner_output.sampled_token_ids
    out = {}
    for rid in req_ids:
        i = index.get(rid)
        out[rid] = list(map(int, sampled[i])) if (i is not None and sampled) else []
    return out


__all__ = ["HELD_LOAD_ATTR", "KV_SENDS_ATTR", "LiftError", "held_by_spec", "SHARED_REQUEST_FIELDS", "is_async", "lift_block_counts", "lift_block_pool",
           "encoder_budget", "lift_config", "lift_encoder_cache", "lift_output", "lift_pause_state", "lift_prefill_cadence",
           "lift_request", "lift_state", "lift_status", "sampled_tokens",
           "loads_in_flight", "mark_held", "waiting_order", "waiting_status"]
