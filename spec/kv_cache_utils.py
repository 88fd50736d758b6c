"""Block hashes for the prefix cache (KU = vllm/v1/core/kv_cache_utils.py): a block's
hash is a digest chained over its parent's hash and its token ids, so two blocks
match only when their whole prefixes match (docs/rules.md §6.2).  The digest is
128-bit BLAKE2b where vLLM chains sha256 or xxhash; collisions are ignored, as
vLLM ignores its own.  Only full blocks are hashed (RQ:300-303)."""

from __future__ import annotations

import hashlib
from array import array
from typing import Sequence

BlockHash = bytes


def hash_block(parent: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple = ()) -> BlockHash:
    """The hash of a full block: its parent's hash, its token ids and its extra keys (KU
    hash_block_tokens).  A fixed-size digest, so a deep prefix costs no more to compare
    than a short one."""
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(array("q", token_ids).tobytes())
    if extra_keys:
        h.update(repr(extra_keys).encode())
    return h.digest()


def mm_block_keys(mm_features: Sequence, start: int, block_size: int) -> tuple:
    """The extra keys of the block at `start`: each encoder input it overlaps, as its
    identifier and its offset from the block's start (KU:518-581), so that equal
    placeholder tokens standing for different items, or for one item placed
    elsewhere, never match."""
    end = start + block_size
    return tuple((f.identifier, f.offset - start) for f in mm_features if f.offset < end and f.offset + f.length > start)


def lora_root(lora_int_id: int) -> BlockHash | None:
    """The parent of a request's first block: none without a LoRA adapter (the hashes
    prefix caching always had), else one per adapter, so that blocks of different
    adapters never match, as vLLM's extra hash keys make them (KU
    generate_block_hash_extra_keys, the adapter's name)."""
    if lora_int_id <= 0:
        return None
    return hashlib.blake2b(f"lora:{lora_int_id}".encode(), digest_size=16).digest()


def extend_block_hashes(hashes: tuple, token_ids: Sequence[int], block_size: int, lora_int_id: int = 0,
                        lookahead: int = 0, mm_features: Sequence = ()) -> tuple:
    """`hashes` extended over every full block of `token_ids` (RQ:300-303).  With
    `lookahead` L > 0 a block's hash also covers the L tokens after it, so it exists
    only once they do (KU get_request_block_hasher, num_hash_lookahead_tokens)."""
    out = list(hashes)
    parent = out[-1] if out else lora_root(lora_int_id)
    for i in range(len(out), (len(token_ids) - lookahead) // block_size):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size + lookahead],
                            mm_block_keys(mm_features, i * block_size, block_size) if mm_features else ())
        out.append(parent)
    return tuple(out)
