"""Which scheduler calls the spec can judge: the features a call uses that the
spec does not model, by name.

A call that uses one is *outside scope*: counted with the feature's name and not
compared.  Everything else is compared, so a feature missing from this list
would show as a divergence, never as a silent skip.  Each feature has a test
that builds it and sees the call classified (tests/test_monitor_scope.py).

Scheduler-wide features come from the config the scheduler was built with
(S:87-516); request features from each request the call can touch.  Features
fixed at a request's creation are read once per request.

Releases 0.20.0 to 0.34.0 (`schedspec peer-tests --version X`): an attribute a
release's Scheduler or Request does not have is read as the value that means
the feature is absent there, each such read marked "Bridge" with the release
that brought the attribute; the fields every Scheduler.__init__ sets are the
release's (`init_fields`).
"""

from __future__ import annotations

from typing import Any, Iterable

from schedspec.reference import vllm_lift
from schedspec.reference.vllm_lift import lift_pause_state
from schedspec.spec import versions

# Feature names, as reports and the peer-tests table print them.
SPECULATIVE_DECODING = "speculative decoding"
KV_CONNECTOR = "KV connector"
EC_CONNECTOR = "encoder-cache connector"
ENCODER_INPUTS = "encoder inputs"
ENCODER_DECODER = "encoder-decoder model"
KV_CACHE_GROUPS = "non-full-attention KV groups"
HASH_BLOCK_SIZE = "hash block size != block size"
PP_DECODE_STAGGER = "pipeline-parallel decode stagger"
CONTEXT_PARALLEL = "context parallelism"
POOLING = "pooling"
PAUSE = "pause state"
PREFILL_THROTTLING = "prefill throttling"
ADAPTIVE_THRESHOLD = "adaptive long-prefill threshold"
AUX_OUTPUT_CONNECTOR = "aux output connector"
LORA = "LoRA"
STRUCTURED_OUTPUT = "structured output"
GRAMMAR_ACCEPTANCE = "a grammar judging sampled tokens"
STREAMING_INPUT = "streaming input"
CACHE_SALT = "cache salt"
PROMPT_EMBEDS = "prompt embeddings"
REPETITION_DETECTION = "repetition detection"
DELAYED_FREE = "finished request still held"
MM_ENCODER_ONLY = "multimodal encoder-only instance"
HASH_LOOKAHEAD = "hash lookahead tokens"
NO_BLOCK_HASHER = "request without a block hasher (prefix caching)"
HAND_ASSEMBLED = "scheduler assembled without __init__"
PATCHED_INTERNALS = "scheduler method replaced on the object"
SPY_CHANGED_STEP = "a spy on a scheduler method changed the step"
KV_BLOCK_SIZE = "KV group block size != scheduler block size"
PREFIX_REPLAY = "prefix replay window"
MAMBA_ALIGNED_SPLIT = "Mamba block-aligned chunks"
KV_LOAD_CAP = "cap on in-flight KV loads"
PREFIX_HIT_LIMIT = "prefix-cache hit limit (prompt logprobs)"

# Statuses the spec has no rule for (RQ:422-438).
BLOCKED_STATUSES = {
    "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR": STRUCTURED_OUTPUT,
    "WAITING_FOR_REMOTE_KVS": KV_CONNECTOR,
    "WAITING_FOR_STREAMING_REQ": STREAMING_INPUT,
}

# Of those, the ones the spec models from some release on: status -> the feature
# (spec/versions.py FEATURES_SINCE; spec/structured_output.py, spec/kv_connector.py).
MODELLED_BLOCKED_STATUSES = {"WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR": versions.STRUCTURED_OUTPUT,
                             "WAITING_FOR_REMOTE_KVS": versions.KV_CONNECTOR}

_STATIC = "schedspec_scope"  # the attribute a request's creation-time features are kept in


def scheduler_features(sched: Any, throttle_prefills: bool = False) -> list[str]:
    """Features of the scheduler now (read on every call: vLLM's tests attach
    connectors and patch methods after construction), and of this call's
    arguments."""
    if not init_fields() <= sched.__dict__.keys():  # object.__new__(Scheduler) and a few fields set
        return [HAND_ASSEMBLED]
    out = []
    vc = sched.vllm_config
    if (vc.speculative_config is not None or sched.num_spec_tokens or sched.num_lookahead_tokens
            or getattr(sched, "num_prefill_lookahead", 0)) and not spec_decode_in_scope(sched):
        out.append(SPECULATIVE_DECODING)
    # The scheduler's own num_hash_lookahead_tokens decides nothing here: the block pool
    # puts it in KV events only (P:298-343), and the scheduler re-hashes streaming requests
    # with it (S:1150-1153), outside scope anyway; each request's hasher is judged per call.
    out += _kv_connector_features(sched)
    if getattr(sched, "is_encoder_decoder", False):
        out.append(ENCODER_DECODER)
    if not encoder_cache_modelled(sched):
        out.append(ENCODER_INPUTS)
    groups = sched.kv_cache_config.kv_cache_groups
    if len(groups) != 1 or type(groups[0].kv_cache_spec) is not full_attention_spec():
        out.append(KV_CACHE_GROUPS)
    elif groups[0].kv_cache_spec.block_size != sched.block_size and sched.dcp_world_size == sched.pcp_world_size == 1:
        # vLLM allocates in the group's blocks (single_type_kv_cache_manager.py:109);
        # the spec in the scheduler's.  EngineCore never builds this, a unit test can.
        out.append(KV_BLOCK_SIZE)
    if getattr(sched, "is_mm_encoder_only", False):
        # Samples nothing and stops a request once its prompt is computed (S:1390, 2475-2486).
        out.append(MM_ENCODER_ONLY)
    if getattr(sched, "prefix_replay_tokens", 0):
        out.append(PREFIX_REPLAY)
    if getattr(sched, "need_mamba_block_aligned_split", False):  # chunks cut to Mamba blocks (S:875-879, 1399-1420)
        out.append(MAMBA_ALIGNED_SPLIT)
    if hash_block_size(sched) != sched.block_size:
        out.append(HASH_BLOCK_SIZE)
    if sched.dcp_world_size > 1 or sched.pcp_world_size > 1:
        out.append(CONTEXT_PARALLEL)
    # Bridge (num_sampled_tokens_per_step): from 0.25.0; 0.20.0 tells pooling by
    # the model's runner type alone.
    if getattr(sched, "num_sampled_tokens_per_step", 1) == 0 or vc.model_config.runner_type == "pooling":
        out.append(POOLING)
    # Prefill throttling: modelled for 0.33.0 (spec/prefill_throttle.py); 0.30.0 has the
    # data-parallel gate with its own queue of skipped requests.
    if (throttle_prefills or getattr(sched, "local_prefill_interval", 1) > 1) \
            and not newest_rules(versions.PREFILL_THROTTLE):
        out.append(PREFILL_THROTTLING)
    # Bridge (adaptive_long_prefill_threshold): from 0.31.0; none before.  Modelled for
    # 0.33.0 (spec/config.py long_prefill_threshold).
    if getattr(sched, "adaptive_long_prefill_threshold", False) and sched.scheduler_config.long_prefill_token_threshold \
            and not newest_rules(versions.ADAPTIVE_THRESHOLD):
        out.append(ADAPTIVE_THRESHOLD)
    # Under PAUSED_NEW vLLM still admits the waiting requests holding blocks
    # (S:1100-1107), which only a KV connector or streaming input leaves in the
    # waiting queues: modelled for 0.33.0 (spec/scheduler.py schedule_waiting).
    if lift_pause_state(sched) == "PAUSED_NEW" and getattr(sched, "kv_holding_waiting", None) \
            and not newest_rules(versions.KV_CONNECTOR):
        out.append(PAUSE)
    if getattr(sched, "num_waiting_for_streaming_input", 0):
        out.append(STREAMING_INPUT)
    if patched(sched):
        out.append(PATCHED_INTERNALS)
    return out


def _kv_connector_features(sched: Any) -> list[str]:
    """The KV connector's features the spec does not model, in scheduler_features' order."""
    out = []
    # A connector the watch can judge call by call is named only where it acts (ConnectorWatch).
    for attr, feature in CONNECTOR_ATTRS:
        conn = getattr(sched, attr, None)
        if (conn is not None and not connector_watchable(conn, feature)) or \
                (feature == KV_CONNECTOR and getattr(sched, "defer_block_free", False)):
            out.append(feature)
    # KV loads that failed, or whose start waits for the step in flight (S:1529-1539,
    # 2334-2344): not modelled (spec/kv_connector.py).
    if getattr(sched, "failed_recving_kv_req_ids", None) or getattr(sched, "defer_async_loads", False) \
            or getattr(sched, "deferred_loads", None):
        out.append(KV_CONNECTOR)
    if failed_load_residue(sched):
        out.append(KV_CONNECTOR)
    # Bridge (max_num_inflight_kv_loads): 0.34.0's cap on asynchronous KV loads, with the
    # queue of requests that may load asynchronously it sorts them into (0.34.0
    # scheduler.py:2781-2786) and the loads it starts while the batch is full
    # (:1090-1113, 1325-1334); it acts only through a KV connector.  Not modelled unless
    # the spec's config has the field (vllm_lift.SCHEDULER_CONFIG_FIELDS).
    if (getattr(sched.scheduler_config, "max_num_inflight_kv_loads", None) is not None
            and getattr(sched, "connector", None) is not None
            and "max_num_inflight_kv_loads" not in vllm_lift.SCHEDULER_CONFIG_FIELDS) \
            or getattr(sched, "async_kv_waiting", None):
        out.append(KV_LOAD_CAP)
    return out


def _holds_kv_blocks(r: Any) -> bool:
    """vLLM's `_holds_kv_blocks` (0.34.0 scheduler.py:2764-2774), as the spec's
    kv_connector.holds_kv_blocks."""
    return r.num_computed_tokens > 0 or r.status.name == "WAITING_FOR_REMOTE_KVS"


def failed_load_residue(sched: Any) -> bool:
    """What a failed asynchronous KV load recovered by recomputation leaves behind
    (failed loads are not modelled, spec/kv_connector.py): its computed tokens are
    reset (0.34.0 scheduler.py:3846-3849) and its blocks freed when it is promoted
    (:3625-3646), yet it stays in the holders' queue, and its reservation stays
    counted until it is admitted (:3679, 1604-1662; 0.33.0: in `_inflight_prefills`,
    scheduler.py:1542, 1593, 1871).  The spec tells both by holding blocks
    (kv_connector.num_holding, reserved_blocks), so a waiting request in either
    that holds none is a state it cannot hold.  Each of these is a handful of
    requests at most."""
    if any(not _holds_kv_blocks(r) for r in getattr(sched, "kv_holding_waiting", None) or ()):
        return True
    for reserving in (getattr(sched, "_parked_reservations", None), getattr(sched, "_inflight_prefills", None)):
        if reserving and any(r.status.name != "RUNNING" and not r.is_finished() and not _holds_kv_blocks(r)
                             for r in reserving):
            return True
    return False


# The scheduler's attribute for each connector, and the feature it is named by.
CONNECTOR_ATTRS = (("connector", KV_CONNECTOR), ("ec_connector", EC_CONNECTOR),
                   ("aux_output_connector", AUX_OUTPUT_CONNECTOR))


def connector_watchable(conn: Any, feature: str) -> bool:
    """A connector whose calls can be judged one by one (ConnectorWatch): on vLLM
    0.33.0 or later, whose code paths with each connector were read (0.34.0's differ
    only where max_num_inflight_kv_loads is set, KV_LOAD_CAP: may_load_async, 0.34.0
    scheduler.py:2781-2786), and an object the watch can wrap methods on.  A KV
    connector also without divergent hybrid hits (S:684-688; its paths: S:941-943,
    1169-1253, 1529-1562, 3483-3535).  An aux output
    connector of any class, a test's Mock included: the scheduler reads only its answers
    to max_cache_hit and cap_external_hit (S:1156-1160, 1228-1236), which the watch
    judges (a Mock's answer, not an int, is named); every other call's result is
    ignored (request_loading S:1600-1603, request_finished S:1869-1870 and 3036-3037,
    reset S:3358-3359) or goes to the output alone (take_output, S:2505-2508;
    build_connector_meta, S:1814-1819)."""
    if not (newest_rules(versions.KV_CONNECTOR) and hasattr(conn, "__dict__")):
        return False
    if feature == KV_CONNECTOR:
        return getattr(conn, "supports_divergent_local_hybrid_hits", True) is False
    return True


class ConnectorWatch:
    """What the connectors decided during one scheduler call.

    The spec models what a KV connector answers at an admission
    (spec/kv_connector.py): tokens loaded within the step or asynchronously, or
    None, which skips the request (S:1177-1190, 1576-1607).  The watch records each
    answer on the vLLM request (vllm_lift.KV_CONNECTOR_ATTR, what the lift reads as
    kv_connector_tokens: the local hit it was asked beyond plus the tokens
    answered; KV_ASYNC_ATTR, read as kv_connector_async) and in `external` (the
    tokens loaded this call, which lift_output needs).  Beyond that answer
    vLLM 0.33.0 hands the connector only results (S:1529-1548, 1810-1811), with
    nothing the step depends on.  Likewise an aux output connector only caps
    prefix hits (S:1156-1160, 1228-1236); the rest is metadata for the workers.
    An encoder-cache connector acts on requests with encoder inputs (S:845-851,
    2239, 2748-2755), themselves outside scope, and otherwise only through what
    it reports.  So such a call is compared, and the watch names a connector only when one
    of its answers did something the spec does not model:
      - KV: `has_pending_block_frees()` true (no preemption, S:941-943); an answer at a
        finish that is not a (bool, params) pair (a bool one is the spec's
        kv_connector_sends, recorded on the request as vllm_lift.KV_SENDS_ATTR), or a
        partial tail it keeps (S:3517-3535).  Its `requires_kv_delivery`
        (preemptions drop output in flight, S:988-992) is the config's (lift_config);
      - aux output: a cap below the request's prefix hit, or an external hit cut;
      - encoder cache: requests whose encoder input it can no longer obtain,
        finished with an error (S:2626-2629), or a finished request whose blocks
        it keeps (S:3186-3189).
    Each watched method is wrapped on the connector object for the call only and
    calls through, so a test's own replacement still sees every call."""

    KV = ("get_num_new_matched_tokens", "has_pending_block_frees", "request_finished",
          "request_finished_all_groups", "register_finished_partial_tail")
    AUX = ("max_cache_hit", "cap_external_hit")
    EC = ("take_unavailable_requests", "request_finished")

    def __init__(self, sched: Any):
        self.sched = sched
        methods = {KV_CONNECTOR: self.KV, EC_CONNECTOR: self.EC, AUX_OUTPUT_CONNECTOR: self.AUX}
        self.watched = [(obj, methods[feature], feature) for obj, feature in
                        ((getattr(sched, attr, None), feature) for attr, feature in CONNECTOR_ATTRS)
                        if obj is not None and hasattr(obj, "__dict__")]
        self.acted: dict[str, None] = {}
        self.external: dict[str, int] = {}  # request id -> external tokens loaded in this call
        self.answered = False  # some answer other than none: tokens, or None (cannot tell yet)
        self.saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> "ConnectorWatch":
        for obj, names, feature in self.watched:
            d = obj.__dict__
            for name in names:
                inner = getattr(obj, name, None)
                if inner is None:
                    continue
                self.saved.append((obj, name, d.get(name, _ABSENT)))
                d[name] = self.wrap(name, inner, feature)
        return self

    def __exit__(self, *exc: Any) -> None:
        for obj, name, old in reversed(self.saved):
            if old is _ABSENT:
                obj.__dict__.pop(name, None)
            else:
                obj.__dict__[name] = old
        self.saved.clear()

    def wrap(self, name: str, inner: Any, feature: str) -> Any:
        def watched(*args: Any, **kwargs: Any) -> Any:
            result = inner(*args, **kwargs)
            if feature == KV_CONNECTOR and name in SEND_ANSWERS and sends_answer(result) is not None:
                # Modelled: the request's blocks are kept for the send, or freed (kv_connector.py);
                # the spec reads the answer as its kv_connector_sends (monitor.with_connector_answers).
                args[0].__dict__[vllm_lift.KV_SENDS_ATTR] = sends_answer(result)
            elif connector_answer_changes_step(self.sched, name, result, args):
                self.acted[feature] = None
            elif name == "get_num_new_matched_tokens":
                self.record(args, result)
            return result
        watched.schedspec_recorder = True
        return watched

    def record(self, call_args: tuple, result: tuple) -> None:
        """A synchronous answer, as the spec reads it (spec/kv_connector.py)."""
        request, num_local = call_args[0], call_args[1] if len(call_args) > 1 else 0
        ext = result[0]
        if vllm_lift.skips_external_kv(request):  # its answer is replaced by none (S:1182-1183)
            ext = 0
        # What the store holds, as far as the answer tells: the local hit plus the
        # tokens answered; for none, any hold within the local hit (one already known is kept).
        known = request.__dict__.get(vllm_lift.KV_CONNECTOR_ATTR, 0)
        request.__dict__[vllm_lift.KV_CONNECTOR_ATTR] = None if ext is None else num_local + ext if ext else \
            known if type(known) is int and known <= num_local else 0
        request.__dict__[vllm_lift.KV_ASYNC_ATTR] = bool(ext) and result[1] is True
        self.answered = self.answered or ext != 0
        if ext:
            self.external[request.request_id] = ext

    def features(self, result: Any) -> tuple[str, ...]:
        """The connectors that changed this call (after it, given its result)."""
        return tuple(self.acted)


_ABSENT = object()


def connector_watch(sched: Any) -> ConnectorWatch | None:
    """A ConnectorWatch for a call on `sched`, or None when it has no connector to
    watch (the common case, without the cost of one per call)."""
    d = sched.__dict__
    if all(d.get(attr) is None for attr, _ in CONNECTOR_ATTRS):
        return None
    return ConnectorWatch(sched)


# A KV connector's answers at a request's finish: (delay_free, kv_transfer_params).
SEND_ANSWERS = ("request_finished", "request_finished_all_groups")


def sends_answer(result: Any) -> bool | None:
    """A KV connector's answer at a finish as the spec reads it (kv_connector_sends, S:3180-3200,
    3517-3536): whether it keeps the blocks to send them; None for an answer of another shape."""
    if isinstance(result, tuple) and len(result) == 2 and type(result[0]) is bool:
        return result[0]
    return None


def connector_answer_changes_step(sched: Any, name: str, result: Any, call_args: tuple) -> bool:
    """Whether a connector's answer `result` to `name(*call_args)` makes vLLM 0.33.0
    do something it would not do without that connector (ConnectorWatch)."""
    request = call_args[0] if call_args else None
    if name == "get_num_new_matched_tokens":
        if not (isinstance(result, tuple) and len(result) == 2 and len(call_args) == 2 and type(call_args[1]) is int):
            return True
        ext, load_async = result
        if vllm_lift.skips_external_kv(request):
            return False  # its answer is replaced by none (S:1182-1183)
        # Modelled: a number of tokens loaded within the step or asynchronously, or None
        # (spec/kv_connector.py).
        return not (ext is None or (type(ext) is int and ext >= 0 and type(load_async) is bool))
    if name == "has_pending_block_frees" or name == "register_finished_partial_tail":
        return result is not False
    if name == "max_cache_hit":
        # vLLM looks the hit up under this cap instead of num_tokens - 1 (K:288-324).
        return type(result) is not int or prefix_hit(sched, request, result) != \
            prefix_hit(sched, request, request.num_tokens - 1)
    if name == "take_unavailable_requests":
        return not (isinstance(result, (set, frozenset, list, tuple)) and not result)
    if name == "cap_external_hit":
        return len(call_args) < 3 or result != call_args[2]
    delay = result[0] if isinstance(result, tuple) and len(result) == 2 else result
    return delay is not False  # request_finished(_all_groups): (delay_free, kv_xfer_params)


def prefix_hit(sched: Any, request: Any, max_cache_hit_length: int) -> int:
    """The tokens of `request`'s prefix hit in vLLM's pool as it stands, up to
    `max_cache_hit_length` (K:288-324); a lookup, nothing changed."""
    kv = sched.kv_cache_manager
    if not kv.prefix_cache_lookup_enabled(request):
        return 0
    return kv.coordinator.find_longest_cache_hit(request.block_hashes, max_cache_hit_length)[1]


def connector_output_acts(output: Any, sched: Any = None) -> bool:
    """A model runner's KV connector output that update_from_output acts on beyond
    the spec (S:2334-2344, 2648-2649, 3706-3733): failed loads, invalid blocks, a
    finished load of a request no longer waiting for it but for one finished
    mid-load, which the lift holds (vllm_lift.mark_held), or a finished send of a
    request not held for one (vllm_lift.KV_SENDS_ATTR).  Those loads and sends are
    modelled for 0.33.0 (spec/kv_connector.py); statistics and events change no
    scheduling state."""
    if output is None:
        return False
    if not newest_rules(versions.KV_CONNECTOR):
        return True
    if any(getattr(output, f, None) for f in ("failed_recving", "invalid_block_ids")):
        return True
    requests = getattr(sched, "requests", {})
    # Sends of requests held for them are modelled (spec/kv_connector.py free_sent).
    if any(rid not in requests or not requests[rid].is_finished()
           or not requests[rid].__dict__.get(vllm_lift.KV_SENDS_ATTR)
           for rid in getattr(output, "finished_sending", None) or ()):
        return True
    return any(rid not in requests or requests[rid].status.name != "WAITING_FOR_REMOTE_KVS"
               and not requests[rid].__dict__.get(vllm_lift.HELD_LOAD_ATTR)
               for rid in getattr(output, "finished_recving", None) or ())


_newest_rules: dict[str | None, bool] = {}


def newest_rules(feature: str | None = None) -> bool:
    """Whether the spec models `feature` (spec/versions.py FEATURES_SINCE: speculative
    decoding, LoRA, prefill throttling, KV connectors, ...) for this process's release;
    with no feature, whether it models every one of them.  Each is modelled from the
    release the differential tests first ran it against (0.33.0) on."""
    known = _newest_rules.get(feature)
    if known is None:
        version = release()
        try:
            versions.release_key(version)
        except ValueError:  # not a release number: none of them is modelled
            known = False
        else:
            known = all(versions.models(version, f) for f in ((feature,) if feature else versions.FEATURES_SINCE))
        _newest_rules[feature] = known
    return known


def spec_decode_in_scope(sched: Any) -> bool:
    """Speculative decoding as the spec models it (spec/spec_decode.py): vLLM 0.33.0,
    a fixed number of drafts per step; any prefill lookahead (S:695-714, and the
    tokens the KV manager does not cache for it, kv_cache_coordinator.py:118), the
    EAGLE block drop or not (S:330-345), any KV lookahead, and any rows of the
    drafter's own in the target batch (max_num_new_slots_for_drafting,
    speculative.py:2058-2098)."""
    spec = sched.vllm_config.speculative_config
    return (newest_rules(versions.SPEC_DECODE) and spec is not None and sched.num_spec_tokens > 0
            and getattr(sched, "dynamic_sd_lookup", None) is None)


# Fields Scheduler.__init__ always sets, first to last (S:98-516).
_INIT_FIELDS = frozenset({"vllm_config", "scheduler_config", "kv_cache_config", "requests", "running", "waiting",
                          "kv_holding_waiting", "async_kv_waiting", "finished_req_ids", "kv_cache_manager",
                          "block_size", "hash_block_size", "use_pp", "current_step"})
# Bridge (init fields): the release that brought each of them; an older
# release's Scheduler.__init__ does not set it (0.33.0 has no async_kv_waiting, 0.34.0
# scheduler.py:235-238; 0.30.0 no kv_holding_waiting, 0.25.0 no hash_block_size, 0.20.0
# no current_step).
_INIT_FIELDS_SINCE = {"async_kv_waiting": "0.34.0", "kv_holding_waiting": "0.31.0", "hash_block_size": "0.28.0",
                      "current_step": "0.25.0"}
_init_fields: list = []


def release() -> str:
    """The modelled release this process's vLLM runs as: its own, or for a later one (a
    development build) the newest modelled release at or below it, whose bridges apply."""
    import vllm

    return versions.spec_release_for(vllm.__version__) or vllm.__version__


def init_fields(version: str | None = None) -> frozenset:
    """The fields release `version`'s (this process's) Scheduler.__init__ always sets."""
    if version is None and _init_fields:
        return _init_fields[0]
    from schedspec.spec.versions import release_key

    v = release() if version is None else version
    try:
        key = release_key(v)
    except (KeyError, ValueError):
        return _INIT_FIELDS
    out = frozenset(f for f in _INIT_FIELDS
                    if f not in _INIT_FIELDS_SINCE or key >= release_key(_INIT_FIELDS_SINCE[f]))
    if version is None:
        _init_fields.append(out)
    return out


def hash_block_size(sched: Any) -> int:
    """Bridge (hash_block_size): from 0.28.0; 0.20.0 and 0.25.0 hash in whole
    blocks (0.25.0 v1/core/kv_cache_utils.py get_request_block_hasher takes the
    block size)."""
    return getattr(sched, "hash_block_size", sched.block_size)

_full_attention_spec: list = []


def full_attention_spec() -> type:
    if not _full_attention_spec:
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        _full_attention_spec.append(FullAttentionSpec)
    return _full_attention_spec[0]


_methods_of: dict[type, frozenset] = {}


def methods_of(cls: type) -> frozenset:
    names = _methods_of.get(cls)
    if names is None:
        names = _methods_of[cls] = frozenset(n for n in dir(cls) if callable(getattr(cls, n, None)))
    return names


def replaced_methods(sched: Any) -> Iterable[tuple[Any, str, Any]]:
    """(object, name, replacement) for each method of the scheduler or of its KV
    cache manager, coordinator or block pool replaced on the object (a test's
    Mock, spy or fault injector); the monitor's own recorders are not counted."""
    kv = sched.__dict__.get("kv_cache_manager")
    objects = [sched]
    if kv is not None and hasattr(kv, "__dict__"):
        objects += [kv, getattr(kv, "coordinator", None), getattr(kv, "block_pool", None)]
        objects += list(getattr(objects[2], "single_type_managers", ()) or ())
    for obj in objects:
        d = getattr(obj, "__dict__", None)
        if d:
            for k in d.keys() & methods_of(type(obj)):
                v = d[k]
                if callable(v) and getattr(v, "schedspec_recorder", False) is not True:  # a Mock has every attribute
                    yield obj, k, v


def is_spy(obj: Any, name: str, replacement: Any) -> bool:
    """A replacement that holds the method it replaced, bound to the same object,
    in its closure: a spy that counts and calls through, as vLLM's async tests
    wrap _preempt_request (test_async_scheduler.py:566-574).  It may still change
    what it delegates (an allocate_slots that fails once, then calls the real
    one), so the monitor compares such a call and never reports its difference
    as vLLM's: see Monitor.check."""
    for cell in getattr(replacement, "__closure__", None) or ():
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if getattr(held, "__self__", None) is obj and getattr(held, "__name__", None) == name:
            return True
    return False


def patched(sched: Any) -> bool:
    """A method of the scheduler's KV cache manager, coordinator or block pool
    replaced by something other than a spy (scope.is_spy): vLLM's code no longer
    decides that step (the monitor calls some of those itself, prefix_hit, so a
    use by vLLM could not be told apart).  The scheduler's own replaced methods are
    judged by whether the call uses them (ReplacementWatch)."""
    return any(obj is not sched and not is_spy(obj, name, v) for obj, name, v in replaced_methods(sched))


def own_replacements(sched: Any) -> list[tuple[str, Any]]:
    """(name, replacement) for each method replaced on the scheduler object itself
    by something other than a spy."""
    return [(name, v) for obj, name, v in replaced_methods(sched) if obj is sched and not is_spy(obj, name, v)]


class ReplacementWatch:
    """Whether a call used a scheduler method a test replaced on the object (a
    Mock, a stub, a fault injector).  One the call never reaches decides nothing,
    so the call is still vLLM's (e.g. a stats builder that raises if called, in a
    step that logs no stats); one it reaches is named PATCHED_INTERNALS.  Each is
    wrapped on the object for the call only, and calls through.  A call through a
    reference taken before the wrapping (a bound method some field kept) would go
    unseen: vLLM 0.33.0's scheduler looks its methods up on `self` at each use."""

    def __init__(self, sched: Any, replacements: list[tuple[str, Any]]):
        self.sched, self.replacements, self.used = sched, replacements, False

    def __enter__(self) -> "ReplacementWatch":
        d = self.sched.__dict__
        for name, inner in self.replacements:
            d[name] = self.wrap(inner)
        return self

    def __exit__(self, *exc: Any) -> None:
        d = self.sched.__dict__
        for name, inner in self.replacements:
            if getattr(d.get(name), "schedspec_recorder", False) is True:  # else the call replaced it again
                d[name] = inner

    def wrap(self, inner: Any) -> Any:
        def watched(*args: Any, **kwargs: Any) -> Any:
            self.used = True
            return inner(*args, **kwargs)
        watched.schedspec_recorder = True
        return watched

    def features(self) -> tuple[str, ...]:
        return (PATCHED_INTERNALS,) if self.used else ()


def replacement_watch(sched: Any) -> ReplacementWatch | None:
    """A ReplacementWatch for a call on `sched`, or None when no method of its own is replaced."""
    found = own_replacements(sched)
    return ReplacementWatch(sched, found) if found else None


def spied(sched: Any) -> tuple[str, ...]:
    """The names of the scheduler methods a spy wraps (is_spy), sorted."""
    return tuple(sorted(f"{type(obj).__name__}.{name}" for obj, name, v in replaced_methods(sched)
                        if is_spy(obj, name, v)))


def encoder_cache_modelled(sched: Any) -> bool:
    """Whether the spec can judge the encoder cache (spec/encoder_cache.py, 0.33.0): vLLM's
    own manager, no encoder-cache connector, no request refused for an item whose size
    disagrees with its cached entry (S:2027-2048), and one size per identifier among the
    entries and the items of the requests (one identifier, one item); trivially so when
    no request has items."""
    requests = getattr(sched, "requests", {})
    if not any(getattr(r, "mm_features", None) for r in requests.values()):
        return True
    m = getattr(sched, "encoder_cache_manager", None)
    if not newest_rules(versions.ENCODER_INPUTS) or type(m).__name__ != "EncoderCacheManager" or type(m).__module__ != \
            "vllm.v1.core.encoder_cache_manager" or getattr(sched, "encoder_cache_mismatch_reqs", None) \
            or getattr(sched, "ec_connector", None) is not None:  # it loads and saves items (S:2239-2245)
        return False
    sizes = dict(m.num_embeds_by_hash)
    return all(sizes.setdefault(f.identifier, f.mm_position.length) == f.mm_position.length
               for r in requests.values() for f in (r.mm_features or ()))


def mm_features_modelled(r: Any) -> bool:
    """A request's items as the spec models them (docs/rules.md §20.1): every placeholder
    token an embedding, sorted and apart in the prompt, at most 8, not hashed with
    lookahead tokens."""
    features = r.mm_features
    end = 0
    for f in features:
        p = f.mm_position
        if getattr(p, "is_embed", None) is not None or p.offset < end or p.length < 1 or f.identifier is None:
            return False
        end = p.offset + p.length
    return len(features) <= 8 and end <= r.num_prompt_tokens and not vllm_lift.hasher_lookahead(r)


def static_request_features(r: Any, prefix_caching: bool) -> tuple[str, ...]:
    """Features fixed when the request is made (RQ:64-254)."""
    out = []
    if r.mm_features and not (newest_rules(versions.ENCODER_INPUTS) and mm_features_modelled(r)):
        out.append(ENCODER_INPUTS)
    if r.lora_request is not None and not newest_rules(versions.LORA):  # spec/lora.py
        out.append(LORA)
    if r.structured_output_request is not None and not newest_rules(versions.STRUCTURED_OUTPUT):
        # spec/structured_output.py
        out.append(STRUCTURED_OUTPUT)
    if r.pooling_params is not None:
        out.append(POOLING)
    if r.resumable:
        out.append(STREAMING_INPUT)
    if r.kv_transfer_params:
        out.append(KV_CONNECTOR)
    params = r.sampling_params
    if params is not None and params.repetition_detection is not None:
        out.append(REPETITION_DETECTION)
    # Bridge (prefix_cache_hit_limit): from 0.34.0 a prompt-logprobs request may read
    # the prefix cache up to its first scored prompt token (0.34.0 v1/request.py:364-377,
    # get_max_cache_hit_length :352-356); the spec models no limit (None) or none read (0).
    if getattr(r, "prefix_cache_hit_limit", None) not in (None, 0):
        out.append(PREFIX_HIT_LIMIT)
    if prefix_caching:
        if r.__dict__.get("_block_hasher") is None:
            out.append(NO_BLOCK_HASHER)
        if r.cache_salt:
            out.append(CACHE_SALT)
        if r.prompt_embeds is not None:
            out.append(PROMPT_EMBEDS)
    return tuple(out)


def request_features(r: Any, hash_block_size: int) -> tuple[str, ...]:
    """The features request `r` uses now: those fixed at its creation (read once)
    and those of its present status and draft tokens.  `hash_block_size` is the
    scheduler's under prefix caching, 0 without."""
    prefix_caching = hash_block_size > 0
    static = r.__dict__.get(_STATIC)
    if static is None or static[0] != prefix_caching:
        static = (prefix_caching, static_request_features(r, prefix_caching), vllm_lift.hasher_lookahead(r))
        r.__dict__[_STATIC] = static
    status = r.status
    # The spec hashes every full block once the lookahead tokens its hasher covers
    # exist (RQ:300-303, KU:949-1028): a request whose hashes lag behind that, or
    # whose hasher the lift cannot read, is outside scope.  One without a hasher
    # is never hashed.
    lagging = prefix_caching and (r.block_hashes or getattr(r, "_block_hasher", None) is not None) and \
        (static[2] is None or len(r.block_hashes) != max(len(r.all_token_ids) - static[2], 0) // hash_block_size)
    # Drafts follow 0.33.0's rules (spec/spec_decode.py) with or without a drafter
    # configured; the scheduler's own features say when its drafter is outside scope.
    drafts = r.spec_token_ids and not newest_rules(versions.SPEC_DECODE)
    if not (static[1] or drafts or lagging or status.name in _UNUSUAL):
        return ()  # the common case, in four attribute reads
    out = list(static[1])
    if status.name in BLOCKED_STATUSES and not (status.name in MODELLED_BLOCKED_STATUSES
                                                and newest_rules(MODELLED_BLOCKED_STATUSES[status.name])):
        out.append(BLOCKED_STATUSES[status.name])
    elif r.is_finished() and not ((r.__dict__.get(vllm_lift.HELD_LOAD_ATTR) or r.__dict__.get(vllm_lift.KV_SENDS_ATTR))
                                  and newest_rules(versions.KV_CONNECTOR)):
        # Finished (RQ:444) but still held: a delayed free, but for a request finished
        # mid-load or held for its KV's send, which the spec holds too for 0.33.0
        # (spec/kv_connector.py).
        out.append(DELAYED_FREE)
    if drafts:
        out.append(SPECULATIVE_DECODING)
    if lagging:
        out.append(HASH_LOOKAHEAD)
    return tuple(out)


# Statuses a request the spec can judge does not have.
_UNUSUAL = frozenset(BLOCKED_STATUSES) | {"FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_ABORTED",
                                          "FINISHED_IGNORED", "FINISHED_ERROR", "FINISHED_REPETITION"}


def decode_stagger(sched: Any) -> tuple[str, ...]:
    """For schedule(): a running request held back until a later step (S:832-836).
    Pipeline parallelism itself changes no scheduling decision in 0.33.0 (it
    shapes the output's token payload, S:1998, and how many batches the engine
    keeps in flight); with async scheduling on the V2 model runner it staggers
    a request's decodes `pp_size` steps apart (async_scheduler.py:50-56)."""
    if "current_step" not in sched.__dict__:
        return ()
    step = sched.current_step + 1  # schedule() counts this call first (S:717)
    for r in sched.running:
        if getattr(r, "next_decode_eligible_step", 0) > step:
            return (PP_DECODE_STAGGER,)
    return ()


def features(sched: Any, requests: Iterable[Any] | None = None, throttle_prefills: bool = False) -> tuple[str, ...]:
    """Every feature outside the spec's scope that a call on `sched` can use:
    the scheduler's own, and those of `requests` (all it holds when None)."""
    out = dict.fromkeys(scheduler_features(sched, throttle_prefills))
    if HAND_ASSEMBLED in out:
        return tuple(out)
    hbs = hash_block_size(sched) if sched.kv_cache_manager.enable_caching else 0
    if requests is None:
        # Bridge (skipped_waiting): up to 0.30.0 the requests a step skipped (blocked
        # on remote KVs or a grammar) wait in their own queue (0.30.0 scheduler.py
        # skipped_waiting), which the lift reads as part of `waiting`; a test can
        # put one there without add_request, so its features are read there too.
        skipped = getattr(sched, "skipped_waiting", None)
        requests = list(sched.requests.values()) + list(skipped) if skipped else sched.requests.values()
    for r in requests:
        found = request_features(r, hbs)
        if found:
            out.update(dict.fromkeys(found))
    return tuple(out)


__all__ = ["BLOCKED_STATUSES", "CONNECTOR_ATTRS", "ConnectorWatch", "connector_answer_changes_step",
           "connector_output_acts", "connector_watch", "connector_watchable", "decode_stagger", "features",
           "ReplacementWatch", "replacement_watch",
           "encoder_cache_modelled", "hash_block_size", "init_fields", "mm_features_modelled", "prefix_hit", "release",
           "request_features", "scheduler_features",
           "static_request_features"]
