"""The torch implementation's size limits, in one place, and the check that
rejects a scenario beyond them.

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


def limit_violation(config, max_steps: int) -> str | None:
    """A one-line message naming the first field beyond the torch limits, or None.
    `config` is a validated spec SchedulerConfig."""
    # Features the torch implementation does not model: refused, never ignored.
    if config.num_speculative_tokens:
        return (f"config.num_speculative_tokens: = {config.num_speculative_tokens}: the torch implementation "
                "does not model speculative decoding; use --impl spec or vllm")
    if config.max_loras is not None:
        return (f"config.max_loras: = {config.max_loras}: the torch implementation does not model LoRA; "
                "use --impl spec or vllm")
    if config.requires_kv_delivery:
        return ("config.requires_kv_delivery: = true: the torch implementation does not model KV connectors; "
                "use --impl spec or vllm")
    if config.num_hash_lookahead_tokens:
        return (f"config.num_hash_lookahead_tokens: = {config.num_hash_lookahead_tokens}: the torch implementation "
                "does not model lookahead block hashes; use --impl spec or vllm")
    if config.long_prefill_token_threshold_adaptive:
        return ("config.long_prefill_token_threshold_adaptive: = true: the torch implementation does not model "
                "the adaptive long-prefill threshold; use --impl spec or vllm")
    if config.prefill_schedule_interval > 1:
        return (f"config.prefill_schedule_interval: = {config.prefill_schedule_interval}: the torch implementation "
                "does not model prefill throttling; use --impl spec or vllm")
    if config.cache_aware_admission_window:
        return (f"config.cache_aware_admission_window: = {config.cache_aware_admission_window}: the torch "
                "implementation does not model cache-aware admission; use --impl spec or vllm")
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
