"""LoRA, as the scheduler sees it: the running requests use at most `max_loras`
distinct adapters, so an admission that would bring one more is skipped and keeps
its place (S = vllm/v1/core/sched/scheduler.py; modelled from 0.33.0: S:1054-1063, S:1128-1140,
S:1627-1629).  An adapter is its `lora_int_id`; 0 is none.  With prefix caching
vLLM hashes a block with its adapter's name (kv_cache_utils.py
`generate_block_hash_extra_keys`): blocks of different adapters never match, which
kv_cache_utils.lora_root gives the spec's chained hashes."""

from __future__ import annotations

from typing import Iterable

from .config import SchedulerConfig
from .request import Request


def running_loras(requests: Iterable[Request]) -> set[int]:
    """The adapters of the running requests, scheduled this step or not (S:1054-1063)."""
    return {r.lora_int_id for r in requests if r.lora_int_id > 0}


def exceeds_max_loras(c: SchedulerConfig, loras: set[int], r: Request) -> bool:
    """Admitting `r` would make max_loras + 1 adapters in the batch (S:1128-1140)."""
    return (c.max_loras is not None and r.lora_int_id > 0 and len(loras) == c.max_loras
            and r.lora_int_id not in loras)
