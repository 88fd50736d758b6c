"""The KV block pool block by block, for `enable_prefix_caching` (one full-attention group).

P = vllm/v1/core/block_pool.py, T = single_type_kv_cache_manager.py,
K = kv_cache_manager.py, KU = kv_cache_utils.py.

Without prefix caching no block's identity is observable, so the scheduler keeps
counts (kv_cache.py).  With it, which block holds which tokens decides hits and
eviction, so this module keeps the smallest block-level model that is step-exact:

- A block hash is a digest chained over the parent block's hash and the block's
  token ids (128-bit BLAKE2b, where vLLM chains sha256 or xxhash): two blocks match
  only when their whole prefixes match.  Collisions are ignored, as vLLM ignores
  its own.  Only full blocks are hashed (RQ:285-288).
- Block ids are vLLM's: 1 .. num_gpu_blocks - 1 (0 is the null block), handed out
  from the free queue (KU FreeKVCacheBlockQueue) in the same order, so a trace can
  name blocks and be compared with vLLM's.
- The free queue in pop order is `free_front + [next_fresh, num_gpu_blocks) +
  free_back`.  Freed blocks without a hash are prepended and hashed ones appended
  (P:816-849); blocks never handed out sit between them in id order.  So the front
  holds only unhashed blocks and the back only hashed ones, oldest-freed first
  (LRU): exactly the blocks a prefix hit can take out of the queue (P:792).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence

BlockHash = bytes


def hash_block(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """The hash of a full block: its parent's hash and its token ids (KU hash_block_tokens).
    A fixed-size digest, so a deep prefix costs no more to compare than a short one."""
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def extend_block_hashes(hashes: tuple, token_ids: Sequence[int], block_size: int) -> tuple:
    """`hashes` extended over every full block of `token_ids` (RQ:285-288)."""
    out = list(hashes)
    parent = out[-1] if out else None
    for i in range(len(out), len(token_ids) // block_size):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return tuple(out)


@dataclass(frozen=True)
class BlockPool:
    num_gpu_blocks: int
    free_front: tuple[int, ...] = ()
    next_fresh: int = 1
    free_back: tuple[int, ...] = ()
    ref_cnt: Mapping[int, int] = field(default_factory=dict)  # held blocks only (> 0)
    block_hash: Mapping[int, BlockHash] = field(default_factory=dict)  # every hashed block
    # hash -> its blocks in insertion order; a lookup takes the first (P:63-72).
    cached: Mapping[BlockHash, tuple[int, ...]] = field(default_factory=dict)
    req_to_blocks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    num_cached_block: Mapping[str, int] = field(default_factory=dict)

    @property
    def num_free_blocks(self) -> int:
        """P:912: the free queue's length, cached blocks included."""
        return len(self.free_front) + (self.num_gpu_blocks - self.next_fresh) + len(self.free_back)

    def free_queue(self) -> tuple[int, ...]:
        return self.free_front + tuple(range(self.next_fresh, self.num_gpu_blocks)) + self.free_back


class PoolWork:
    """A mutable working copy of a BlockPool, made and frozen inside one scheduler
    call (the way `schedule()` works on copies of its queues)."""

    def __init__(self, pool: BlockPool):
        self.num_gpu_blocks = pool.num_gpu_blocks
        self.front = deque(pool.free_front)
        self.next_fresh = pool.next_fresh
        self.back = dict.fromkeys(pool.free_back)  # an ordered set
        self.ref_cnt = dict(pool.ref_cnt)
        self.block_hash = dict(pool.block_hash)
        self.cached = dict(pool.cached)
        self.req_to_blocks = dict(pool.req_to_blocks)
        self.num_cached_block = dict(pool.num_cached_block)

    def freeze(self) -> BlockPool:
        return BlockPool(self.num_gpu_blocks, tuple(self.front), self.next_fresh, tuple(self.back),
                         self.ref_cnt, self.block_hash, self.cached, self.req_to_blocks,
                         self.num_cached_block)

    @property
    def num_free_blocks(self) -> int:
        return len(self.front) + (self.num_gpu_blocks - self.next_fresh) + len(self.back)

    def get_computed_blocks(self, block_hashes: tuple, num_tokens: int, block_size: int) -> list[int]:
        """The longest run of cached blocks from the start, over at most
        (num_tokens - 1) // block_size blocks: one token is always left to compute,
        which makes a block-aligned full hit recompute its whole last block
        (K:295-307, T:792-800)."""
        hits = []
        for h in block_hashes[:(num_tokens - 1) // block_size]:
            blocks = self.cached.get(h)
            if not blocks:
                break
            hits.append(blocks[0])
        return hits

    def num_evictable(self, blocks: Sequence[int]) -> int:
        """Hit blocks that touching takes out of the free queue (T:256-261)."""
        return sum(1 for b in blocks if self.ref_cnt.get(b, 0) == 0)

    def _uncache(self, block: int) -> None:
        """Evict a reused block's hash (P:769-790, 630-649)."""
        h = self.block_hash.pop(block, None)
        if h is not None:
            rest = tuple(b for b in self.cached[h] if b != block)
            if rest:
                self.cached[h] = rest
            else:
                del self.cached[h]

    def add_hits(self, request_id: str, hits: Sequence[int]) -> None:
        """Touch the hit blocks and make them the request's first blocks (T:268-324, P:792-810)."""
        for b in hits:
            if self.ref_cnt.get(b, 0) == 0:
                del self.back[b]
            self.ref_cnt[b] = self.ref_cnt.get(b, 0) + 1
        self.req_to_blocks[request_id] = tuple(hits)
        self.num_cached_block[request_id] = len(hits)

    def allocate_new_blocks(self, request_id: str, num_blocks: int) -> None:
        """Pop `num_blocks` from the queue head, evicting any hash they carry (P:706-740)."""
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
        self.req_to_blocks[request_id] = self.req_to_blocks.get(request_id, ()) + tuple(new)

    def cache_blocks(self, request_id: str, block_hashes: tuple, num_tokens: int, block_size: int) -> None:
        """Hash the request's full blocks up to `num_tokens` (T:477-541, P:230-300)."""
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = min(num_tokens, len(block_hashes) * block_size) // block_size
        if num_cached >= num_full:
            return
        blocks = self.req_to_blocks[request_id]
        for i in range(num_cached, num_full):
            b, h = blocks[i], block_hashes[i]
            if self.block_hash.get(b) == h or b in self.cached.get(h, ()):
                continue
            self.block_hash[b] = h
            self.cached[h] = self.cached.get(h, ()) + (b,)
        self.num_cached_block[request_id] = num_full

    def free(self, request_id: str) -> int:
        """Release the request's blocks, tail first, so its last blocks are evicted
        first (T:591-599, P:816-849).  Returns how many blocks it held."""
        blocks = self.req_to_blocks.pop(request_id, ())
        self.num_cached_block.pop(request_id, None)
        first, last = [], []
        for b in reversed(blocks):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                del self.ref_cnt[b]
                (last if b in self.block_hash else first).append(b)
        self.front.extendleft(reversed(first))
        for b in last:
            self.back[b] = None
        return len(blocks)
