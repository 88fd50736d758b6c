"""The KV block pool block by block, for `enable_prefix_caching` (one full-attention
group; P = vllm/v1/core/block_pool.py, T = single_type_kv_cache_manager.py,
K = kv_cache_manager.py, KU = kv_cache_utils.py; docs/rules.md §6).

With prefix caching, which block holds which tokens decides hits and eviction, so
this is the smallest block-level model that is step-exact.  Block ids are vLLM's,
1 .. num_gpu_blocks - 1 (0 is the null block), handed out in the same order, so a
trace can name blocks.  The free queue in pop order is `free_front +
[next_fresh, num_gpu_blocks) + free_back`: freed blocks without a hash are
prepended, hashed ones appended (P:799-839), never-used ones sit between in id
order.  So the back holds only hashed blocks, oldest-freed first (LRU): exactly
the blocks a prefix hit can take out of the queue (P:774).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .kv_cache_utils import BlockHash


@dataclass(frozen=True)
class BlockPool:
    num_gpu_blocks: int
    free_front: tuple[int, ...] = ()
    next_fresh: int = 1
    free_back: tuple[int, ...] = ()
    ref_cnt: Mapping[int, int] = field(default_factory=dict)  # held blocks only (> 0)
    block_hash: Mapping[int, BlockHash] = field(default_factory=dict)  # every hashed block
    # hash -> its blocks in insertion order; a lookup takes the first (P:66-69).
    cached: Mapping[BlockHash, tuple[int, ...]] = field(default_factory=dict)
    req_to_blocks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    num_cached_block: Mapping[str, int] = field(default_factory=dict)
    unhashed_first: bool = True  # where a freed unhashed block goes: versions.UNHASHED_FREE_BLOCKS_FIRST

    @property
    def num_free_blocks(self) -> int:
        """P:903: the free queue's length, cached blocks included."""
        return len(self.free_front) + (self.num_gpu_blocks - self.next_fresh) + len(self.free_back)

    def free_queue(self) -> tuple[int, ...]:
        return self.free_front + tuple(range(self.next_fresh, self.num_gpu_blocks)) + self.free_back

    def num_blocks(self, request_id: str) -> int:
        return len(self.req_to_blocks.get(request_id, ()))

    @property
    def req_to_num_blocks(self) -> dict[str, int]:
        return {rid: len(blocks) for rid, blocks in self.req_to_blocks.items()}

    def work(self) -> "PoolWork":
        return PoolWork(self)


class PoolWork:
    """The working copy of a BlockPool inside one scheduler call (kv_cache.KVCache)."""

    def __init__(self, pool: BlockPool):
        # The frozen pool's structures until the first change (`own`), so a call that
        # changes nothing (a synchronous update_from_output) copies nothing.
        self.pool, self.owned = pool, False
        self.num_gpu_blocks, self.next_fresh = pool.num_gpu_blocks, pool.next_fresh
        self.front, self.back = pool.free_front, pool.free_back
        self.ref_cnt, self.block_hash, self.cached = pool.ref_cnt, pool.block_hash, pool.cached
        self.req_to_blocks, self.num_cached_block = pool.req_to_blocks, pool.num_cached_block
        self.num_free_blocks, self.unhashed_first = pool.num_free_blocks, pool.unhashed_first  # see freeze()

    def own(self) -> None:  # copy on first write
        if not self.owned:
            self.owned = True
            self.front, self.back = deque(self.front), dict.fromkeys(self.back)  # back: an ordered set
            self.ref_cnt, self.block_hash, self.cached = dict(self.ref_cnt), dict(self.block_hash), dict(self.cached)
            self.req_to_blocks, self.num_cached_block = dict(self.req_to_blocks), dict(self.num_cached_block)

    def freeze(self) -> BlockPool:
        if not self.owned:
            return self.pool
        assert self.num_free_blocks == len(self.front) + (self.num_gpu_blocks - self.next_fresh) + len(self.back)
        return BlockPool(self.num_gpu_blocks, tuple(self.front), self.next_fresh, tuple(self.back), self.ref_cnt,
                         self.block_hash, self.cached, self.req_to_blocks, self.num_cached_block, self.unhashed_first)

    def num_blocks(self, request_id: str) -> int:
        return len(self.req_to_blocks.get(request_id, ()))

    def allocate(self, request_id: str, hits: Sequence[int], num_new_blocks: int) -> None:
        """The hits become the request's first blocks, then new blocks follow (K:611-648)."""
        if hits:
            self.add_hits(request_id, hits)
        self.allocate_new_blocks(request_id, num_new_blocks)

    def get_computed_blocks(self, block_hashes: tuple, num_tokens: int, block_size: int) -> list[int]:
        """The longest run of cached blocks from the start, over at most (num_tokens - 1)
        // block_size blocks: one token is always left to compute (K:318-329, T:797-805)."""
        hits = []
        for h in block_hashes[:(num_tokens - 1) // block_size]:
            if not self.cached.get(h):
                break
            hits.append(self.cached[h][0])
        return hits

    def num_evictable(self, blocks: Sequence[int]) -> int:
        """Hit blocks that touching takes out of the free queue (T:261-266)."""
        return sum(1 for b in blocks if self.ref_cnt.get(b, 0) == 0)

    def _uncache(self, block: int) -> None:
        """Evict a reused block's hash (P:751-772, 605-624)."""
        h = self.block_hash.pop(block, None)
        if h is not None:
            rest = tuple(b for b in self.cached[h] if b != block)
            if rest:
                self.cached[h] = rest
            else:
                del self.cached[h]

    def add_hits(self, request_id: str, hits: Sequence[int]) -> None:
        """Touch the hit blocks and make them the request's first blocks (T:273-329, P:774-792)."""
        self.own()
        for b in hits:
            if self.ref_cnt.get(b, 0) == 0:
                del self.back[b]
                self.num_free_blocks -= 1
            self.ref_cnt[b] = self.ref_cnt.get(b, 0) + 1
        self.req_to_blocks[request_id] = tuple(hits)
        self.num_cached_block[request_id] = len(hits)

    def allocate_new_blocks(self, request_id: str, num_blocks: int) -> None:
        """Pop `num_blocks` from the queue head, evicting any hash they carry (P:681-722)."""
        self.own()
        new = []
        for _ in range(num_blocks):
            if self.front:
                b = self.front.popleft()
            elif self.next_fresh < self.num_gpu_blocks:
                b = self.next_fresh
                self.next_fresh += 1
            else:
                b = next(iter(self.back))
                del self.back[b]
            self._uncache(b)
            self.ref_cnt[b] = 1
            new.append(b)
        self.num_free_blocks -= num_blocks
        self.req_to_blocks[request_id] = self.req_to_blocks.get(request_id, ()) + tuple(new)

    def cache_blocks(self, request_id: str, block_hashes: tuple, num_tokens: int, block_size: int) -> None:
        """Hash the request's full blocks up to `num_tokens` (T:482-546, P:203-273)."""
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = min(num_tokens, len(block_hashes) * block_size) // block_size
        if num_cached >= num_full:
            return
        self.own()
        blocks = self.req_to_blocks[request_id]
        for i in range(num_cached, num_full):
            b, h = blocks[i], block_hashes[i]
            # No hash yet: pops evict, hits lie below num_cached; vLLM asserts it too, bar partial blocks (P:263-269).
            assert b not in self.block_hash, (request_id, i, b)
            self.block_hash[b] = h
            self.cached[h] = self.cached.get(h, ()) + (b,)
        self.num_cached_block[request_id] = num_full

    def free(self, request_id: str) -> None:
        """Release the request's blocks, tail first, so its last blocks are evicted
        first (T:596-604, P:799-839)."""
        self.own()
        blocks = self.req_to_blocks.pop(request_id, ())
        self.num_cached_block.pop(request_id, None)
        first, last = [], []
        for b in reversed(blocks):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                del self.ref_cnt[b]
                (last if b in self.block_hash else first).append(b)
        if not self.unhashed_first:  # 0.20.0: every freed block to the back, in freeing order
            freed = set(first) | set(last)
            first, last = [], [b for b in reversed(blocks) if b in freed]
        self.front.extendleft(reversed(first))
        for b in last:
            self.back[b] = None
        self.num_free_blocks += len(first) + len(last)
