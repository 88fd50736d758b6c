"""Scheduler configuration: vLLM's defaults and its acceptance conditions, per release.

One frozen dataclass holds every `config` field of a scenario file
(docs/formats.md), and is the one table of those fields: each field's name, type
and default, and (`knob`) vLLM's least value, schedspec's size bound and what it
means.  `CONFIG_TABLE` reads it back, with the release each field appears in
(spec/versions.py FIELDS_SINCE); the scenario JSON Schema's `config`
(`config_schema`) and the one-line errors of `config_from_json` come from it.
`validate_config` accepts exactly what the modelled vLLM release accepts for the
core scope and says, for the first condition that fails, which field, which
value, which condition and how to fix it.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from .versions import (ADAPTIVE_THRESHOLD, DEFAULT_RELEASE, FIELDS_SINCE, HASH_LOOKAHEAD, KV_CONNECTOR,
                       LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL, LONG_PREFILL_THRESHOLD_NEEDS_TWO, LORA,
                       PREFILL_THROTTLE, RELEASES, SPEC_DECODE, checks, field_minimum, has, models, not_modelled,
                       release_key)

FCFS = "fcfs"
PRIORITY = "priority"
POLICIES = (FCFS, PRIORITY)


class ConfigError(ValueError):
    """A configuration or request that the modelled vLLM release would reject."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


# schedspec's size bounds (docs/formats.md), the `maximum` of integer fields.  Why: the
# torch implementation keeps token counts in int32 and needs max_model_len <= 2**30
# (gpu/limits.py); the real vLLM scheduler builds one Python object per KV block, about
# 1 GB and 5 s at 2**22 blocks; the spec keeps counts only and takes any of these.
INT32_MAX = 2**31 - 1
MAX_TOKENS_BOUND = 2**30
MAX_BLOCKS_BOUND = 2**22
MAX_DRAFTS_BOUND = 1024
MAX_SMALL_BOUND = 2**16


def knob(default: Any, minimum: int | None = None, maximum: int | None = None, doc: str = "", rule: str = "") -> Any:
    """A config field's row of the table: its default; for an integer, vLLM's least
    value (`minimum`, the newest release's; versions.MINIMUM_SINCE for older ones) and
    schedspec's bound (`maximum`); what it means (the JSON Schema's description); and
    for docs/formats.md's bounds table, the range `validate_config` checks beyond these."""
    return field(default=default, metadata={"minimum": minimum, "maximum": maximum, "doc": doc, "rule": rule})


@dataclass(frozen=True)
class SchedulerConfig:
    # SchedulerConfig defaults (C = vllm/config/scheduler.py).
    max_num_batched_tokens: int = knob(2048, 1, INT32_MAX)  # C:40
    # None -> max_num_batched_tokens
    max_num_scheduled_tokens: int | None = knob(None, 1, INT32_MAX)
    max_num_seqs: int = knob(128, 1, INT32_MAX)  # C:42
    # None -> max_num_seqs
    max_num_active_seqs: int | None = knob(None, 1, INT32_MAX)
    enable_chunked_prefill: bool = knob(True)
    # 0 = no per-request chunk cap
    long_prefill_token_threshold: int = knob(0, 0, MAX_TOKENS_BOUND, rule="≤ `max_model_len`")
    # Floor the cap at a fair share of the input budget (C:98-102; from vLLM 0.33.0).
    long_prefill_token_threshold_adaptive: bool = knob(False, doc=(
        "the long-prefill cap floored at max_num_batched_tokens divided by the running and waiting requests "
        "(default false); vLLM 0.33.0 and later"))
    policy: str = knob(FCFS)
    watermark: float = knob(0.0, rule="[0, 1)")  # C:208, in [0, 1)
    scheduler_reserve_full_isl: bool = knob(True)  # C:202, the full-ISL admission gate
    # Model- and machine-dependent in vLLM; formats.md fixes these defaults.
    max_model_len: int = knob(8192, 1, MAX_TOKENS_BOUND)
    block_size: int = knob(16, 1, MAX_TOKENS_BOUND)
    num_gpu_blocks: int = knob(10000, 1, MAX_BLOCKS_BOUND,  # counts vLLM's null block
                               rule="≥ 1 + ⌈`max_model_len` / `block_size`⌉")
    enable_prefix_caching: bool = knob(False)
    # vLLM's default is on; formats.md keeps the synchronous engine unless asked.
    async_scheduling: bool = knob(False)
    # Speculative decoding (off by default, as in vLLM): the draft tokens a request may
    # carry per step, and the KV slots the drafter writes past the scheduled tokens
    # (VllmConfig.num_speculative_tokens and num_lookahead_tokens, config/vllm.py:612-653).
    # The drafter is n-gram, a parallel one, or of the EAGLE family; its drafts come from
    # the scenario.
    num_speculative_tokens: int = knob(0, 0, MAX_DRAFTS_BOUND, doc=(
        "speculative decoding: the most drafts a request verifies per step (0, the default, is off)"))
    num_lookahead_tokens: int = knob(0, 0, MAX_DRAFTS_BOUND, doc=(
        "speculative decoding: KV slots reserved past the scheduled tokens (a drafter with its own forward "
        "pass); only with num_speculative_tokens > 0"))
    # Prompt tokens past a prefill chunk the drafter reads (VllmConfig.
    # num_prefill_lookahead_tokens, config/vllm.py:654-675): 0 for n-gram, 1 for the EAGLE
    # family (which changes no step), num_speculative_tokens for multi-module MTP, whose
    # chunks never end within it of the prefill's end (S:695-714) and whose last
    # lookahead - 1 computed tokens are not cached (kv_cache_coordinator.py:118, 350-356).
    num_prefill_lookahead_tokens: int = knob(0, 0, MAX_DRAFTS_BOUND, doc=(
        "speculative decoding: prompt tokens past a prefill chunk the drafter reads (default 0, n-gram; 1 for "
        "EAGLE; num_speculative_tokens for multi-module MTP, whose chunks never end within it of the prefill's "
        "end and whose last lookahead - 1 computed tokens are not cached); only with num_speculative_tokens > 0, "
        "at most block_size with prefix caching"))
    # Rows the drafter adds to the target batch for each scheduled request
    # (SpeculativeConfig.max_num_new_slots_for_drafting, speculative.py:2058-2098: K - 1
    # for a parallel drafter reusing the query, 0 for n-gram), charged to the input budget.
    max_num_new_slots_for_drafting: int = knob(0, 0, MAX_DRAFTS_BOUND, doc=(
        "speculative decoding: rows the drafter adds to the target batch for each scheduled request, charged to "
        "the input budget (default 0, n-gram; num_speculative_tokens - 1 for a parallel drafter reusing the "
        "query); at most num_speculative_tokens"))
    # Prefix caching: tokens after each block its hash also covers (vLLM's
    # VllmConfig.num_hash_lookahead_tokens, config/vllm.py:677-692, which an
    # EAGLE-family drafter sets; given here as it is): a block is cached only once
    # they exist.  0: hashes of the block alone.
    num_hash_lookahead_tokens: int = knob(0, 0, MAX_DRAFTS_BOUND, doc=(
        "prefix caching: tokens after each block its hash also covers, so a block is cached only once they "
        "exist (default 0; vLLM sets it for EAGLE-family drafters); needs enable_prefix_caching; vLLM 0.33.0 "
        "and later"))
    # Prefix caching with an EAGLE-family drafter (EAGLE, EAGLE-3, MTP) whose draft KV
    # at a position depends on the next token: a prefix hit gives back its last block,
    # to be recomputed (SpeculativeConfig.use_eagle_block_drop, speculative.py:2122-2149;
    # T:834-842).  vLLM clears it when block hashes cover the lookahead token (S:342-345).
    use_eagle_block_drop: bool = knob(False, doc=(
        "prefix caching with an EAGLE-family drafter: a prefix hit gives back its last block, recomputed for "
        "the drafter (default false); needs num_speculative_tokens > 0, num_prefill_lookahead_tokens > 0 and "
        "num_hash_lookahead_tokens 0; vLLM 0.33.0 and later"))
    # LoRA (off by default, as in vLLM): the most distinct adapters running at once
    # (LoRAConfig.max_loras, config/lora.py); None: no LoRA config, no adapters.
    max_loras: int | None = knob(None, 1, MAX_SMALL_BOUND, doc=(
        "LoRA: the most distinct adapters running at once (null, the default: LoRA off)"))
    # Prefill throttling (prefill_throttle.py): prefill admitted once every N executed
    # steps (C:215-221), applied by the scheduler on an engine without data
    # parallelism (S:403-407), as this one is; 1 (vLLM's default) never holds prefill.
    prefill_schedule_interval: int = knob(1, 1, MAX_SMALL_BOUND, doc=(
        "prefill throttling: prefill admitted once every this many executed steps while something decodes "
        "(1, the default, never holds it); vLLM 0.33.0 and later"))
    # Encoder inputs (S:267-295; vLLM's SchedulerConfig, C:158-179): the embeddings one step
    # may encode and the encoder cache's capacity, both max_num_batched_tokens when
    # None; and whether a chunk may end inside an item (disable_chunked_mm_input).
    max_num_encoder_input_tokens: int | None = knob(None, 1, MAX_TOKENS_BOUND, doc=(
        "encoder inputs: the embeddings one step may encode (null, the default: max_num_batched_tokens)"))
    encoder_cache_size: int | None = knob(None, 1, MAX_TOKENS_BOUND, doc=(
        "encoder inputs: the encoder cache's capacity in embeddings (null, the default: max_num_batched_tokens)"))
    disable_chunked_mm_input: bool = knob(False, doc=(
        "encoder inputs: a chunk never ends inside an item it starts at or before; it stops before the item "
        "instead (default false)"))
    # A KV connector that needs a preempted request's KV delivered (vLLM's
    # KVConnectorBase_V1.requires_kv_delivery, base.py:198-207): schedule()'s preemptions
    # then drop the request's output in flight (S:988-992).  Off: none, or a best-effort one.
    requires_kv_delivery: bool = knob(False, doc=(
        "a KV connector that needs a preempted request's KV delivered: schedule()'s preemptions drop the "
        "request's output in flight (default false); vLLM 0.33.0 and later"))
    # Cache-aware admission (cache_aware_admission.py; vLLM 0.34.0, C:223-244): the
    # waiting requests it may reorder, 0 off; and the KV cache usage it needs first.
    cache_aware_admission_window: int = knob(0, 0, INT32_MAX, doc=(
        "cache-aware admission: among the first this many waiting requests, those whose prompt prefix is "
        "cached are admitted first, deepest hit first (0, the default, is off); FCFS with prefix caching only; "
        "vLLM 0.34.0 and later"))
    cache_aware_admission_threshold: float = knob(0.5, rule="[0, 1]", doc=(
        "cache-aware admission: the KV cache usage in [0, 1] below which the window does not reorder "
        "(default 0.5); vLLM 0.34.0 and later"))
    # The vLLM release modelled: its rules (spec/versions.py gates) and its config checks.
    vllm_version: str = knob(DEFAULT_RELEASE, doc=(
        f"the vLLM release modelled (default the newest modelled release, {DEFAULT_RELEASE}, or the command's "
        "--vllm-version / --impl vllm==X)"))

    @property
    def token_budget(self) -> int:
        """The per-step token budget `schedule()` starts from (S:735)."""
        if self.max_num_scheduled_tokens is None:
            return self.max_num_batched_tokens
        return self.max_num_scheduled_tokens

    @property
    def encoder_compute_budget(self) -> int:
        """The embeddings each `schedule()` may encode (S:282-284)."""
        return self.max_num_batched_tokens if self.max_num_encoder_input_tokens is None \
            else self.max_num_encoder_input_tokens

    @property
    def encoder_cache_capacity(self) -> int:
        """The encoder cache's size in embeddings (S:285, 293-295)."""
        return self.max_num_batched_tokens if self.encoder_cache_size is None else self.encoder_cache_size

    @property
    def max_num_active_reqs(self) -> int:
        """The admission limit on len(running) (S:129-136)."""
        if self.max_num_active_seqs is None:
            return self.max_num_seqs
        return self.max_num_active_seqs

    @property
    def num_usable_blocks(self) -> int:
        """Block 0 is the null block and is never free (P:164)."""
        return self.num_gpu_blocks - 1

    @property
    def watermark_blocks(self) -> int:
        """Headroom an admission must leave free; computed on the total that
        includes the null block (K:210)."""
        return int(self.watermark * self.num_gpu_blocks)


def step_budget(c: SchedulerConfig) -> int:
    """The tokens one `schedule()` may grant in all: each grant takes from the token
    budget (max_num_scheduled_tokens, else max_num_batched_tokens) and from the input
    budget (max_num_batched_tokens), so the lesser of the two bounds the step
    (S:735-738).  Before 0.28.0 only the token budget does (versions.INPUT_BUDGET;
    spec/properties.py get_step_budget)."""
    return min(c.token_budget, c.max_num_batched_tokens)


def long_prefill_threshold(c: SchedulerConfig, num_eligible: int) -> int:
    """The long-prefill cap of a step with `num_eligible` running and waiting requests
    (S:770-788): none with chunked prefill off (from 0.34.0); none for a request alone
    (there is nobody to starve; from 0.31.0); adaptive, at least a fair share of the
    input budget."""
    if not c.enable_chunked_prefill and has(c, LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL):
        return 0
    if num_eligible <= 1 and has(c, LONG_PREFILL_THRESHOLD_NEEDS_TWO):
        return 0
    threshold = c.long_prefill_token_threshold
    if threshold > 0 and c.long_prefill_token_threshold_adaptive:
        return max(threshold, c.max_num_batched_tokens // num_eligible)
    return threshold


@dataclass(frozen=True)
class ConfigField:
    """One row of the config table: a `config` field of a scenario file."""

    name: str
    kind: str  # its JSON type: integer, boolean, number or string
    nullable: bool  # null allowed (the default: a value derived from another field)
    default: Any
    minimum: int | None  # vLLM's least value of an integer (the newest release's)
    maximum: int | None  # schedspec's bound on an integer (docs/formats.md)
    since: str | None  # the release that added it (versions.FIELDS_SINCE); None: every modelled one
    doc: str  # what it means (the JSON Schema's description)
    rule: str  # the range validate_config checks beyond minimum and maximum (docs/formats.md)

    @property
    def json_types(self) -> str | list[str]:
        return [self.kind, "null"] if self.nullable else self.kind


# The Python types of the fields (annotations, strings here) and their JSON types.
_JSON_KINDS = {"int": "integer", "bool": "boolean", "float": "number", "str": "string"}


def _row(f) -> ConfigField:
    python_type, _, none = f.type.partition(" | ")
    meta = f.metadata
    return ConfigField(f.name, _JSON_KINDS[python_type], none == "None", f.default, meta.get("minimum"),
                       meta.get("maximum"), FIELDS_SINCE[f.name][0] if f.name in FIELDS_SINCE else None,
                       meta.get("doc", ""), meta.get("rule", ""))


CONFIG_TABLE: dict[str, ConfigField] = {f.name: _row(f) for f in fields(SchedulerConfig)}
CONFIG_FIELDS = tuple(CONFIG_TABLE)
# The fields by JSON type; integers: name -> (vLLM's least value, whether null is allowed).
INT_FIELDS = {n: (r.minimum, r.nullable) for n, r in CONFIG_TABLE.items() if r.kind == "integer"}
BOOL_FIELDS = tuple(n for n, r in CONFIG_TABLE.items() if r.kind == "boolean")
FLOAT_FIELDS = tuple(n for n, r in CONFIG_TABLE.items() if r.kind == "number")  # JSON numbers, held as floats

TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "object": "an object",
              "array": "an array", "boolean": "true or false", "null": "null"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_IS_KIND = {
    "integer": _is_int,
    "boolean": lambda v: isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
}


EXCERPT_CHARS = 40


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """`value` as a message quotes it: repr (so control characters and newlines
    are escaped and the message stays one line), cut to `limit` characters."""
    if _is_int(value) and abs(value) >= 10**limit:
        # repr of a huge int is slow, and beyond 4300 digits refused (sys.set_int_max_str_digits)
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "\u2026"


def field_path(where: str, key: Any) -> str:
    """`where.key`, or `where[<excerpt>]` for a key that is not a short name."""
    if isinstance(key, str) and key.isidentifier() and key.isascii() and len(key) <= EXCERPT_CHARS:
        return f"{where}.{key}" if where else key
    return f"{where}[{excerpt(key)}]"


def unknown_field(key: Any, known) -> str:
    """What to say of an unknown key: the nearest of the `known` names, when one is near."""
    near = difflib.get_close_matches(key, known, n=1) if isinstance(key, str) and len(key) <= 80 else []
    return f"unknown field; did you mean {near[0]}?" if near else "unknown field (docs/formats.md lists the fields)"


def check_field(name: str, value: Any, where: str = "config") -> Any:
    """`value` of config field `name` as the config holds it (a float for a number);
    ConfigError, one line naming the field, for a value of another JSON type or beyond
    schedspec's bound (CONFIG_TABLE)."""
    row = CONFIG_TABLE[name]
    if value is None and row.nullable:
        return None
    if not _IS_KIND[row.kind](value):
        kinds = row.json_types if row.nullable else [row.kind]
        raise ConfigError(f"{where}.{name}", f"must be {' or '.join(TYPE_WORDS[k] for k in kinds)}, "
                          f"got {excerpt(value)}")
    if row.maximum is not None and value > row.maximum:
        raise ConfigError(f"{where}.{name}", f"= {excerpt(value)}, must be <= {row.maximum} (schedspec's bound, "
                          "docs/formats.md)")
    if row.kind == "number" and _is_int(value):
        try:
            return float(value)
        except OverflowError:
            raise ConfigError(f"{where}.{name}", f"= {excerpt(value)} is too large for a number") from None
    return value


def config_from_json(raw: Any, where: str = "config", release: str = DEFAULT_RELEASE) -> SchedulerConfig:
    """The config a scenario's `config` object states: known fields of their JSON types
    within schedspec's bounds (CONFIG_TABLE); one that names no `vllm_version` models
    `release`.  Whether that release accepts it is `validate_config`'s question."""
    if not isinstance(raw, dict):
        raise ConfigError(where, f"must be an object, got {excerpt(raw)}")
    for key in raw:
        if key not in CONFIG_TABLE:
            raise ConfigError(field_path(where, key), unknown_field(key, CONFIG_FIELDS))
    values = {name: check_field(name, raw[name], where) for name in sorted(raw)}
    values.setdefault("vllm_version", release)
    return SchedulerConfig(**values)


def check_config(c: SchedulerConfig, where: str = "config") -> SchedulerConfig:
    """`c`, when each field has its JSON type and is within schedspec's bounds (a config
    built in code); ConfigError naming the first field that is not."""
    for name in _SORTED_FIELDS:
        check_field(name, getattr(c, name), where)
    return c


_SORTED_FIELDS = tuple(sorted(CONFIG_FIELDS))  # the order config_from_json checks a file's in


def config_from_dict(raw: Any, where: str = "config", release: str = DEFAULT_RELEASE) -> SchedulerConfig:
    """`config_from_json`, then the modelled release's acceptance (`validate_config`)."""
    config = config_from_json(raw, where, release)
    validate_config(config, where)
    return config


def config_as_given(c: SchedulerConfig) -> dict[str, Any]:
    """`c` as a scenario file gives it: the fields that differ from their defaults."""
    return {name: getattr(c, name) for name, row in CONFIG_TABLE.items() if getattr(c, name) != row.default}


def config_schema() -> dict[str, Any]:
    """The JSON Schema of a scenario's `config` (reference/schemas/scenario.schema.json),
    from the table: types, and schedspec's bounds; vLLM's least values and the rules
    between fields are `validate_config`'s, per release."""
    props: dict[str, Any] = {}
    for row in CONFIG_TABLE.values():
        props[row.name] = {"type": row.json_types}
        if row.maximum is not None:
            props[row.name]["maximum"] = row.maximum
        if row.doc:
            props[row.name]["description"] = row.doc
    return {"type": "object", "additionalProperties": False, "properties": props}


def validate_field_bounds(c: SchedulerConfig, fail) -> None:
    """Field constraints declared on the pydantic dataclasses (C:40-208, CC:188)."""
    for name, (minimum, nullable) in INT_FIELDS.items():
        value = getattr(c, name)
        if value is None and nullable:
            continue
        minimum = field_minimum(c.vllm_version, name, minimum)  # spec/versions.py MINIMUM_SINCE
        if not _is_int(value) or (minimum is not None and value < minimum):
            fail(name, f"= {excerpt(value)}, must be an integer >= {minimum}")
    if not (0.0 <= c.watermark < 1.0):
        fail("watermark", f"= {c.watermark}, must be in [0, 1) (vLLM config/scheduler.py:208); "
             "0.0 disables the watermark")
    if not (0.0 <= c.cache_aware_admission_threshold <= 1.0):
        fail("cache_aware_admission_threshold", f"= {c.cache_aware_admission_threshold}, must be in [0, 1] "
             "(vLLM config/scheduler.py:237); 0.0 reorders on every step")


def validate_config(c: SchedulerConfig, where: str = "config") -> None:
    """Raise ConfigError for the first condition the modelled release rejects."""

    def fail(name: str, message: str) -> None:
        raise ConfigError(f"{where}.{name}", message)

    if c.vllm_version not in RELEASES:
        fail("vllm_version", f"= {excerpt(c.vllm_version)} is not a release schedspec models; "
             f"use one of {', '.join(RELEASES)}")
    for name, (since, absent, source) in FIELDS_SINCE.items():
        if release_key(c.vllm_version) < release_key(since) and getattr(c, name) != absent:
            fail(name, f"= {excerpt(getattr(c, name))}, but vLLM {c.vllm_version} has no such field "
                 f"(added in {since}, {source}); leave it out or set it to {json.dumps(absent)}")

    validate_field_bounds(c, fail)
    if c.policy not in POLICIES:
        fail("policy", f"= {excerpt(c.policy)}: unknown scheduling policy (vLLM scheduler.py:225); "
             f"use one of {', '.join(map(repr, POLICIES))}")
    # SchedulerConfig.verify_max_model_len, in vLLM's order (C:361-406).
    if c.max_num_batched_tokens < c.max_model_len and not c.enable_chunked_prefill:
        fail("max_num_batched_tokens",
             f"= {c.max_num_batched_tokens} is smaller than max_model_len ({c.max_model_len}) "
             "with enable_chunked_prefill off (vLLM config/scheduler.py:318); raise "
             "max_num_batched_tokens to at least max_model_len, lower max_model_len, "
             "or enable chunked prefill")
    if c.max_num_batched_tokens < c.max_num_seqs:
        fail("max_num_batched_tokens",
             f"= {c.max_num_batched_tokens} must be >= max_num_seqs ({c.max_num_seqs}) "
             "(vLLM config/scheduler.py:331); raise it or lower max_num_seqs, and use "
             "max_num_scheduled_tokens for a token budget below max_num_seqs")
    if c.max_num_active_seqs is not None and c.max_num_active_seqs > c.max_num_seqs:
        fail("max_num_active_seqs",
             f"= {c.max_num_active_seqs} cannot be greater than max_num_seqs ({c.max_num_seqs}) "
             "(vLLM config/scheduler.py:341); lower it or raise max_num_seqs")
    if c.long_prefill_token_threshold > c.max_model_len and \
            checks(c, "long_prefill_token_threshold_at_most_max_model_len"):
        fail("long_prefill_token_threshold",
             f"= {c.long_prefill_token_threshold} cannot be greater than max_model_len "
             f"({c.max_model_len}) (vLLM config/scheduler.py:355); lower it (0 disables the cap)")
    validate_spec_decode(c, where)
    validate_drafter(c, where)
    # Engine start-up: the pool, less the null block, must hold one full sequence
    # (v1/core/kv_cache_planning.py:151-185).
    need = math.ceil(c.max_model_len / c.block_size)
    if c.num_gpu_blocks - 1 < need:
        fail("num_gpu_blocks",
             f"= {c.num_gpu_blocks} leaves {c.num_gpu_blocks - 1} usable blocks, fewer than the "
             f"{need} one max_model_len ({c.max_model_len}) sequence needs at block_size "
             f"{c.block_size} (vLLM v1/core/kv_cache_planning.py:151); use num_gpu_blocks >= "
             f"{need + 1} or lower max_model_len")


def refuse_feature(c: SchedulerConfig, where: str, field: str, value: Any, feature: str, fix: str) -> None:
    """A field asks for a feature schedspec does not model for the config's release."""
    shown = value if isinstance(value, str) else excerpt(value)
    raise ConfigError(f"{where}.{field}", f"= {shown}: {not_modelled(c, feature)}; {fix} or use vllm_version "
                      f"{DEFAULT_RELEASE}")


def validate_spec_decode(c: SchedulerConfig, where: str = "config") -> None:
    """Speculative decoding's and LoRA's fields: modelled from the release versions.FEATURES_SINCE
    names on, and a lookahead only beside drafts (a drafter's own forward pass writes it)."""
    if c.num_speculative_tokens > 0 and not models(c, SPEC_DECODE):
        refuse_feature(c, where, "num_speculative_tokens", c.num_speculative_tokens, SPEC_DECODE, "set it to 0")
    if c.max_loras is not None and not models(c, LORA):
        refuse_feature(c, where, "max_loras", c.max_loras, LORA, "leave it out")
    if c.long_prefill_token_threshold_adaptive and not models(c, ADAPTIVE_THRESHOLD):
        refuse_feature(c, where, "long_prefill_token_threshold_adaptive", "true", ADAPTIVE_THRESHOLD, "set it to false")
    if c.prefill_schedule_interval > 1 and not models(c, PREFILL_THROTTLE):
        refuse_feature(c, where, "prefill_schedule_interval", c.prefill_schedule_interval, PREFILL_THROTTLE, "set it to 1")
    if c.max_num_new_slots_for_drafting > 1 and checks(c, "drafter_rows_at_most_one"):
        raise ConfigError(f"{where}.max_num_new_slots_for_drafting",
                          f"= {c.max_num_new_slots_for_drafting}: vLLM {c.vllm_version}'s drafters add 0 rows "
                          "(n-gram, EAGLE, MTP, DFlash) or 1 (a draft model) to the batch; parallel drafting "
                          "(P-EAGLE, PARD) is gone from 0.34.0 (vLLM config/speculative.py:1743-1751); use 0 or 1, "
                          "or vllm_version 0.33.0")
    if c.max_num_new_slots_for_drafting == 1 and checks(c, "drafter_rows_at_most_one") and \
            (c.num_prefill_lookahead_tokens or c.max_num_batched_tokens <= c.num_speculative_tokens):
        # One row is a draft model's: it reads no prompt token ahead, and its own forward
        # pass reserves num_speculative_tokens lookahead slots, which must leave a token
        # of the batch (vLLM config/vllm.py:2291-2299).
        why = (f"it reads no prompt token ahead, so num_prefill_lookahead_tokens must be 0, not "
               f"{c.num_prefill_lookahead_tokens}" if c.num_prefill_lookahead_tokens else
               f"its own forward pass reserves num_speculative_tokens ({c.num_speculative_tokens}) lookahead "
               f"slots, which must leave a token of max_num_batched_tokens ({c.max_num_batched_tokens}) "
               "(vLLM config/vllm.py:2291-2299)")
        raise ConfigError(f"{where}.max_num_new_slots_for_drafting",
                          f"= 1 is a draft model's row in vLLM {c.vllm_version}: {why}; change it or use 0 rows")
    if c.max_num_new_slots_for_drafting > c.num_speculative_tokens:
        raise ConfigError(f"{where}.max_num_new_slots_for_drafting",
                          f"= {c.max_num_new_slots_for_drafting} > num_speculative_tokens "
                          f"{c.num_speculative_tokens}: a drafter adds at most one row per draft token "
                          "(vLLM speculative.py:2058-2098); lower it")
    if c.num_hash_lookahead_tokens > 0 and not models(c, HASH_LOOKAHEAD):
        refuse_feature(c, where, "num_hash_lookahead_tokens", c.num_hash_lookahead_tokens, HASH_LOOKAHEAD, "set it to 0")
    if c.num_hash_lookahead_tokens > 0 and not c.enable_prefix_caching:
        raise ConfigError(f"{where}.num_hash_lookahead_tokens",
                          f"= {c.num_hash_lookahead_tokens} without prefix caching: only prefix caching hashes "
                          "blocks (vLLM config/vllm.py:677-692); set it to 0 or turn enable_prefix_caching on")
    if c.requires_kv_delivery and not models(c, KV_CONNECTOR):
        refuse_feature(c, where, "requires_kv_delivery", "true", KV_CONNECTOR, "set it to false")
    if c.num_lookahead_tokens > 0 and c.num_speculative_tokens == 0:
        raise ConfigError(f"{where}.num_lookahead_tokens",
                          f"= {c.num_lookahead_tokens} without speculative decoding: only a drafter reserves "
                          "lookahead slots (vLLM config/vllm.py:626-653); set num_speculative_tokens or "
                          "leave it 0")


def validate_drafter(c: SchedulerConfig, where: str = "config") -> None:
    """An EAGLE-family drafter's fields: its prefill lookahead, and its block drop."""
    if c.num_prefill_lookahead_tokens > 0 and c.num_speculative_tokens == 0:
        raise ConfigError(f"{where}.num_prefill_lookahead_tokens",
                          f"= {c.num_prefill_lookahead_tokens} without speculative decoding: only a drafter reads "
                          "prompt tokens ahead (vLLM config/vllm.py:654-675); set num_speculative_tokens or leave it 0")
    if c.num_prefill_lookahead_tokens > c.block_size and c.enable_prefix_caching:
        raise ConfigError(f"{where}.num_prefill_lookahead_tokens",
                          f"= {c.num_prefill_lookahead_tokens} > block_size {c.block_size} with prefix caching: vLLM "
                          "refuses it at start-up (kv_cache_coordinator.py:150-159); lower it or raise block_size")
    if c.use_eagle_block_drop and c.num_prefill_lookahead_tokens == 0:
        raise ConfigError(f"{where}.use_eagle_block_drop",
                          "= true without num_prefill_lookahead_tokens: only an EAGLE-family drafter, which reads "
                          "ahead, drops a hit's last block (vLLM speculative.py:2122-2149, config/vllm.py:654-675); "
                          "set num_prefill_lookahead_tokens (1 for EAGLE) or set it to false")
    if c.use_eagle_block_drop and c.num_hash_lookahead_tokens > 0:
        raise ConfigError(f"{where}.use_eagle_block_drop",
                          f"= true with num_hash_lookahead_tokens {c.num_hash_lookahead_tokens}: vLLM clears the "
                          "drop when block hashes cover the lookahead tokens (scheduler.py:342-345); set one of "
                          "them off")
