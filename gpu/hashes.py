"""Block hash ids for the torch prefix cache, computed once on the host.

vLLM hashes a full block over its parent's hash and its token ids, so two
requests' i-th blocks have the same hash exactly when their first (i + 1) *
block_size tokens are equal (docs/rules.md §6.2).  Here a hash is an integer
interned per scenario: equal token prefixes, equal ids.  A request's tokens are
its prompt, then its outputs, which are all the same non-EOS id until EOS ends
the request (formats.md: the k-th output depends on k only), so every block a
request can ever cache has a known id before the run: `ids[r, i]` for block i.

Scenarios whose prompts come from prefix groups (formats.md "Additions") get
their ids from the group pattern arithmetically: request r's first
floor(P_r / bs) blocks are its group's (P_r its shared length); after that its
blocks are its own, except when its whole prompt is the shared part, where they
are shared with the group's other requests of that same prompt.  Explicit
`prompt_token_ids` are interned token by token.
"""

from __future__ import annotations

from typing import Sequence

import hashlib
from array import array

import numpy as np

from schedspec.reference.prompts import NON_EOS_TOKEN_ID, prompt_token_ids

OUTPUT_TOKEN_ID = NON_EOS_TOKEN_ID  # the fake model's non-EOS token (formats.md)


def _explicit(scenario) -> bool:
    return any(getattr(r, "prompt_token_ids", None) is not None for r in scenario.requests)


def hash_ids(scenario, block_size: int, num_blocks: Sequence[int]) -> tuple[np.ndarray, int]:
    """(R, H) int64 hash ids of the first `num_blocks[r]` blocks of each request
    (-1 after), H = max(num_blocks), and how many distinct ids there are."""
    if _explicit(scenario):
        R, H = len(scenario.requests), max(list(num_blocks) + [1])
        return _interned(scenario, block_size, num_blocks, np.full((R, H), -1, dtype=np.int64))
    if is_private(scenario):
        return private_hash_ids(num_blocks)
    return grouped_hash_ids(scenario, block_size, num_blocks)


def is_private(scenario) -> bool:
    """Whether no two requests of the scenario can share a block: no prefix
    groups, no explicit token ids (then no two share a first token, formats.md)."""
    return not _explicit(scenario) and all(getattr(r, "prefix_group", None) is None for r in scenario.requests)


def private_hash_ids(num_blocks: Sequence[int]) -> tuple[np.ndarray, int]:
    """`hash_ids` of a scenario without prefix groups or explicit token ids:
    every block id is the request's own, request after request (as
    `grouped_hash_ids` numbers them)."""
    ids, count = private_hash_rows(np.asarray([list(num_blocks)], dtype=np.int64).reshape(1, -1))
    return ids[0], int(count[0])


def private_hash_rows(num_blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`private_hash_ids` of many scenarios at once (a batch's, in one pass
    instead of a few numpy calls per scenario): num_blocks (S, R), 0 for a
    padding slot -> ids (S, R, H) and each scenario's number of ids (S,)."""
    n = np.maximum(num_blocks, 0)
    H = max(int(n.max()) if n.size else 0, 1)
    col = np.arange(H, dtype=np.int64)
    base = np.cumsum(n, axis=1) - n
    return np.where(col < n[..., None], base[..., None] + col, -1), n.sum(1)


def grouped_hash_ids(scenario, block_size: int, num_blocks: Sequence[int]) -> tuple[np.ndarray, int]:
    """`hash_ids` of a scenario without explicit token ids, by its prefix groups."""
    R = len(scenario.requests)
    H = max(list(num_blocks) + [1])
    out = np.full((R, H), -1, dtype=np.int64)
    bs = block_size
    next_id = 0
    group_base: dict[str, int] = {}
    group_len: dict[str, int] = {}
    for r in scenario.requests:  # a group's shared blocks: as many as its longest shared part
        g = getattr(r, "prefix_group", None)
        if g is not None:
            group_len[g] = max(group_len.get(g, 0), min(getattr(r, "prefix_len", 0) or 0, r.prompt_len) // bs)
    for g, n in group_len.items():
        group_base[g] = next_id
        next_id += n
    whole: dict[tuple[str, int], int] = {}
    for j, r in enumerate(scenario.requests):
        n = num_blocks[j]
        if n <= 0:
            continue
        g = getattr(r, "prefix_group", None)
        P = min(getattr(r, "prefix_len", 0) or 0, r.prompt_len) if g is not None else 0
        shared = min(P // bs, n)
        if shared:
            out[j, :shared] = np.arange(group_base[g], group_base[g] + shared)
        rest = n - shared
        if rest <= 0:
            continue
        if g is not None and P == r.prompt_len:  # the whole prompt is the group's
            key = (g, P)
            base = whole.get(key)
            if base is None:
                base = whole[key] = next_id
                next_id += H
            out[j, shared:n] = np.arange(base, base + rest)
        else:
            out[j, shared:n] = np.arange(next_id, next_id + rest)
            next_id += rest
    return out, next_id


def chain_ids(table: dict, prompt: Sequence[int], bs: int, n: int, start: int = 0, parent: int = -1) -> list[int]:
    """The ids of blocks start..n-1 of a request with `prompt`, interned in
    `table` ((parent id, block tokens) -> id); `parent`: block start-1's id."""
    ids = []
    prompt = tuple(prompt)
    for i in range(start, n):
        block = prompt[i * bs:(i + 1) * bs]
        if len(block) < bs:
            block = block + (OUTPUT_TOKEN_ID,) * (bs - len(block))
        parent = table.setdefault((parent, block), len(table))
        ids.append(parent)
    return ids


def _interned(scenario, bs: int, num_blocks: Sequence[int], out: np.ndarray) -> tuple[np.ndarray, int]:
    table: dict[tuple, int] = {}
    tokens = prompt_token_ids(scenario)
    for j, r in enumerate(scenario.requests):
        ids = chain_ids(table, tokens[r.id], bs, num_blocks[j])
        out[j, :len(ids)] = ids
    return out, len(table)


def block_hash_bytes(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    """formats.md's block hash: BLAKE2b, 16-byte digest, over the parent's hash
    bytes and the block's token ids as signed 64-bit little-endian integers (for
    states read back from torch: `TorchScheduler.observe`)."""
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(array("q", tokens).tobytes())  # the machine's byte order: little-endian here
    return h.digest()
