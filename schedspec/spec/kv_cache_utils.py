"""Block hashes for the prefix cache (KU = vllm/v1/core/kv_cache_utils.py): a block's
hash is a digest chained over its parent's hash and its token ids, so two blocks
match only when their whole prefixes match (docs/rules.md §6.2).  The digest is
128-bit BLAKE2b where vLLM chains sha256 or xxhash; collisions are ignored, as
vLLM ignores its own.  Only full blocks are hashed (RQ:285-288)."""

from __future__ import annotations

import hashlib
from array import array
from typing import Sequence

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
