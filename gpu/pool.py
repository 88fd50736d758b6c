"""The KV block pool block by block, for `enable_prefix_caching`, as tensors
(docs/rules.md §6; P = vllm/v1/core/block_pool.py, K = kv_cache_manager.py,
T = single_type_kv_cache_manager.py of vLLM 0.34.0).

With prefix caching, which block holds which tokens decides the hits and what an
allocation evicts, so the pool is kept block by block.  Per scenario (row), block
slot k is vLLM's block id k + 1 (the null block 0 is never free):

- `ref` (S, W): holders; a block with none is in the free queue;
- `bhash` (S, W): the block's hash id (-1: none), an integer interned on the host
  per scenario (gpu/hashes.py); `cstamp` when it was cached under it.  vLLM's map
  hash -> blocks lists the blocks of one hash in caching order and a lookup takes
  the first (P:66-69): here the block of that hash with the smallest `cstamp`;
- `fkey` (S, W): the block's place in the free queue (HELD when not in it).  The
  queue in pop order is: freed blocks without a hash, the last freed first
  (P:799-839 prepends them), keys < 0 from a decreasing counter; never-used blocks
  in id order, key = block id; freed hashed blocks, oldest first (appended: LRU),
  keys >= BACK from an increasing counter.  One free call releases a request's
  blocks tail first (T:596-604), so a request's last blocks are evicted first;
- `table` (S, R, H): each request's block table (slot indices, -1 past its end);
  `ncached` (S, R): how many of its first blocks are cached (vLLM's
  num_cached_block).

The lookup map: `head` (S, NH) is the block a lookup finds per hash id (-1:
none), `hstamp` its cstamp and `count` how many blocks the hash has; a head
that is evicted while its hash has other blocks is recomputed from the blocks.

The pool's tensors are updated in place (a step's State owns them; nothing
keeps an earlier step's pool), entry by entry, so a step's cost follows the
blocks it touches, not the pool's size.

Never-used blocks are the slots from `fresh` on (they are popped in id order);
`nqueue` counts the free blocks used before (front and back).  An allocation
takes the queue's head by a top-k over the used slots and the next never-used
ones, or, while no popping scenario has a used block in the queue, the
never-used ones directly.

Never-used blocks are materialised lazily: W grows (doubling) when an
allocation reaches past the slots there are, so a pool of 4M blocks costs what
the scenario touches.  A scenario without prefix caching in the same batch runs
through the same pool with no hash ids: nothing is cached, nothing hits, every
freed block goes to the front, which is the counting model of gpu/step.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .index import add, argsort, nonzero, nonzero_rc, put, take

I32, I64 = torch.int32, torch.int64
HELD = 2**62  # fkey of a block not in the free queue (held, or beyond the pool)
BACK = 2**40  # fkeys of freed hashed blocks start here; block ids stay below (gpu/limits.py)


@dataclass(frozen=True)
class Pool:
    ref: torch.Tensor  # (S, W) int32
    bhash: torch.Tensor  # (S, W) int64, -1 = no hash
    cstamp: torch.Tensor  # (S, W) int64, caching order of a hashed block
    fkey: torch.Tensor  # (S, W) int64, free-queue key, HELD when not free
    table: torch.Tensor  # (S, R, H) int32 slot of each request's i-th block, -1 = none (int32: memory, limits.py)
    ncached: torch.Tensor  # (S, R) int32
    front: torch.Tensor  # (S,) int64: every front key is >= front
    back: torch.Tensor  # (S,) int64: the next back key
    cctr: torch.Tensor  # (S,) int64: the next caching stamp
    head: torch.Tensor  # (S, NH) int64: the block a lookup of the hash finds, -1 = none
    hstamp: torch.Tensor  # (S, NH) int64: its cstamp (HELD when none)
    count: torch.Tensor  # (S, NH) int32: blocks cached under the hash
    fresh: torch.Tensor  # (S,) int64: the first never-used slot (vLLM's next never-used block id - 1)
    nqueue: torch.Tensor  # (S,) int64: free blocks used before (front and back of the queue)


def _fresh_keys(num_usable: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """fkeys of never-used slots lo..hi-1: the block id, or HELD past the pool."""
    k = torch.arange(lo, hi, dtype=I64, device=num_usable.device)[None, :]
    return torch.where(k < num_usable[:, None], k + 1, HELD)


def initial_pool(num_usable: torch.Tensor, R: int, H: int, W: int, NH: int) -> Pool:
    S = num_usable.shape[0]
    dev = num_usable.device
    return Pool(
        ref=torch.zeros((S, W), dtype=I32, device=dev),
        bhash=torch.full((S, W), -1, dtype=I64, device=dev),
        cstamp=torch.zeros((S, W), dtype=I64, device=dev),
        fkey=_fresh_keys(num_usable, 0, W),
        table=torch.full((S, R, H), -1, dtype=I32, device=dev),
        ncached=torch.zeros((S, R), dtype=I32, device=dev),
        front=torch.zeros(S, dtype=I64, device=dev),
        back=torch.full((S,), BACK, dtype=I64, device=dev),
        cctr=torch.zeros(S, dtype=I64, device=dev),
        head=torch.full((S, NH), -1, dtype=I64, device=dev),
        hstamp=torch.full((S, NH), HELD, dtype=I64, device=dev),
        count=torch.zeros((S, NH), dtype=I32, device=dev),
        fresh=torch.zeros(S, dtype=I64, device=dev),
        nqueue=torch.zeros(S, dtype=I64, device=dev),
    )


def grow_requests(pool: Pool, extra_r: int, H: int, NH: int = 0) -> Pool:
    """`extra_r` more request slots, at least H block positions per request and
    NH hash ids."""
    S, R, H0 = pool.table.shape
    table = pool.table
    if H > H0:
        table = torch.cat([table, table.new_full((S, R, H - H0), -1)], dim=2)
    if extra_r:
        table = torch.cat([table, table.new_full((S, extra_r, table.shape[2]), -1)], dim=1)
    ncached = torch.cat([pool.ncached, pool.ncached.new_zeros((S, extra_r))], dim=1)
    pool = replace(pool, table=table, ncached=ncached)
    more = NH - pool.head.shape[1]
    if more > 0:
        pool = replace(pool, head=torch.cat([pool.head, pool.head.new_full((S, more), -1)], dim=1),
                       hstamp=torch.cat([pool.hstamp, pool.hstamp.new_full((S, more), HELD)], dim=1),
                       count=torch.cat([pool.count, pool.count.new_zeros((S, more))], dim=1))
    return pool


def _ensure_slots(num_usable: torch.Tensor, pool: Pool, upto: int) -> Pool:
    """Materialise never-used blocks up to slot `upto` (capped by the pool), so
    that the never-used blocks a pop may take are there (doubling)."""
    W = pool.fkey.shape[1]
    upto = min(upto, int(num_usable.max()))
    if upto <= W:
        return pool
    extra = max(upto - W, W)
    extra = min(extra, int(num_usable.max()) - W)
    S = pool.ref.shape[0]
    return replace(
        pool,
        ref=torch.cat([pool.ref, pool.ref.new_zeros((S, extra))], dim=1),
        bhash=torch.cat([pool.bhash, pool.bhash.new_full((S, extra), -1)], dim=1),
        cstamp=torch.cat([pool.cstamp, pool.cstamp.new_zeros((S, extra))], dim=1),
        fkey=torch.cat([pool.fkey, _fresh_keys(num_usable, W, W + extra)], dim=1),
    )


def _recompute_heads(pool: Pool, rows: torch.Tensor) -> None:
    """head, hstamp and count of scenarios `rows` from their blocks (after an
    evicted head whose hash has other blocks)."""
    NH = pool.head.shape[1]
    W = pool.bhash.shape[1]
    bhash, cstamp = pool.bhash[rows], pool.cstamp[rows]
    S = bhash.shape[0]
    hb = torch.where(bhash >= 0, bhash, NH)
    first = torch.full((S, NH + 1), HELD, dtype=I64, device=hb.device).scatter_reduce(1, hb, cstamp, "amin")
    is_head = (bhash >= 0) & (cstamp == first.gather(1, hb))
    slot = torch.arange(W, dtype=I64, device=hb.device).expand(S, W)
    head = torch.full((S, NH + 1), -1, dtype=I64, device=hb.device).scatter(
        1, torch.where(is_head, hb, NH), slot)
    count = torch.zeros((S, NH + 1), dtype=I32, device=hb.device).scatter_add(
        1, hb, torch.ones_like(hb, dtype=I32))
    pool.head[rows] = head[:, :NH]
    pool.hstamp[rows] = first[:, :NH]
    pool.count[rows] = count[:, :NH]


def _evict(pool: Pool, s: torch.Tensor, b: torch.Tensor) -> None:
    """Blocks (s, b) leave the cache (P:751-772): their hash, if any, is dropped."""
    h = take(pool.bhash, s, b)
    hashed = nonzero(h >= 0)
    if hashed.numel() == 0:
        return
    s, b, h = s.index_select(0, hashed), b.index_select(0, hashed), h.index_select(0, hashed)
    put(pool.bhash, (s, b), -1)
    add(pool.count, (s, h), torch.full_like(h, -1, dtype=I32))
    was_head = nonzero(take(pool.head, s, h) == b)
    s, h = s.index_select(0, was_head), h.index_select(0, was_head)
    put(pool.head, (s, h), -1)
    put(pool.hstamp, (s, h), HELD)
    again = take(pool.count, s, h) > 0
    if bool(again.any()):  # another block of the hash is the next head
        _recompute_heads(pool, torch.unique(s[again]))


def pop(num_usable: torch.Tensor, pool: Pool, counts: torch.Tensor, slots: torch.Tensor,
        starts: torch.Tensor) -> Pool:
    """Allocation (P:681-722): request `slots[:, j]` (S, K) takes `counts[:, j]`
    new blocks from the head of the free queue, j in order, as its block-table
    positions `starts[:, j]` on.  A popped block loses its hash (eviction,
    P:751-772).  The caller has checked that the blocks are there."""
    # One entry per (scenario, j) that takes blocks, in (s, j) order, then one per
    # block: its entry, its place among the entry's blocks and among its scenario's.
    ef = nonzero(counts > 0)  # flat (s, j) of the entries
    if ef.numel() == 0:
        return pool
    dev = counts.device
    S, K = counts.shape
    es = ef // K
    n = counts.reshape(-1).index_select(0, ef).long()
    total = torch.zeros(S, dtype=I64, device=dev).index_add_(0, es, n)
    e = torch.repeat_interleave(torch.arange(es.numel(), device=dev), n)
    g = torch.arange(e.numel(), device=dev)
    within = g - (n.cumsum(0) - n).index_select(0, e)
    s = es.index_select(0, e)
    k = g - (total.cumsum(0) - total).index_select(0, s)  # the block's place in its scenario's pops
    rows = nonzero(total > 0)
    fresh = pool.fresh.index_select(0, rows)
    P = int(total.max())
    # The queue's head among the blocks used before (front, back: slots below the
    # row's `fresh`), then the never-used ones, in id order from `fresh` on.
    U = int(fresh.max())
    pool = _ensure_slots(num_usable, pool, U + P)
    evicting = bool(pool.nqueue.index_select(0, rows).any())
    if not evicting:
        # Nothing freed waits in the queue: the head is the never-used blocks,
        # which hold no hash, so none is evicted.
        b = pool.fresh.index_select(0, s) + k
        took_new = total
    else:
        Sr = rows.numel()
        total_r = total.index_select(0, rows)
        p = torch.arange(P, dtype=I64, device=dev)[None, :].expand(Sr, P)
        col = torch.arange(U, dtype=I64, device=dev)[None, :]
        used = torch.where(col < fresh[:, None], pool.fkey[rows, :U], HELD)
        new = fresh[:, None] + p
        new_key = torch.where(new < num_usable[rows][:, None], new + 1, HELD)
        pick = torch.topk(torch.cat([used, new_key], dim=1), P, dim=1, largest=False, sorted=True).indices
        blocks = torch.where(pick < U, pick, fresh[:, None] + pick - U)
        at = torch.full((S,), -1, dtype=I64, device=dev).scatter_(0, rows, torch.arange(Sr, device=dev))
        b = take(blocks, at.index_select(0, s), k)
        took_new = torch.zeros(S, dtype=I64, device=dev).index_add_(
            0, rows, ((pick >= U) & (p < total_r[:, None])).sum(1))
    f = ef.index_select(0, e)
    r = slots.reshape(-1).index_select(0, f).long()
    pos = starts.reshape(-1).index_select(0, f).long() + within
    pool = replace(pool, fresh=pool.fresh + took_new, nqueue=pool.nqueue + took_new - total)
    put(pool.table, (s, r, pos), b)
    if evicting:
        _evict(pool, s, b)
    put(pool.ref, (s, b), 1)
    put(pool.fkey, (s, b), HELD)
    return pool


def cache(block_hashes: torch.Tensor, pool: Pool, upto: torch.Tensor, key: torch.Tensor,
          ranked: bool = False) -> Pool:
    """Hash the requests' full blocks up to `upto` (S, R) blocks (T:482-546,
    P:203-273): block i of request r, from its `ncached` on, is cached under the
    request's i-th hash id unless it has it already (a hit block).  `key` (S, R)
    orders the requests' caching within a scenario, smaller first, as the step
    allocates them; the keys of a scenario's requests with blocks to cache are
    distinct.  `ranked`: the keys are already ranks, each below R (a place in
    the running order), so they are used as they are."""
    lo = pool.ncached
    hi = torch.maximum(upto.to(I32), lo)
    sr = nonzero(hi > lo)  # flat (s, r) of the requests with blocks to cache
    S, R, H = pool.table.shape
    if sr.numel() == 0:
        return pool
    n = (hi - lo).view(-1).index_select(0, sr).long()
    # Each request's caching rank within its scenario: its place by `key` among
    # the scenario's requests here.  Stamps only compare, so a rank among these
    # requests orders blocks as one among all requests would.  The requests are
    # sorted by (scenario, key) through a dense rank of the keys (a scenario's
    # keys are distinct, so the composite keys are too and an unstable sort
    # gives the order), then each one's place counts from its scenario's first.
    m = sr.numel()
    ar = torch.arange(m, device=sr.device)
    if ranked:
        rank = key.reshape(-1).index_select(0, sr).long()
    else:
        rs = sr // R
        by_key = argsort(key.reshape(-1).index_select(0, sr))
        dense = torch.empty_like(sr).scatter_(0, by_key, ar)
        grouped = argsort(rs * m + dense)
        per_row = torch.zeros(S, dtype=I64, device=sr.device).index_add_(0, rs, torch.ones_like(rs))
        row_first = per_row.cumsum(0) - per_row
        rank = torch.empty_like(sr).scatter_(0, grouped, ar - row_first.index_select(0, rs.index_select(0, grouped)))
    # one entry per block to cache: its scenario s, its position i, and its flat
    # place at = (s * R + r) * H + i in the (S, R, H) block tables and hash ids
    e = torch.repeat_interleave(ar, n)
    i = (lo.view(-1).index_select(0, sr).long().index_select(0, e) + torch.arange(e.numel(), device=sr.device)
         - (n.cumsum(0) - n).index_select(0, e))
    rank = rank.index_select(0, e)
    s = (sr // R).index_select(0, e)
    at = sr.index_select(0, e) * H + i
    blk = pool.table.view(-1).index_select(0, at).long()
    h = block_hashes.reshape(-1).index_select(0, at).long()
    # a block not hashed yet (not a hit block) whose position has a hash id
    keep = nonzero((h >= 0) & (blk >= 0) & (take(pool.bhash, s, blk.clamp(min=0)) < 0))
    if keep.numel():
        s, i, blk, h, rank = (x.index_select(0, keep) for x in (s, i, blk, h, rank))
        st = pool.cctr.index_select(0, s) + rank * H + i
        put(pool.bhash, (s, blk), h)
        put(pool.cstamp, (s, blk), st)
        NH = pool.head.shape[1]
        flat = s * NH + h
        pool.count.view(-1).index_add_(0, flat, torch.ones_like(h, dtype=I32))
        pool.hstamp.view(-1).scatter_reduce_(0, flat, st, "amin")
        first = nonzero(pool.hstamp.view(-1).index_select(0, flat) == st)
        pool.head.view(-1).scatter_(0, flat.index_select(0, first), blk.index_select(0, first))
    return replace(pool, ncached=hi, cctr=pool.cctr + (R + 1) * H)


def free(pool: Pool, mask: torch.Tensor, rank: torch.Tensor, num_blocks: torch.Tensor,
         unhashed_first: torch.Tensor) -> tuple[Pool, torch.Tensor]:
    """Free the blocks of the requests in `mask` (S, R), one free call per request
    in `rank` order (T:596-604, P:799-839): each request's blocks tail first; a
    block whose last holder leaves joins the queue, at the front without a hash,
    at the back with one (0.20.0: every freed block at the back,
    `unhashed_first` false).  Returns the pool and the blocks freed per row."""
    S, R, H = pool.table.shape
    W = pool.ref.shape[1]
    dev = mask.device
    freed_rows = torch.zeros(S, dtype=I64, device=dev)
    nb = (num_blocks * mask).to(I64)
    s, r = nonzero_rc(nb > 0)
    pool = replace(pool, ncached=torch.where(mask, 0, pool.ncached))
    if s.numel() == 0:
        return pool, freed_rows
    m = mask.sum(1).to(I64)
    order = argsort(torch.where(mask, rank.to(I64), HELD), dim=1)
    q = torch.empty_like(order).scatter_(1, order, torch.arange(R, dtype=I64, device=dev).expand(S, R))
    n = take(nb, s, r)
    e = torch.repeat_interleave(torch.arange(s.numel(), device=dev), n)
    i = torch.arange(e.numel(), device=dev) - (n.cumsum(0) - n).index_select(0, e)
    s, r = s.index_select(0, e), r.index_select(0, e)
    blk = take(pool.table, s, r, i).long()
    put(pool.table, (s, r, i), -1)
    flat = s * W + blk
    ub, inv = torch.unique(flat, return_inverse=True)
    dec = torch.zeros(ub.numel(), dtype=I32, device=dev).index_add_(0, inv, torch.ones_like(inv, dtype=I32))
    seq = take(q, s, r) * H + (H - 1 - i)  # the free order: requests in rank order, each tail first
    bseq = torch.full((ub.numel(),), -1, dtype=I64, device=dev).scatter_reduce_(0, inv, seq, "amax")
    ref = pool.ref.view(-1)
    ref.index_put_((ub,), -dec, accumulate=True)
    freed = ref.index_select(0, ub) == 0
    ub, bseq = ub[freed], bseq[freed]
    us = ub // W
    back = (pool.bhash.view(-1)[ub] >= 0) | ~unhashed_first[us]
    qb, jb = bseq // H, bseq % H
    mu = m[us]
    key = torch.where(back, pool.back[us] + bseq, pool.front[us] - mu * H + (mu - 1 - qb) * H + jb)
    pool.fkey.view(-1).scatter_(0, ub, key)
    freed_rows.index_add_(0, us, torch.ones_like(us))
    return (replace(pool, front=pool.front - m * H, back=pool.back + m * H, nqueue=pool.nqueue + freed_rows),
            freed_rows)


def lookup(pool: Pool, hashes: torch.Tensor, limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """get_computed_blocks (K:318-329): the longest run of cached blocks from the
    start of `hashes` (S, H), over at most `limit` (S,) blocks.  Returns the hit
    count (S,) and the blocks (S, H), valid below the count."""
    H = min(hashes.shape[1], max(int(limit.max()), 1) if limit.numel() else 1)
    hashes = hashes[:, :H].long()
    blocks = torch.where(hashes >= 0, pool.head.gather(1, hashes.clamp(min=0)), -1)
    i = torch.arange(H, dtype=I64, device=hashes.device)[None, :]
    present = (blocks >= 0) & (i < limit[:, None])
    hits = present.to(I32).cumprod(1).sum(1)
    return hits, blocks


def touch(pool: Pool, blocks: torch.Tensor, valid: torch.Tensor) -> Pool:
    """The hit blocks get one more holder; the free ones leave the queue (P:774-792)."""
    s, j = nonzero_rc(valid)
    b = take(blocks, s, j)
    was_free = (take(pool.fkey, s, b) < HELD).to(I64)
    add(pool.ref, (s, b), torch.ones_like(b, dtype=I32))
    put(pool.fkey, (s, b), HELD)
    return replace(pool, nqueue=pool.nqueue.index_add(0, s, -was_free))


def select_pool(pool: Pool, rows: torch.Tensor, num_slots: int) -> Pool:
    """The scenarios `rows`, keeping the first `num_slots` request slots; every
    tensor contiguous, as gpu/index.py writes need."""
    return Pool(*(t.index_select(0, rows)[:, :num_slots].contiguous() if t.dim() == 3 or name == "ncached"
                  else t.index_select(0, rows)
                  for name, t in ((f, getattr(pool, f)) for f in Pool.__dataclass_fields__)))
