"""`allocate_slots`'s counting rule (K:401-648), and the KV pool as counts.

K = vllm/v1/core/kv_cache_manager.py, T = single_type_kv_cache_manager.py.  Whether
a request gets its slots depends only on counts (docs/rules.md §5).  One KV model,
two views behind one interface (`KVCache`): `BlockCounts` here when no block's
identity is observable (prefix caching off), `block_pool.BlockPool` block by block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from .config import SchedulerConfig
from .request import PREEMPTED, WAITING, Request, RequestStatus  # noqa: F401 - RequestStatus: in the contracts


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def get_num_blocks_to_allocate(block_size: int, num_blocks_held: int, num_tokens: int) -> int:
    """New blocks needed so that `num_tokens` slots exist (T:219-241)."""
    return max(-(-num_tokens // block_size) - num_blocks_held, 0)  # cdiv inlined: a hot path


def allocate_slots(config: SchedulerConfig, request: Request, num_new_tokens: int, num_blocks_held: int,
                   num_free_blocks: int, *, full_sequence_must_fit: bool = False, has_scheduled_reqs: bool = True,
                   num_hit_blocks: int = 0, num_evictable_hit_blocks: int = 0,
                   num_external_computed_tokens: int = 0, reserved_blocks: int = 0,
                   num_lookahead_tokens: int | None = None) -> int | None:
    """How many new blocks `request` takes from the free queue to compute
    `num_new_tokens` more tokens, or None when the pool cannot hold them (K:401-648).

    None is the only failure: there is no partial allocation.  With prefix caching,
    an admission brings `num_hit_blocks` cached blocks; the ones nobody holds
    (`num_evictable_hit_blocks`) leave the free queue too, so they count against it
    (T:243-271), but they are not new blocks.  `reserved_blocks` stay free (S:1482-1492).

    Contracts (PEP 316; CrossHair's search bounds are in tests/test_crosshair.py):
    pre: 0.0 <= config.watermark < 1.0 and 0 <= request.num_computed_tokens <= request.num_tokens and config.num_lookahead_tokens >= 0
    pre: num_new_tokens > 0 and num_blocks_held >= 0 and num_free_blocks >= 0
    pre: num_hit_blocks == 0 and num_evictable_hit_blocks == 0 and num_external_computed_tokens == 0
    post: __return__ is None or (0 <= __return__ <= num_free_blocks and (has_scheduled_reqs is False or request.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED) or __return__ + config.watermark_blocks <= num_free_blocks))
    post: __return__ is None or (num_blocks_held + __return__) * config.block_size >= min(request.num_computed_tokens + num_new_tokens + config.num_lookahead_tokens, config.max_model_len) and (__return__ == 0 or (num_blocks_held + __return__ - 1) * config.block_size < min(request.num_computed_tokens + num_new_tokens + config.num_lookahead_tokens, config.max_model_len))
    post: __return__ is not None or full_sequence_must_fit or config.watermark_blocks > 0 or (num_blocks_held + num_free_blocks) * config.block_size < min(request.num_computed_tokens + num_new_tokens + config.num_lookahead_tokens, config.max_model_len)
    """
    if num_new_tokens <= 0 and not (num_new_tokens == 0 and (num_external_computed_tokens or num_hit_blocks)):
        raise ValueError("num_new_tokens must be greater than 0 when there are no computed tokens to adopt")  # K:504-512
    L = config.max_model_len
    # The watermark applies only to admissions, and not to the first one (K:539-546).
    admission = has_scheduled_reqs and (request.status == WAITING or request.status == PREEMPTED)
    watermark_blocks = config.watermark_blocks if admission else 0
    held = num_blocks_held + num_hit_blocks
    if full_sequence_must_fit:
        # The full-ISL admission gate: the whole sequence, not only this chunk (K:552-569).
        full = get_num_blocks_to_allocate(config.block_size, held, min(request.num_tokens, L))
        if full + num_evictable_hit_blocks + watermark_blocks > num_free_blocks:
            return None
    total_computed_tokens = min(request.num_computed_tokens + num_hit_blocks * config.block_size
                                + num_external_computed_tokens, L)  # external tokens: new blocks (K:580-587)
    # Speculative decoding: the drafter writes KV past the scheduled tokens (K:571-574).
    lookahead = config.num_lookahead_tokens if num_lookahead_tokens is None else num_lookahead_tokens
    num_tokens_need_slot = min(total_computed_tokens + num_new_tokens + lookahead, L)
    new_blocks = get_num_blocks_to_allocate(config.block_size, held, num_tokens_need_slot)
    if new_blocks + num_evictable_hit_blocks + watermark_blocks > num_free_blocks - reserved_blocks:  # K:603-609
        return None
    return new_blocks


class KVCache(Protocol):
    """What the scheduler asks of the working copy of the KV pool, in either view."""
    num_free_blocks: int

    def num_blocks(self, request_id: str) -> int: ...
    def get_computed_blocks(self, block_hashes: tuple, num_tokens: int, block_size: int) -> list[int]: ...
    def num_evictable(self, blocks: Sequence[int]) -> int: ...
    def allocate(self, request_id: str, hits: Sequence[int], num_new_blocks: int) -> None: ...
    def cache_blocks(self, request_id: str, block_hashes: tuple, num_tokens: int, block_size: int) -> None: ...
    def free(self, request_id: str) -> None: ...


@dataclass(frozen=True)
class BlockCounts:
    """The pool as counts: `num_free_blocks + sum(held) == num_gpu_blocks - 1`.
    A request holding no block is absent unless it was granted tokens."""

    num_free_blocks: int
    req_to_num_blocks: Mapping[str, int] = field(default_factory=dict)

    def num_blocks(self, request_id: str) -> int:
        return self.req_to_num_blocks.get(request_id, 0)

    def work(self) -> "BlockCountsWork":
        return BlockCountsWork(self)


class BlockCountsWork:
    """The working copy of `BlockCounts` inside one scheduler call.  Nothing is
    cached, so there are never hits, and there is nothing to hash."""

    def __init__(self, counts: BlockCounts):
        self.num_free_blocks = counts.num_free_blocks
        self.req_to_num_blocks = dict(counts.req_to_num_blocks)

    def num_blocks(self, request_id: str) -> int:
        return self.req_to_num_blocks.get(request_id, 0)

    def get_computed_blocks(self, block_hashes: tuple, num_tokens: int, block_size: int) -> list[int]:
        return []

    def num_evictable(self, blocks: Sequence[int]) -> int:
        return 0

    def allocate(self, request_id: str, hits: Sequence[int], num_new_blocks: int) -> None:
        self.req_to_num_blocks[request_id] = self.req_to_num_blocks.get(request_id, 0) + num_new_blocks
        self.num_free_blocks -= num_new_blocks

    def cache_blocks(self, request_id: str, block_hashes: tuple, num_tokens: int, block_size: int) -> None:
        pass

    def free(self, request_id: str) -> None:
        self.num_free_blocks += self.req_to_num_blocks.pop(request_id, 0)

    def freeze(self) -> BlockCounts:
        return BlockCounts(self.num_free_blocks, self.req_to_num_blocks)
