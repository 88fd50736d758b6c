"""The torch implementation's size limits and the features it does not model,
in one place, and the checks that reject a scenario beyond them.

Features (`UNMODELLED`): one table row per scenario field that only a feature
torch does not model uses.  The refusals of gpu/batch.py (`prepare`: a
scenario's config and requests) and gpu/impl.py (`TorchScheduler`: a config at
reset, a request at add_request) and their messages derive from it, and so does
what torch declares it does not model (`UNMODELLED_FEATURES`, the generator's
feature names, reference/generator.py FEATURES), which `TorchScheduler` carries
as `unmodelled_features` for random campaigns to leave out (the generator reads
it through the implementation: reference may not import gpu).

Dtypes (gpu/state.py, gpu/step.py):
- per-request token and block counters (`num_computed_tokens`,
  `num_output_tokens`, `num_prompt_tokens`, `max_tokens`, blocks held, a step's
  grants) are int32, and so is the step's per-request arithmetic on them.
  The largest value one holds is `num_computed_tokens + n <= max_model_len`, and
  the step code adds two token counts at most before comparing, so
  `max_model_len <= 2**30` keeps every per-request value below 2**31.
- the room left in a request's blocks counts a block larger than
  max_model_len as max_model_len (`bs = min(block_size, max_model_len)`, which
  changes no ceiling, gpu/step.py), so its slots `held * bs` are below
  `max_model_len + bs <= 2**31` for max_model_len <= 2**30.
- block floors and ceilings (`floor(t / block_size)`, `ceil(t / block_size)`)
  divide in floating point (Batch.block_size_f), which vectorises where integer
  division does not.  Every dividend is an integer with |t| < 3 * max_model_len
  (a token count, or a grant less the room left in blocks held).  IEEE division
  is correctly rounded, so for integers |t| < 2**p (p = 24 for float32, 53 for
  float64) and any d >= 1 the float quotient has the floor and ceiling of t / d:
  t and d (when d < 2**p) are exact; a non-integer quotient is at least 1 / d
  from the nearest integer, more than half an ulp of a quotient below 2**p / d;
  and a d of 2**p or more (rounded or not) exceeds |t|, so the quotient stays
  strictly between -1 and 1 with t's sign.  float32 is used when every
  max_model_len of the batch is at most 2**22 (3 * 2**22 < 2**24), float64
  otherwise (|t| < 2**31).
- sums over requests (the running loop's and the admissions' prefix sums of
  token needs and of block needs, and a scenario's freed blocks) are int64:
  at most R * max_model_len, which does exceed 2**31 (4096 * 2**30 = 2**42), so
  they stay int64, below 2**63 for any R that fits in memory.  The running
  loop's sums are int32 in a batch where R * (max_model_len + 1) < 2**31 (its
  largest max_model_len, Batch.longest_model_len): a request's need and its
  blocks are each at most max_model_len, so every sum is below 2**31 - 1; the
  budget and free-block counts they are compared with are clipped to 2**31 - 1,
  which is above every sum, so no comparison changes.
- per-scenario budgets and pool counters (`token_budget`, free blocks,
  `max_num_seqs`, the watermark) are int64; a config value must be below 2**62
  so that adding a refund or a freed request's blocks cannot overflow.
- running-order and FCFS waiting-order keys are int64 counters that grow by one
  per admission or preemption: at most max_steps * R, below 2**62 (the sort
  puts non-members at 2**62, after every key).
- step numbers (`first_token_step`, `finish_step`, arrival and abort steps) are
  int32, so `max_steps <= 2**31 - 1`.
- `priority` and `arrival_time` never reach the device: the host turns them
  into ranks. `max_tokens` and `output_len` above `max_model_len` are clamped
  on the host (a request can never produce more than max_model_len tokens, so
  the clamp changes no decision).
- R (requests per scenario) has no dtype limit; memory is the limit
  (about 120 bytes of device state per request slot).

- prefix caching (gpu/pool.py): the block tables and each request's hash ids
  are (S, R, H) int32, H the most blocks one request of the batch can hold
  (ceil(min(prompt + min(max_tokens, max_steps), max_model_len) / block_size) + 1):
  they are a batch's largest tensors (in a 5000-scenario campaign, 1024
  scenarios x 40 requests x up to 2000 blocks), so int32 halves its memory.
  Block slots (block id - 1) must then fit in int32: `num_gpu_blocks` <=
  2**31 - 1 (formats.md caps it at 2**22); hash ids per scenario are below the
  R * H entries that hold them.  Per-block pool state (ref counts, hashes,
  stamps, free-queue keys, with never-used blocks keyed by their id and freed
  hashed blocks from 2**40 on) stays int64, and indices are widened on read.
- async scheduling: placeholders, tokens in flight and stale tokens are
  per-request token counts, int32 like num_computed_tokens (each at most
  max_model_len); the batch in flight keeps its grants int32 and its grant
  order int64 (run_pos).

The brief's sizes, R = 4096 and max_model_len = 1M (2**20), are well inside.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

# The oldest release whose rules the torch implementation has: it applies every gate of
# spec/versions.py up to 0.33.0 as in force, and asks those after it (gpu/batch.py config_row).
OLDEST_RELEASE = "0.33.0"
MAX_MODEL_LEN = 2**30
MAX_CONFIG_INT = 2**62 - 1
MAX_STEPS = 2**31 - 1
MAX_PREFIX_BLOCKS = 2**31 - 1
MAX_FLOAT32_DIV_LEN = 2**22  # block divisions in float32 up to this max_model_len

# config fields that land in int64 per-scenario tensors
_INT64_FIELDS = ("max_num_batched_tokens", "max_num_scheduled_tokens", "max_num_seqs",
                 "max_num_active_seqs", "num_gpu_blocks", "block_size", "long_prefill_token_threshold")


class Unmodelled(NamedTuple):
    """A feature the torch implementation does not model, by the scenario field
    that uses it: a scenario using it is refused, never run as if it did not."""

    features: tuple[str, ...]  # its names in reference/generator.py FEATURES
    field: str  # the field of a scenario's config (`request_attr` None) or of each of its requests
    what: str  # what torch does not model, as the refusal says
    used: Callable[[Any], bool]  # whether the field's value uses the feature
    shown: Callable[[Any], str]  # the value, as the refusal shows it
    request_attr: str | None = None  # a request field: the spec Request's attribute (TorchScheduler.add_request)


def _is_set(value) -> bool:
    return value is not None


def _equals(value) -> str:
    return f"= {value}"


def _true(value) -> str:
    return "= true"


def _items(value) -> str:
    return f"{len(value)} item(s)"


UNMODELLED: tuple[Unmodelled, ...] = (
    # config fields, checked in this order
    Unmodelled(("spec_decode", "eagle"), "num_speculative_tokens", "speculative decoding", bool, _equals),
    Unmodelled(("lora",), "max_loras", "LoRA", _is_set, _equals),
    Unmodelled(("kv_connector",), "requires_kv_delivery", "KV connectors", bool, _true),
    Unmodelled(("hash_lookahead",), "num_hash_lookahead_tokens", "lookahead block hashes", bool, _equals),
    Unmodelled(("adaptive_threshold",), "long_prefill_token_threshold_adaptive",
               "the adaptive long-prefill threshold", bool, _true),
    Unmodelled(("prefill_throttle",), "prefill_schedule_interval", "prefill throttling", lambda v: v > 1, _equals),
    Unmodelled(("cache_aware",), "cache_aware_admission_window", "cache-aware admission", bool, _equals),
    # request fields, checked in this order for each request
    Unmodelled(("structured_output",), "grammar_compile_steps", "structured output", _is_set, _equals, "grammar"),
    Unmodelled(("kv_connector",), "kv_connector_tokens", "KV connector hits", bool, _equals, "kv_connector_tokens"),
    Unmodelled(("kv_connector",), "kv_connector_send_steps", "KV connector sends", _is_set, _equals,
               "kv_connector_sends"),
    Unmodelled(("encoder_inputs",), "mm_features", "encoder inputs", bool, _items, "mm_features"),
)
UNMODELLED_CONFIG = tuple(u for u in UNMODELLED if u.request_attr is None)
UNMODELLED_REQUEST = tuple(u for u in UNMODELLED if u.request_attr is not None)
# What torch declares it does not model (gpu/impl.py `TorchScheduler.unmodelled_features`):
# random campaigns against it draw none of these.
UNMODELLED_FEATURES = frozenset(f for u in UNMODELLED for f in u.features)
_USE_OTHERS = "use --impl spec or vllm"


def _refusal(where: str, u: Unmodelled, value) -> str:
    return f"{where}.{u.field}: {u.shown(value)}: the torch implementation does not model {u.what}; {_USE_OTHERS}"


def unmodelled_in_config(config) -> str | None:
    """The refusal of the first config field that uses a feature torch does not model, or None."""
    for u in UNMODELLED_CONFIG:
        value = getattr(config, u.field)
        if u.used(value):
            return _refusal("config", u, value)
    return None


def unmodelled_in_requests(requests) -> str | None:
    """The refusal of the first scenario request (reference/scenario.py) that uses
    a feature torch does not model, the first such field of it, or None."""
    for i, r in enumerate(requests):
        for u in UNMODELLED_REQUEST:
            value = getattr(r, u.field)
            if u.used(value):
                return _refusal(f"requests[{i}]", u, value)
    return None


def unmodelled_in_request(request) -> str | None:
    """The refusal of a spec Request (spec/request.py) given to `TorchScheduler`,
    or None."""
    for u in UNMODELLED_REQUEST:
        if getattr(request, u.request_attr):
            return (f"request {request.request_id}: {u.request_attr}: the torch implementation does not model "
                    f"{u.what}; {_USE_OTHERS}")
    return None


def limit_violation(config, max_steps: int) -> str | None:
    """A one-line message naming the first field beyond the torch limits, or None.
    `config` is a validated spec SchedulerConfig."""
    # Features the torch implementation does not model: refused, never ignored.
    unmodelled = unmodelled_in_config(config)
    if unmodelled:
        return unmodelled
    if config.enable_prefix_caching and config.num_gpu_blocks > MAX_PREFIX_BLOCKS:
        return (f"config.num_gpu_blocks: = {config.num_gpu_blocks} exceeds the torch implementation's "
                f"limit {MAX_PREFIX_BLOCKS} with prefix caching (2**31 - 1; int32 block tables, gpu/limits.py)")
    if config.max_model_len > MAX_MODEL_LEN:
        return (f"config.max_model_len: = {config.max_model_len} exceeds the torch implementation's "
                f"limit {MAX_MODEL_LEN} (2**30; int32 token counters, gpu/limits.py)")
    for name in _INT64_FIELDS:
        value = getattr(config, name)
        if value is not None and value > MAX_CONFIG_INT:
            return (f"config.{name}: = {value} exceeds the torch implementation's limit "
                    f"{MAX_CONFIG_INT} (2**62 - 1; int64 counters, gpu/limits.py)")
    if max_steps > MAX_STEPS:
        return (f"max_steps: = {max_steps} exceeds the torch implementation's limit {MAX_STEPS} "
                "(2**31 - 1; int32 step numbers, gpu/limits.py)")
    return None
