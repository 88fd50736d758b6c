"""`allocate_slots`'s counting rule for one full-attention group (K:380-627).

K = vllm/v1/core/kv_cache_manager.py, T = single_type_kv_cache_manager.py,
P = block_pool.py.  Whether a request gets its slots depends only on counts: the
blocks it holds, the prefix-hit blocks it brings, how many of those sit in the
free queue, and the free queue's length.  Without prefix caching those counts
are the whole pool (`free + sum(held) == num_gpu_blocks - 1`); with it,
block_pool.py moves the blocks themselves once this rule has said yes.
"""

from __future__ import annotations

from .config import SchedulerConfig
from .request import Request, RequestStatus


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def get_num_blocks_to_allocate(block_size: int, num_blocks_held: int, num_tokens: int) -> int:
    """New blocks needed so that `num_tokens` slots exist (T:214-236)."""
    return max(cdiv(num_tokens, block_size) - num_blocks_held, 0)


def allocate_slots(
    config: SchedulerConfig,
    request: Request,
    num_new_tokens: int,
    num_blocks_held: int,
    num_free_blocks: int,
    *,
    full_sequence_must_fit: bool = False,
    has_scheduled_reqs: bool = True,
    num_new_computed_tokens: int = 0,
    num_hit_blocks: int = 0,
    num_evictable_hit_blocks: int = 0,
) -> int | None:
    """How many blocks leave the free queue for `request` to compute
    `num_new_tokens` more tokens, or None when the pool cannot hold them (K:380-627).

    None is the only failure: there is no partial allocation.  With prefix caching,
    an admission brings `num_hit_blocks` cached blocks covering
    `num_new_computed_tokens` tokens; the hit blocks nobody holds
    (`num_evictable_hit_blocks`) leave the free queue too (T:238-266).

    Contracts (PEP 316, checked by CrossHair: tests/test_crosshair.py):
    pre: 1 <= config.block_size <= 16 and 2 <= config.max_model_len <= 64 and 1 <= config.num_gpu_blocks <= 64
    pre: 0.0 <= config.watermark < 1.0 and 0 <= request.num_computed_tokens <= request.num_tokens
    pre: 0 < num_new_tokens <= 64 and 0 <= num_blocks_held <= 8 and 0 <= num_free_blocks <= 64
    post: __return__ is None or (0 <= __return__ <= num_free_blocks and (has_scheduled_reqs is False or request.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED) or __return__ + config.watermark_blocks <= num_free_blocks))
    post: __return__ is None or (num_blocks_held + __return__) * config.block_size >= min(request.num_computed_tokens + num_new_tokens, config.max_model_len) and (__return__ == 0 or (num_blocks_held + __return__ - 1) * config.block_size < min(request.num_computed_tokens + num_new_tokens, config.max_model_len))
    post: __return__ is not None or full_sequence_must_fit or config.watermark_blocks > 0 or (num_blocks_held + num_free_blocks) * config.block_size < min(request.num_computed_tokens + num_new_tokens, config.max_model_len)
    """
    if num_new_tokens <= 0:
        raise ValueError("num_new_tokens must be greater than 0")  # K:486-496
    L = config.max_model_len
    # The watermark applies only to admissions, and not to the first one (K:518-525).
    watermark_blocks = 0
    if has_scheduled_reqs and request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
        watermark_blocks = config.watermark_blocks
    held = num_blocks_held + num_hit_blocks
    if full_sequence_must_fit:
        # The full-ISL admission gate: the whole sequence, not only this chunk (K:531-548).
        full = get_num_blocks_to_allocate(config.block_size, held, min(request.num_tokens, L))
        if full + num_evictable_hit_blocks + watermark_blocks > num_free_blocks:
            return None
    total_computed_tokens = min(request.num_computed_tokens + num_new_computed_tokens, L)
    num_tokens_need_slot = min(total_computed_tokens + num_new_tokens, L)  # K:550-553
    need = get_num_blocks_to_allocate(config.block_size, held, num_tokens_need_slot)
    need += num_evictable_hit_blocks
    if need + watermark_blocks > num_free_blocks:  # K:584-588
        return None
    return need
