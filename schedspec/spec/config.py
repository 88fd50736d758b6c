"""Scheduler configuration: vLLM 0.33.0's defaults and its acceptance conditions.

One frozen dataclass holds every `config` field of a scenario file
(docs/formats.md).  `validate_config` accepts exactly what vLLM 0.33.0
accepts for the core scope and says, for the first condition that fails, which
field, which value, which condition and how to fix it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import Any

from .versions import (DEFAULT_RELEASE, FIELDS_SINCE, LONG_PREFILL_THRESHOLD_NEEDS_TWO, RELEASES, checks,
                       field_minimum, has, release_key)

FCFS = "fcfs"
PRIORITY = "priority"
POLICIES = (FCFS, PRIORITY)


class ConfigError(ValueError):
    """A configuration or request that vLLM 0.33.0 would reject."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class SchedulerConfig:
    # SchedulerConfig defaults (C = vllm/config/scheduler.py).
    max_num_batched_tokens: int = 2048  # C:41
    max_num_scheduled_tokens: int | None = None  # None -> max_num_batched_tokens
    max_num_seqs: int = 128  # C:43
    max_num_active_seqs: int | None = None  # None -> max_num_seqs
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0 = no per-request chunk cap
    # Floor the cap at a fair share of the input budget (C:86-90; vLLM 0.33.0 here).
    long_prefill_token_threshold_adaptive: bool = False
    policy: str = FCFS
    watermark: float = 0.0  # C:196, in [0, 1)
    scheduler_reserve_full_isl: bool = True  # C:190, the full-ISL admission gate
    # Model- and machine-dependent in vLLM; formats.md fixes these defaults.
    max_model_len: int = 8192
    block_size: int = 16
    num_gpu_blocks: int = 10000  # counts vLLM's null block
    enable_prefix_caching: bool = False
    # vLLM's default is on; formats.md keeps the synchronous engine unless asked.
    async_scheduling: bool = False
    # Speculative decoding (off by default, as in vLLM): the draft tokens a request may
    # carry per step, and the KV slots the drafter writes past the scheduled tokens
    # (VllmConfig.num_speculative_tokens and num_lookahead_tokens, config/vllm.py:612-653).
    # The drafter is n-gram, a parallel one, or of the EAGLE family; its drafts come from
    # the scenario.
    num_speculative_tokens: int = 0
    num_lookahead_tokens: int = 0
    # Prompt tokens past a prefill chunk the drafter reads (VllmConfig.
    # num_prefill_lookahead_tokens, config/vllm.py:654-675): 0 for n-gram, 1 for the EAGLE
    # family (which changes no step), num_speculative_tokens for multi-module MTP, whose
    # chunks never end within it of the prefill's end (S:678-697) and whose last
    # lookahead - 1 computed tokens are not cached (kv_cache_coordinator.py:118, 350-356).
    num_prefill_lookahead_tokens: int = 0
    # Rows the drafter adds to the target batch for each scheduled request
    # (SpeculativeConfig.max_num_new_slots_for_drafting, speculative.py:2058-2098: K - 1
    # for a parallel drafter reusing the query, 0 for n-gram), charged to the input budget.
    max_num_new_slots_for_drafting: int = 0
    # Prefix caching: tokens after each block its hash also covers (vLLM 0.33.0's
    # VllmConfig.num_hash_lookahead_tokens, config/vllm.py:677-692, which an
    # EAGLE-family drafter sets; given here as it is): a block is cached only once
    # they exist.  0: hashes of the block alone.
    num_hash_lookahead_tokens: int = 0
    # Prefix caching with an EAGLE-family drafter (EAGLE, EAGLE-3, MTP) whose draft KV
    # at a position depends on the next token: a prefix hit gives back its last block,
    # to be recomputed (SpeculativeConfig.use_eagle_block_drop, speculative.py:2122-2149;
    # T:829-837).  vLLM clears it when block hashes cover the lookahead token (S:342-345).
    use_eagle_block_drop: bool = False
    # LoRA (off by default, as in vLLM): the most distinct adapters running at once
    # (LoRAConfig.max_loras, config/lora.py); None: no LoRA config, no adapters.
    max_loras: int | None = None
    # Prefill throttling (prefill_throttle.py): prefill admitted once every N executed
    # steps (C:203-209), applied by the scheduler on an engine without data
    # parallelism (S:404-408), as this one is; 1 (vLLM's default) never holds prefill.
    prefill_schedule_interval: int = 1
    # Encoder inputs (S:265-293; vLLM's SchedulerConfig, C:146-167): the embeddings one step
    # may encode and the encoder cache's capacity, both max_num_batched_tokens when
    # None; and whether a chunk may end inside an item (disable_chunked_mm_input).
    max_num_encoder_input_tokens: int | None = None
    encoder_cache_size: int | None = None
    disable_chunked_mm_input: bool = False
    # A KV connector that needs a preempted request's KV delivered (vLLM 0.33.0's
    # KVConnectorBase_V1.requires_kv_delivery, base.py:198-207): schedule()'s preemptions
    # then drop the request's output in flight (S:972-976).  Off: none, or a best-effort one.
    requires_kv_delivery: bool = False
    # The vLLM release modelled: its rules (spec/versions.py gates) and its config checks.
    vllm_version: str = DEFAULT_RELEASE

    @property
    def token_budget(self) -> int:
        """The per-step token budget `schedule()` starts from (S:719)."""
        if self.max_num_scheduled_tokens is None:
            return self.max_num_batched_tokens
        return self.max_num_scheduled_tokens

    @property
    def encoder_compute_budget(self) -> int:
        """The embeddings each `schedule()` may encode (S:280-282)."""
        return self.max_num_batched_tokens if self.max_num_encoder_input_tokens is None \
            else self.max_num_encoder_input_tokens

    @property
    def encoder_cache_capacity(self) -> int:
        """The encoder cache's size in embeddings (S:283, 291-293)."""
        return self.max_num_batched_tokens if self.encoder_cache_size is None else self.encoder_cache_size

    @property
    def max_num_active_reqs(self) -> int:
        """The admission limit on len(running) (S:131-138)."""
        if self.max_num_active_seqs is None:
            return self.max_num_seqs
        return self.max_num_active_seqs

    @property
    def num_usable_blocks(self) -> int:
        """Block 0 is the null block and is never free (P:191)."""
        return self.num_gpu_blocks - 1

    @property
    def watermark_blocks(self) -> int:
        """Headroom an admission must leave free; computed on the total that
        includes the null block (K:210)."""
        return int(self.watermark * self.num_gpu_blocks)


def long_prefill_threshold(c: SchedulerConfig, num_eligible: int) -> int:
    """The long-prefill cap of a step with `num_eligible` running and waiting requests
    (S:754-772): none for a request alone (there is nobody to starve; from 0.31.0);
    adaptive, at least a fair share of the input budget."""
    if num_eligible <= 1 and has(c, LONG_PREFILL_THRESHOLD_NEEDS_TWO):
        return 0
    threshold = c.long_prefill_token_threshold
    if threshold > 0 and c.long_prefill_token_threshold_adaptive:
        return max(threshold, c.max_num_batched_tokens // num_eligible)
    return threshold


CONFIG_FIELDS = tuple(f.name for f in fields(SchedulerConfig))

# The integer fields: name -> (minimum, whether null is allowed).
INT_FIELDS = {
    "max_num_batched_tokens": (1, False),
    "max_num_scheduled_tokens": (1, True),
    "max_num_seqs": (1, False),
    "max_num_active_seqs": (1, True),
    "long_prefill_token_threshold": (0, False),
    "max_model_len": (1, False),
    "block_size": (1, False),
    "num_gpu_blocks": (1, False),
    "num_speculative_tokens": (0, False),
    "num_lookahead_tokens": (0, False),
    "num_prefill_lookahead_tokens": (0, False),
    "max_num_new_slots_for_drafting": (0, False),
    "num_hash_lookahead_tokens": (0, False),
    "max_loras": (1, True),
    "prefill_schedule_interval": (1, False),
    "max_num_encoder_input_tokens": (1, True),
    "encoder_cache_size": (1, True),
}
# The true/false fields.
BOOL_FIELDS = ("enable_chunked_prefill", "scheduler_reserve_full_isl", "enable_prefix_caching",
               "async_scheduling", "long_prefill_token_threshold_adaptive", "requires_kv_delivery",
               "use_eagle_block_drop", "disable_chunked_mm_input")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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


def config_from_dict(raw: Any, where: str = "config") -> SchedulerConfig:
    """Build a config from a scenario's `config` object: JSON types here, every
    value condition in `validate_config`."""
    if not isinstance(raw, dict):
        raise ConfigError(where, f"must be an object, got {excerpt(raw)}")
    unknown = [k for k in raw if k not in CONFIG_FIELDS]
    if unknown:
        raise ConfigError(
            field_path(where, unknown[0]),
            f"unknown field; known fields are {', '.join(CONFIG_FIELDS)}",
        )
    for name, value in raw.items():
        path = f"{where}.{name}"
        if name in INT_FIELDS:
            _, nullable = INT_FIELDS[name]
            if value is None and nullable:
                continue
            if not _is_int(value):
                raise ConfigError(path, f"must be an integer{' or null' if nullable else ''}, got {excerpt(value)}")
        elif name in BOOL_FIELDS:
            if not isinstance(value, bool):
                raise ConfigError(path, f"must be true or false, got {excerpt(value)}")
        elif name == "watermark":
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ConfigError(path, f"must be a number, got {excerpt(value)}")
            if _is_int(value) and not 0 <= value < 1:  # float() of a huge int overflows
                raise ConfigError(path, f"= {excerpt(value)}, must be in [0, 1); 0.0 disables the watermark")
        elif name in ("policy", "vllm_version"):
            if not isinstance(value, str):
                raise ConfigError(path, f"must be a string, got {excerpt(value)}")
    values = {k: (float(v) if k == "watermark" else v) for k, v in raw.items()}
    release = values.get("vllm_version", DEFAULT_RELEASE)
    if release in RELEASES:  # a field the release lacks means its older behaviour (versions.FIELDS_SINCE)
        values = {**{f: absent for f, (since, absent, _) in FIELDS_SINCE.items()
                     if release_key(release) < release_key(since)}, **values}
    config = SchedulerConfig(**values)
    validate_config(config, where)
    return config


def validate_config(c: SchedulerConfig, where: str = "config") -> None:
    """Raise ConfigError for the first condition vLLM 0.33.0 rejects."""

    def fail(name: str, message: str) -> None:
        raise ConfigError(f"{where}.{name}", message)

    if c.vllm_version not in RELEASES:
        fail("vllm_version", f"= {excerpt(c.vllm_version)} is not a release schedspec models; "
             f"use one of {', '.join(RELEASES)}")
    for name, (since, absent, source) in FIELDS_SINCE.items():
        if release_key(c.vllm_version) < release_key(since) and getattr(c, name) != absent:
            fail(name, f"= {excerpt(getattr(c, name))}, but vLLM {c.vllm_version} has no such field "
                 f"(added in {since}, {source}); leave it out or set it to {json.dumps(absent)}")

    # Field constraints declared on the pydantic dataclasses (C:41-196, CC:187).
    for name, (minimum, nullable) in INT_FIELDS.items():
        value = getattr(c, name)
        if value is None and nullable:
            continue
        minimum = field_minimum(c.vllm_version, name, minimum)  # spec/versions.py MINIMUM_SINCE
        if not _is_int(value) or (minimum is not None and value < minimum):
            fail(name, f"= {excerpt(value)}, must be an integer >= {minimum}")
    if not (0.0 <= c.watermark < 1.0):
        fail("watermark", f"= {c.watermark}, must be in [0, 1) (vLLM config/scheduler.py:196); "
             "0.0 disables the watermark")
    if c.policy not in POLICIES:
        fail("policy", f"= {excerpt(c.policy)}: unknown scheduling policy (vLLM scheduler.py:225); "
             f"use one of {', '.join(map(repr, POLICIES))}")
    # SchedulerConfig.verify_max_model_len, in vLLM's order (C:317-362).
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


def validate_spec_decode(c: SchedulerConfig, where: str = "config") -> None:
    """Speculative decoding's and LoRA's fields: modelled for the newest release
    only, and a lookahead only beside drafts (a drafter's own forward pass writes it)."""
    if c.num_speculative_tokens > 0 and c.vllm_version != DEFAULT_RELEASE:
        raise ConfigError(f"{where}.num_speculative_tokens",
                          f"= {c.num_speculative_tokens}: schedspec models speculative decoding for vLLM "
                          f"{DEFAULT_RELEASE} only, not {c.vllm_version}; set it to 0 or use vllm_version "
                          f"{DEFAULT_RELEASE}")
    if c.max_loras is not None and c.vllm_version != DEFAULT_RELEASE:
        raise ConfigError(f"{where}.max_loras", f"= {c.max_loras}: schedspec models LoRA for vLLM "
                          f"{DEFAULT_RELEASE} only, not {c.vllm_version}; leave it out or use vllm_version "
                          f"{DEFAULT_RELEASE}")
    if c.long_prefill_token_threshold_adaptive and c.vllm_version != DEFAULT_RELEASE:
        raise ConfigError(f"{where}.long_prefill_token_threshold_adaptive",
                          f"= true: schedspec models the adaptive long-prefill threshold for vLLM "
                          f"{DEFAULT_RELEASE} only, not {c.vllm_version}; set it to false or use vllm_version "
                          f"{DEFAULT_RELEASE}")
    if c.prefill_schedule_interval > 1 and c.vllm_version != DEFAULT_RELEASE:
        raise ConfigError(f"{where}.prefill_schedule_interval",
                          f"= {c.prefill_schedule_interval}: schedspec models prefill throttling for vLLM "
                          f"{DEFAULT_RELEASE} only, not {c.vllm_version}; set it to 1 or use vllm_version "
                          f"{DEFAULT_RELEASE}")
    if c.max_num_new_slots_for_drafting > c.num_speculative_tokens:
        raise ConfigError(f"{where}.max_num_new_slots_for_drafting",
                          f"= {c.max_num_new_slots_for_drafting} > num_speculative_tokens "
                          f"{c.num_speculative_tokens}: a drafter adds at most one row per draft token "
                          "(vLLM speculative.py:2058-2098); lower it")
    if c.num_hash_lookahead_tokens > 0 and c.vllm_version != DEFAULT_RELEASE:
        raise ConfigError(f"{where}.num_hash_lookahead_tokens",
                          f"= {c.num_hash_lookahead_tokens}: schedspec models lookahead block hashes for vLLM "
                          f"{DEFAULT_RELEASE} only, not {c.vllm_version}; set it to 0 or use vllm_version "
                          f"{DEFAULT_RELEASE}")
    if c.num_hash_lookahead_tokens > 0 and not c.enable_prefix_caching:
        raise ConfigError(f"{where}.num_hash_lookahead_tokens",
                          f"= {c.num_hash_lookahead_tokens} without prefix caching: only prefix caching hashes "
                          "blocks (vLLM config/vllm.py:677-692); set it to 0 or turn enable_prefix_caching on")
    if c.requires_kv_delivery and c.vllm_version != DEFAULT_RELEASE:
        raise ConfigError(f"{where}.requires_kv_delivery",
                          f"= true: schedspec models KV connectors for vLLM {DEFAULT_RELEASE} only, not "
                          f"{c.vllm_version}; set it to false or use vllm_version {DEFAULT_RELEASE}")
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
