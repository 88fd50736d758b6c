"""The spec's values as JSON, exactly: `x_from_json(x_to_json(v)) == v` for every
state the spec can reach (docs/formats.md, "State vectors").

Codecs for `SchedulerConfig`, `Request`, `SchedulerOutput`, both views of the KV
pool (`BlockCounts`, `BlockPool`) and `SchedulerState`.  The JSON forms use only
what every language's JSON library has: objects keyed by strings, arrays,
integers, one float (`arrival_time`), booleans, null.  So:

- a block hash (bytes) is a lowercase hex string;
- a map keyed by block id (`ref_cnt`, `block_hash`) is an object keyed by the
  id in decimal ("17"), no sign and no leading zero, so each id has one spelling;
- a request status is its vLLM name ("RUNNING");
- an ordered sequence is an array; an ordered pair (`[id, n]`) a 2-array.

A reader takes JSON as `json.loads` gives it and raises `StateJsonError`, a
ValueError whose message is one line: the JSON path of the first bad field,
a colon, the problem (`pre_state.requests.r3.num_computed_tokens: must be an
integer >= 0, got -1`).  Beyond the types, it refuses what would make the spec
crash on the state instead of answering (an id in `running` that is not a
request, a block id outside the pool); it does not check the spec's invariants
(free-block accounting and the like): a vector may hold any state an
implementation was in.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from typing import Any, Mapping, NoReturn

from schedspec.spec.block_pool import BlockPool
from schedspec.spec.config import (BOOL_FIELDS, CONFIG_FIELDS, INT_FIELDS, POLICIES, SchedulerConfig,
                                   excerpt, field_path, validate_config)
from schedspec.spec.kv_cache import BlockCounts
from schedspec.spec.encoder_cache import EMPTY_ENCODER_CACHE, EncoderCache, MultiModalFeature
from schedspec.spec.output import SchedulerOutput
from schedspec.spec.request import Request, RequestStatus
from schedspec.spec.prefill_throttle import PrefillCadence
from schedspec.spec.state import PAUSE_STATES, SchedulerState
from schedspec.spec.versions import UNHASHED_FREE_BLOCKS_FIRST, has


class StateJsonError(ValueError):
    """JSON that is not the form of a spec value; the message is `path: problem`."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path or 'the top level'}: {problem}")
        self.path = path
        self.problem = problem


def _fail(path: str, problem: str) -> NoReturn:
    raise StateJsonError(path, problem)


# --- primitive readers -----------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_int(v: Any, path: str, minimum: int | None = None, nullable: bool = False) -> int | None:
    """An integer (JSON's 4.0 is not one: counts are exact), at least `minimum`."""
    if v is None and nullable:
        return None
    if not _is_int(v):
        _fail(path, f"must be an integer{f' >= {minimum}' if minimum is not None else ''}"
                    f"{' or null' if nullable else ''}, got {excerpt(v)}")
    if minimum is not None and v < minimum:
        _fail(path, f"must be an integer >= {minimum}, got {excerpt(v)}")
    return v


def read_str(v: Any, path: str) -> str:
    if not isinstance(v, str):
        _fail(path, f"must be a string, got {excerpt(v)}")
    return v


def read_bool(v: Any, path: str) -> bool:
    if not isinstance(v, bool):
        _fail(path, f"must be true or false, got {excerpt(v)}")
    return v


def read_number(v: Any, path: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        _fail(path, f"must be a number, got {excerpt(v)}")
    try:
        value = float(v)
    except OverflowError:  # float() of a huge int
        _fail(path, f"= {excerpt(v)} is too large for a number")
    if not math.isfinite(value):
        _fail(path, f"= {excerpt(v)}, must be a finite number")
    return value


def read_list(v: Any, path: str) -> list:
    if not isinstance(v, list):
        _fail(path, f"must be an array, got {excerpt(v)}")
    return v


def read_object(v: Any, path: str, required: tuple[str, ...] = (), allowed: tuple[str, ...] | None = None
                ) -> dict:
    """An object with every `required` key and no key outside `allowed`
    (None: any key)."""
    if not isinstance(v, dict):
        _fail(path, f"must be an object, got {excerpt(v)}")
    for k in required:
        if k not in v:
            _fail(field_path(path, k), "missing; this field is required")
    if allowed is not None:
        for k in v:
            if k not in allowed:
                _fail(field_path(path, k), f"unknown field; known fields are {', '.join(allowed)}")
    return v


def index_path(path: str, i: int) -> str:
    return f"{path}[{i}]"


def read_str_list(v: Any, path: str, unique: bool = False) -> tuple[str, ...]:
    out = tuple(read_str(x, index_path(path, i)) for i, x in enumerate(read_list(v, path)))
    if unique:
        seen: set[str] = set()
        for i, x in enumerate(out):
            if x in seen:
                _fail(index_path(path, i), f"= {excerpt(x)} appears twice; each id may appear once")
            seen.add(x)
    return out


def read_int_list(v: Any, path: str, minimum: int | None = None) -> tuple[int, ...]:
    return tuple(read_int(x, index_path(path, i), minimum) for i, x in enumerate(read_list(v, path)))


def read_pair_list(v: Any, path: str, minimum: int) -> tuple[tuple[str, int], ...]:
    """`[[id, n], ...]`: an ordered list of (request id, count) pairs."""
    out = []
    for i, x in enumerate(read_list(v, path)):
        p = index_path(path, i)
        if not isinstance(x, list) or len(x) != 2:
            _fail(p, f"must be a pair [request id, integer], got {excerpt(x)}")
        out.append((read_str(x[0], index_path(p, 0)), read_int(x[1], index_path(p, 1), minimum)))
    return tuple(out)


# --- block hashes and block ids --------------------------------------------------------

_HEX = re.compile(r"(?:[0-9a-f]{2})+")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")


def hash_to_json(h: bytes) -> str:
    return h.hex()


def hash_from_json(v: Any, path: str) -> bytes:
    """A block hash: lowercase hex, an even number of digits, at least one byte."""
    if not isinstance(v, str) or not _HEX.fullmatch(v):
        _fail(path, f"must be a block hash as lowercase hex (an even number of 0-9a-f digits), got {excerpt(v)}")
    return bytes.fromhex(v)


def block_id_from_key(key: str, path: str, num_gpu_blocks: int) -> int:
    if not _DECIMAL.fullmatch(key) or int(key) >= num_gpu_blocks:
        _fail(path, f"the key {excerpt(key)} must be a block id in decimal, 0 .. num_gpu_blocks - 1 "
                    f"({num_gpu_blocks - 1}), without leading zeros")
    return int(key)


def read_block_id(v: Any, path: str, num_gpu_blocks: int) -> int:
    b = read_int(v, path, 0)
    if b >= num_gpu_blocks:
        _fail(path, f"= {b} is not a block of the pool: block ids are 0 .. num_gpu_blocks - 1 ({num_gpu_blocks - 1})")
    return b


def read_block_list(v: Any, path: str, num_gpu_blocks: int) -> tuple[int, ...]:
    return tuple(read_block_id(x, index_path(path, i), num_gpu_blocks) for i, x in enumerate(read_list(v, path)))


# --- config ------------------------------------------------------------------------------


def config_to_json(c: SchedulerConfig) -> dict[str, Any]:
    """Every field, defaults included: a reader in another language needs no defaults."""
    return {name: getattr(c, name) for name in CONFIG_FIELDS}


# The release a state without `vllm_version` models: those were written when schedspec
# modelled 0.33.0 alone.
LEGACY_RELEASE = "0.33.0"


def config_from_json(obj: Any, where: str = "config", *, validate: bool = False) -> SchedulerConfig:
    """A config from its JSON object (every field required).  Each field is
    type-checked and held to its own domain (a minimum, the policy names, the
    watermark's [0, 1)); with `validate`, also the release's start-up checks
    between fields (spec/config.py `validate_config`).  Without it a config a
    scenario file may not hold still loads, as one lifted from a vLLM test that
    builds its scheduler directly (a pool smaller than one max_model_len sequence)."""
    # vllm_version is optional: vectors written before it model 0.33.0 (spec/versions.py),
    # not the default release, which has moved on since (LEGACY_RELEASE).
    # So are speculative decoding's fields: vectors written before it have none (0, off).
    # And prefill_schedule_interval (1, never held) and long_prefill_token_threshold_adaptive
    # (false), from before prefill throttling and the adaptive threshold.
    # And requires_kv_delivery (false), from before KV connectors; max_num_new_slots_for_drafting
    # and num_hash_lookahead_tokens (0); use_eagle_block_drop (false), num_prefill_lookahead_tokens (0);
    # encoder inputs' max_num_encoder_input_tokens and encoder_cache_size (null), disable_chunked_mm_input (false).
    optional = ("vllm_version", "num_speculative_tokens", "num_lookahead_tokens", "max_loras",
                "prefill_schedule_interval", "long_prefill_token_threshold_adaptive", "requires_kv_delivery",
                "max_num_new_slots_for_drafting", "num_hash_lookahead_tokens", "use_eagle_block_drop",
                "num_prefill_lookahead_tokens", "max_num_encoder_input_tokens", "encoder_cache_size",
                "disable_chunked_mm_input", "cache_aware_admission_window", "cache_aware_admission_threshold")
    raw = read_object(obj, where, tuple(f for f in CONFIG_FIELDS if f not in optional), CONFIG_FIELDS)
    values: dict[str, Any] = {}
    for name in CONFIG_FIELDS:
        if name not in raw:
            continue
        path, v = field_path(where, name), raw[name]
        if name in INT_FIELDS:
            minimum, nullable = INT_FIELDS[name]
            values[name] = read_int(v, path, minimum, nullable)
        elif name in BOOL_FIELDS:
            values[name] = read_bool(v, path)
        elif name == "watermark":
            w = read_number(v, path)
            if not 0.0 <= w < 1.0:
                _fail(path, f"= {excerpt(v)}, must be in [0, 1)")
            values[name] = w
        elif name == "cache_aware_admission_threshold":
            w = read_number(v, path)
            if not 0.0 <= w <= 1.0:
                _fail(path, f"= {excerpt(v)}, must be in [0, 1]")
            values[name] = w
        elif name == "vllm_version":
            if not isinstance(v, str):
                _fail(path, f"must be a string, got {excerpt(v)}")
            values[name] = v
        elif name == "policy":
            if v not in POLICIES:
                _fail(path, f"= {excerpt(v)}, must be one of {', '.join(map(repr, POLICIES))}")
            values[name] = v
        else:  # a field added to SchedulerConfig that this codec does not know yet
            _fail(path, "this reader does not know the field's type")
    values.setdefault("vllm_version", LEGACY_RELEASE)
    config = SchedulerConfig(**values)
    if validate:
        validate_config(config, where)  # its ConfigError is a ValueError worded `where.field: ...`
    return config


# --- requests ----------------------------------------------------------------------------

REQUEST_FIELDS = tuple(f.name for f in fields(Request))
# Speculative decoding's fields are written only when not empty, so vectors of
# the scope before it read and write as they always did.
OPTIONAL_REQUEST_FIELDS = ("spec_token_ids", "lora_int_id", "grammar", "drop_stale_output",
                           "skip_reading_prefix_cache", "kv_connector_tokens", "kv_connector_async",
                           "kv_load_finished", "kv_connector_sends", "num_hash_lookahead_tokens", "mm_features")
MM_FEATURE_FIELDS = ("offset", "length", "identifier")  # one encoder input (spec/encoder_cache.py MultiModalFeature)
GRAMMARS = ("compiling", "compiled", "failed")  # Request.grammar, when it has one (spec/structured_output.py)
# name -> minimum, for the integer fields (None: any integer).
_REQUEST_INTS: dict[str, int | None] = {
    "num_prompt_tokens": 0, "max_tokens": 0, "priority": None, "num_computed_tokens": 0,
    "num_output_tokens": 0, "num_preemptions": 0, "num_output_placeholders": 0,
    "num_in_flight_tokens": 0, "num_stale_output_tokens": 0,
}
_TOKEN_LISTS = ("prompt_token_ids", "partial_block_token_ids", "stop_token_ids")
STATUS_NAMES = tuple(s.name for s in RequestStatus)


def status_to_json(status: RequestStatus) -> str:
    return RequestStatus(status).name


def status_from_json(v: Any, path: str) -> RequestStatus:
    if not isinstance(v, str) or v not in RequestStatus.__members__:
        _fail(path, f"= {excerpt(v)}, must be a request status: {', '.join(STATUS_NAMES)}")
    return RequestStatus[v]


def request_to_json(r: Request) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in REQUEST_FIELDS:
        v = getattr(r, name)
        if name == "status":
            v = status_to_json(v)
        elif name == "block_hashes":
            v = [hash_to_json(h) for h in v]
        elif name == "mm_features":
            if not v:
                continue
            v = [dict(zip(MM_FEATURE_FIELDS, f)) for f in v]
        elif name in ("lora_int_id", "grammar", "drop_stale_output", "skip_reading_prefix_cache",
                      "kv_connector_async", "kv_load_finished", "kv_connector_sends", "num_hash_lookahead_tokens"):
            if not v:
                continue
        elif name == "kv_connector_tokens":  # written unless 0; null: the connector cannot tell yet
            if v == 0:
                continue
        elif name in _TOKEN_LISTS or name in OPTIONAL_REQUEST_FIELDS:
            v = list(v)
            if name in OPTIONAL_REQUEST_FIELDS and not v:
                continue
        out[name] = v
    return out


def request_from_json(obj: Any, where: str = "request") -> Request:
    raw = read_object(obj, where, tuple(f for f in REQUEST_FIELDS if f not in OPTIONAL_REQUEST_FIELDS),
                      REQUEST_FIELDS)
    values: dict[str, Any] = {}
    for name in REQUEST_FIELDS:
        if name not in raw:
            continue
        path, v = field_path(where, name), raw[name]
        if name == "request_id":
            values[name] = read_str(v, path)
        elif name in _REQUEST_INTS:
            values[name] = read_int(v, path, _REQUEST_INTS[name])
        elif name == "arrival_time":
            values[name] = read_number(v, path)
        elif name == "status":
            values[name] = status_from_json(v, path)
        elif name == "block_hashes":
            values[name] = tuple(hash_from_json(h, index_path(path, i)) for i, h in enumerate(read_list(v, path)))
        elif name in _TOKEN_LISTS:
            values[name] = read_int_list(v, path, 0)
        elif name in ("is_prefill_chunk", "drop_stale_output", "skip_reading_prefix_cache", "kv_connector_async",
                      "kv_load_finished", "kv_connector_sends"):
            values[name] = read_bool(v, path)
        elif name == "eos_token_id":
            values[name] = read_int(v, path, 0, nullable=True)
        elif name in ("lora_int_id", "num_hash_lookahead_tokens"):
            values[name] = read_int(v, path, 0)
        elif name == "kv_connector_tokens":
            values[name] = read_int(v, path, 0, nullable=True)
        elif name == "grammar":
            if v not in GRAMMARS:
                _fail(path, f"= {excerpt(v)}, must be one of {', '.join(map(repr, GRAMMARS))}")
            values[name] = v
        elif name == "spec_token_ids":  # -1: a padding or async placeholder draft
            values[name] = read_int_list(v, path, -1)
        elif name == "mm_features":
            values[name] = tuple(mm_feature_from_json(x, index_path(path, i)) for i, x in enumerate(read_list(v, path)))
        else:  # a field added to Request that this codec does not know yet
            _fail(path, "this reader does not know the field's type")
    return Request(**values)


def mm_feature_from_json(obj: Any, where: str) -> MultiModalFeature:
    """One encoder input: placeholder tokens [offset, offset + length) and its identifier."""
    raw = read_object(obj, where, MM_FEATURE_FIELDS, MM_FEATURE_FIELDS)
    identifier = read_str(raw["identifier"], field_path(where, "identifier"))
    if not identifier:
        _fail(field_path(where, "identifier"), "must be a non-empty string")
    return MultiModalFeature(read_int(raw["offset"], field_path(where, "offset"), 0),
                             read_int(raw["length"], field_path(where, "length"), 1), identifier)


# --- the scheduler's output --------------------------------------------------------------

OUTPUT_FIELDS = tuple(f.name for f in fields(SchedulerOutput))
_OUTPUT_PAIRS = {"num_scheduled_tokens": 1, "prefix_hits": 0, "kv_connector_hits": 1}  # name -> the count's minimum


DRAFTS = "scheduled_spec_decode_tokens"  # [[id, [draft ids]], ...], written only when not empty
ENCODED = "scheduled_encoder_inputs"  # [[id, [input ids]], ...], written only when not empty
# Written only when not empty.
OPTIONAL_OUTPUT_FIELDS = (DRAFTS, "kv_connector_hits", ENCODED, "free_encoder_mm_hashes")


def output_to_json(o: SchedulerOutput) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in OUTPUT_FIELDS:
        v = getattr(o, name)
        if name in (DRAFTS, ENCODED):
            if v:
                out[name] = [[rid, list(ids)] for rid, ids in v]
            continue
        if name in OPTIONAL_OUTPUT_FIELDS and not v:
            continue
        out[name] = [[rid, n] for rid, n in v] if name in _OUTPUT_PAIRS else list(v)
    return out


def output_from_json(obj: Any, where: str = "output") -> SchedulerOutput:
    raw = read_object(obj, where, tuple(f for f in OUTPUT_FIELDS if f not in OPTIONAL_OUTPUT_FIELDS), OUTPUT_FIELDS)
    values: dict[str, Any] = {}
    for name in OUTPUT_FIELDS:
        path = field_path(where, name)
        if name in (DRAFTS, ENCODED):
            what, minimum = ("draft ids", -1) if name == DRAFTS else ("input ids", 0)
            lists = []
            for i, pair in enumerate(read_list(raw.get(name, []), path)):
                at = index_path(path, i)
                if not isinstance(pair, list) or len(pair) != 2:
                    _fail(at, f"must be [request id, [{what}]], got {excerpt(pair)}")
                lists.append((read_str(pair[0], index_path(at, 0)), read_int_list(pair[1], index_path(at, 1), minimum)))
            values[name] = tuple(lists)
        elif name in _OUTPUT_PAIRS:
            values[name] = read_pair_list(raw.get(name, []), path, _OUTPUT_PAIRS[name])
        else:
            values[name] = read_str_list(raw[name] if name not in OPTIONAL_OUTPUT_FIELDS else raw.get(name, []), path)
    return SchedulerOutput(**values)


# --- the KV pool ---------------------------------------------------------------------------

COUNTS_FIELDS = ("kind", "num_free_blocks", "req_to_num_blocks")
BLOCKS_FIELDS = ("kind", "num_gpu_blocks", "free_front", "next_fresh", "free_back", "ref_cnt", "block_hash",
                 "cached", "req_to_blocks", "num_cached_block")
KV_KINDS = {"counts": COUNTS_FIELDS, "blocks": BLOCKS_FIELDS}


def kv_to_json(kv: BlockCounts | BlockPool) -> dict[str, Any]:
    """`kind` "counts" (prefix caching off: spec/kv_cache.py) or "blocks"
    (block by block: spec/block_pool.py)."""
    if isinstance(kv, BlockCounts):
        return {"kind": "counts", "num_free_blocks": kv.num_free_blocks,
                "req_to_num_blocks": dict(kv.req_to_num_blocks)}
    if isinstance(kv, BlockPool):
        return {
            "kind": "blocks",
            "num_gpu_blocks": kv.num_gpu_blocks,
            "free_front": list(kv.free_front),
            "next_fresh": kv.next_fresh,
            "free_back": list(kv.free_back),
            "ref_cnt": {str(b): n for b, n in kv.ref_cnt.items()},
            "block_hash": {str(b): hash_to_json(h) for b, h in kv.block_hash.items()},
            "cached": {hash_to_json(h): list(blocks) for h, blocks in kv.cached.items()},
            "req_to_blocks": {rid: list(blocks) for rid, blocks in kv.req_to_blocks.items()},
            "num_cached_block": dict(kv.num_cached_block),
        }
    raise TypeError(f"not a KV pool of the spec: {type(kv).__name__}")


def kv_from_json(obj: Any, where: str = "kv_cache", unhashed_first: bool = True) -> BlockCounts | BlockPool:
    """`unhashed_first`: where the pool puts a freed unhashed block, a rule of the
    release the state's config models (versions.UNHASHED_FREE_BLOCKS_FIRST)."""
    raw = read_object(obj, where, ("kind",))
    kind = raw["kind"]
    if kind not in KV_KINDS:
        _fail(field_path(where, "kind"), f"= {excerpt(kind)}, must be \"counts\" or \"blocks\"")
    read_object(raw, where, KV_KINDS[kind], KV_KINDS[kind])
    f = lambda name: field_path(where, name)  # noqa: E731 - the path of one field
    if kind == "counts":
        counts = read_object(raw["req_to_num_blocks"], f("req_to_num_blocks"))
        return BlockCounts(
            num_free_blocks=read_int(raw["num_free_blocks"], f("num_free_blocks"), 0),
            req_to_num_blocks={rid: read_int(n, field_path(f("req_to_num_blocks"), rid), 0)
                               for rid, n in counts.items()})
    n = read_int(raw["num_gpu_blocks"], f("num_gpu_blocks"), 1)
    next_fresh = read_int(raw["next_fresh"], f("next_fresh"), 0)
    if next_fresh > n:
        _fail(f("next_fresh"), f"= {next_fresh}, must be <= num_gpu_blocks ({n})")
    ref_cnt = {}
    for key, v in read_object(raw["ref_cnt"], f("ref_cnt")).items():
        p = field_path(f("ref_cnt"), key)
        ref_cnt[block_id_from_key(key, p, n)] = read_int(v, p, 1)  # only held blocks are listed
    block_hash = {}
    for key, v in read_object(raw["block_hash"], f("block_hash")).items():
        p = field_path(f("block_hash"), key)
        block_hash[block_id_from_key(key, p, n)] = hash_from_json(v, p)
    cached = {}
    for key, v in read_object(raw["cached"], f("cached")).items():
        p = field_path(f("cached"), key)
        h = hash_from_json(key, p)
        blocks = read_block_list(v, p, n)
        if not blocks:  # the spec deletes a hash whose last block goes (block_pool.py _uncache)
            _fail(p, "must list at least one block")
        cached[h] = blocks
    req_to_blocks = {rid: read_block_list(v, field_path(f("req_to_blocks"), rid), n)
                     for rid, v in read_object(raw["req_to_blocks"], f("req_to_blocks")).items()}
    num_cached_block = {rid: read_int(v, field_path(f("num_cached_block"), rid), 0)
                        for rid, v in read_object(raw["num_cached_block"], f("num_cached_block")).items()}
    return BlockPool(
        num_gpu_blocks=n,
        free_front=read_block_list(raw["free_front"], f("free_front"), n),
        next_fresh=next_fresh,
        free_back=read_block_list(raw["free_back"], f("free_back"), n),
        ref_cnt=ref_cnt, block_hash=block_hash, cached=cached, req_to_blocks=req_to_blocks,
        num_cached_block=num_cached_block, unhashed_first=unhashed_first)


# --- the state -----------------------------------------------------------------------------

STATE_FIELDS = ("config", "requests", "running", "waiting", "kv_cache", "finished_req_ids",
                "grammar_compile_error_reqs", "pause_state", "prefill_cadence", "encoder_cache")
# Written only when not empty (not UNPAUSED, not the initial cadence, no encoder cache entry):
# vectors from before these fields read as they did.
OPTIONAL_STATE_FIELDS = ("grammar_compile_error_reqs", "pause_state", "prefill_cadence", "encoder_cache")
ENCODER_CACHE_FIELDS = ("cached", "num_embeds", "refs", "freeable")


def encoder_cache_to_json(e: EncoderCache) -> dict[str, Any]:
    """The encoder cache (spec/encoder_cache.py): each entry's referencing requests (sorted:
    a set) and embeddings, each request's references by input id, the freeable entries
    in eviction order."""
    return {"cached": {h: sorted(ids) for h, ids in e.cached.items()}, "num_embeds": dict(e.num_embeds),
            "refs": {rid: {str(i): h for i, h in ids.items()} for rid, ids in e.refs.items()},
            "freeable": list(e.freeable)}


def encoder_cache_from_json(obj: Any, where: str, requests: Mapping[str, Request] | None = None) -> EncoderCache:
    """With the state's `requests`, a request's references must name its own items:
    the spec looks each one up in its mm_features once a step ran
    (spec/encoder_inputs.py `free_computed`)."""
    raw = read_object(obj, where, ENCODER_CACHE_FIELDS, ENCODER_CACHE_FIELDS)
    f = lambda name: field_path(where, name)  # noqa: E731 - the path of one field
    num_embeds = {h: read_int(v, field_path(f("num_embeds"), h), 1)
                  for h, v in read_object(raw["num_embeds"], f("num_embeds")).items()}
    cached = {}
    for h, v in read_object(raw["cached"], f("cached")).items():
        if h not in num_embeds:
            _fail(field_path(f("cached"), h), "has no num_embeds: every entry holds its embeddings")
        cached[h] = frozenset(read_str_list(v, field_path(f("cached"), h), unique=True))
    if set(num_embeds) != set(cached):
        _fail(f("num_embeds"), "must name the entries of cached, no others")
    refs = {}
    for rid, v in read_object(raw["refs"], f("refs")).items():
        p = field_path(f("refs"), rid)
        held = {}
        for k, h in read_object(v, p).items():
            if not _DECIMAL.fullmatch(k):  # not str.isdigit: "²" is a digit int() refuses
                _fail(field_path(p, k), "must be keyed by an input id, a non-negative integer in decimal "
                                        "without leading zeros")
            h = read_str(h, field_path(p, k))
            if rid not in cached.get(h, ()):
                _fail(field_path(p, k), f"= {excerpt(h)}, but {f('cached')} does not list {excerpt(rid)} for it")
            if requests is not None and rid in requests and int(k) >= len(requests[rid].mm_features):
                _fail(field_path(p, k), f"is not an input id of request {excerpt(rid)}: it has "
                                        f"{len(requests[rid].mm_features)} items (mm_features)")
            held[int(k)] = h
        refs[rid] = held
    freeable = read_str_list(raw["freeable"], f("freeable"), unique=True)
    for i, h in enumerate(freeable):
        if cached.get(h, None) != frozenset():
            _fail(index_path(f("freeable"), i), f"= {excerpt(h)} must be an entry no request references")
    return EncoderCache(cached=cached, num_embeds=num_embeds, refs=refs, freeable=freeable)


CADENCE_FIELDS = ("num_executed_steps", "last_prefill_step", "capacity_bound", "deferred_waiting")


def cadence_fields(c: PrefillCadence) -> dict[str, Any]:
    """Prefill throttling's state, every field (the deferred ids sorted: a set)."""
    return {"num_executed_steps": c.num_executed_steps, "last_prefill_step": c.last_prefill_step,
            "capacity_bound": c.capacity_bound, "deferred_waiting": sorted(c.deferred_waiting)}


def cadence_to_json(c: PrefillCadence) -> dict[str, Any]:
    """Prefill throttling's state; a field at its initial value is left out."""
    initial = cadence_fields(PrefillCadence())
    return {k: v for k, v in cadence_fields(c).items() if v != initial[k]}


def cadence_from_json(obj: Any, where: str, waiting: tuple[str, ...]) -> PrefillCadence:
    raw = read_object(obj, where, (), CADENCE_FIELDS)
    f = lambda name: field_path(where, name)  # noqa: E731 - the path of one field
    steps = read_int(raw.get("num_executed_steps", 0), f("num_executed_steps"), 0)
    last = read_int(raw.get("last_prefill_step"), f("last_prefill_step"), 1, nullable=True)
    if last is not None and last > steps:
        _fail(f("last_prefill_step"), f"= {last} is after num_executed_steps ({steps}); a prefill is stamped "
                                      "on a step that has run")
    deferred = read_str_list(raw.get("deferred_waiting", []), f("deferred_waiting"), unique=True)
    for i, rid in enumerate(deferred):
        if rid not in waiting:
            _fail(index_path(f("deferred_waiting"), i), f"= {excerpt(rid)} is not in waiting; only a waiting "
                                                         "request is deferred")
    return PrefillCadence(num_executed_steps=steps, last_prefill_step=last,
                          capacity_bound=read_bool(raw.get("capacity_bound", False), f("capacity_bound")),
                          deferred_waiting=tuple(sorted(deferred)))


def state_to_json(s: SchedulerState) -> dict[str, Any]:
    return {
        "config": config_to_json(s.config),
        # Keyed by id; the key order carries no meaning (the queues give the orders).
        "requests": {rid: request_to_json(r) for rid, r in s.requests.items()},
        "running": list(s.running),
        "waiting": list(s.waiting),
        "kv_cache": kv_to_json(s.kv_cache),
        "finished_req_ids": list(s.finished_req_ids),
        **({"grammar_compile_error_reqs": list(s.grammar_compile_error_reqs)} if s.grammar_compile_error_reqs else {}),
        **({"pause_state": s.pause_state} if s.pause_state != "UNPAUSED" else {}),
        **({"prefill_cadence": cadence_to_json(s.prefill_cadence)} if s.prefill_cadence != PrefillCadence() else {}),
        **({"encoder_cache": encoder_cache_to_json(s.encoder_cache)} if s.encoder_cache != EMPTY_ENCODER_CACHE else {}),
    }


def state_from_json(obj: Any, where: str = "state", *, validate: bool = False) -> SchedulerState:
    """A state from its JSON object.  The config is not held to vLLM's start-up
    checks unless `validate` (see `config_from_json`)."""
    raw = read_object(obj, where, tuple(x for x in STATE_FIELDS if x not in OPTIONAL_STATE_FIELDS), STATE_FIELDS)
    f = lambda name: field_path(where, name)  # noqa: E731 - the path of one field
    config = config_from_json(raw["config"], f("config"), validate=validate)
    requests = {}
    for rid, r in read_object(raw["requests"], f("requests")).items():
        p = field_path(f("requests"), rid)
        request = request_from_json(r, p)
        if request.request_id != rid:
            _fail(field_path(p, "request_id"), f"= {excerpt(request.request_id)}, must equal the request's key "
                                               f"{excerpt(rid)}")
        requests[rid] = request
    queued: dict[str, str] = {}
    queues = {}
    for name in ("running", "waiting"):
        ids = read_str_list(raw[name], f(name))
        for i, rid in enumerate(ids):
            p = index_path(f(name), i)
            if rid not in requests:
                _fail(p, f"= {excerpt(rid)} is not a key of {f('requests')}")
            if rid in queued:
                _fail(p, f"= {excerpt(rid)} is already in {queued[rid]}; a request is in one queue, once")
            queued[rid] = f(name)
        queues[name] = ids
    # The pool's form follows the config: checked before the form's fields.
    kind = read_object(raw["kv_cache"], f("kv_cache"), ("kind",))["kind"]
    want = "blocks" if config.enable_prefix_caching else "counts"
    if kind != want:
        _fail(field_path(f("kv_cache"), "kind"),
              f"= {excerpt(kind)}, must be {want!r} when config.enable_prefix_caching is "
              f"{'true' if config.enable_prefix_caching else 'false'}")
    kv = kv_from_json(raw["kv_cache"], f("kv_cache"), has(config, UNHASHED_FREE_BLOCKS_FIRST))
    pause = raw.get("pause_state", "UNPAUSED")
    if pause not in PAUSE_STATES:
        _fail(f("pause_state"), f"= {excerpt(pause)}, must be one of {', '.join(map(repr, PAUSE_STATES))}")
    return SchedulerState(config=config, requests=requests, running=queues["running"], waiting=queues["waiting"],
                          kv_cache=kv, finished_req_ids=read_str_list(raw["finished_req_ids"],
                                                                      f("finished_req_ids")),
                          grammar_compile_error_reqs=tuple(read_str_list(raw.get("grammar_compile_error_reqs", []),
                                                                         f("grammar_compile_error_reqs"))),
                          pause_state=pause,
                          prefill_cadence=cadence_from_json(raw.get("prefill_cadence", {}), f("prefill_cadence"),
                                                            tuple(queues["waiting"])),
                          encoder_cache=encoder_cache_from_json(raw["encoder_cache"], f("encoder_cache"), requests)
                          if "encoder_cache" in raw else EMPTY_ENCODER_CACHE)


def sampled_to_json(sampled: Mapping[str, Any]) -> dict[str, list[int]]:
    return {rid: [int(t) for t in tokens] for rid, tokens in sampled.items()}


def sampled_from_json(obj: Any, where: str = "sampled_token_ids") -> dict[str, list[int]]:
    return {rid: list(read_int_list(v, field_path(where, rid), 0))
            for rid, v in read_object(obj, where).items()}


__all__ = [
    "BLOCKS_FIELDS", "COUNTS_FIELDS", "OUTPUT_FIELDS", "REQUEST_FIELDS", "STATE_FIELDS", "STATUS_NAMES",
    "StateJsonError", "config_from_json", "config_to_json", "hash_from_json", "hash_to_json", "index_path",
    "kv_from_json", "kv_to_json", "output_from_json", "output_to_json", "read_int", "read_list", "read_object",
    "read_str", "read_str_list", "request_from_json", "request_to_json", "sampled_from_json", "sampled_to_json",
    "state_from_json", "state_to_json", "status_from_json", "status_to_json",
]
