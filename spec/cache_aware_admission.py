"""Cache-aware admission (vLLM 0.34.0, `cache_aware_admission_window`): before the
waiting loop, the first N plain waiting requests are reordered so that those whose
prompt prefix is already cached go first, deepest hit first (S:2790-2839;
docs/rules.md §4.7).

Only FCFS with prefix caching reorders (S:428-435), only while the KV cache is at
least `cache_aware_admission_threshold` used (S:2802-2803), never in a step that holds
prefill (S:1067-1068), and only among the window's requests that are merely waiting:
a preempted, blocked or partly computed request keeps its slot, and nothing moves
past it (S:2805-2811).  The probe takes no reference and evicts nothing
(K:255-275): it is a read of the pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import FCFS
from .kv_connector import num_holding
from .request import WAITING
from .spec_decode import eagle_block_drop

if TYPE_CHECKING:  # the working state of scheduler.py, which imports this module
    from .scheduler import ScheduleWork


def enabled(c) -> bool:
    """The feature is on for config `c`: a window, FCFS and prefix caching (S:428-435)."""
    return bool(c.cache_aware_admission_window) and c.policy == FCFS and c.enable_prefix_caching


def movable(r) -> bool:
    """A request the reorder may move: merely waiting, nothing computed (S:2805-2811)."""
    return r.status == WAITING and not r.num_computed_tokens


def applies(s: "ScheduleWork") -> bool:
    """Guards: the feature is on for this config and this step (S:428-435, 1067-1068),
    and the cache is used enough (S:2802-2803)."""
    if not enabled(s.config) or s.defer_prefills:
        return False
    return kv_usage(s) >= s.config.cache_aware_admission_threshold


def kv_usage(s: "ScheduleWork") -> float:
    """The pool's used share, the null block left out (P:912-923), as vLLM computes it."""
    total = s.config.num_gpu_blocks - 1
    return 1.0 - (s.kv.num_free_blocks / total) if total else 0


def num_cached_tokens(s: "ScheduleWork", rid: str) -> int:
    """`get_num_cached_tokens` (K:255-275): the prefix hit an admission would find now."""
    r = s.requests[rid]
    if r.skip_reading_prefix_cache:
        return 0
    c = s.config
    return len(eagle_block_drop(c, s.kv.get_computed_blocks(r.block_hashes, r.num_tokens, c.block_size))) * c.block_size


def reorder_waiting(s: "ScheduleWork") -> None:
    """`_reorder_waiting_by_cached_prefix` (S:2790-2839) on the plain waiting requests
    (those behind the KV holders, vLLM's `self.waiting`)."""
    if not applies(s):
        return
    start = num_holding(s.waiting, s.requests)
    if len(s.waiting) - start < 2:
        return
    head = [s.waiting[start + i] for i in range(min(s.config.cache_aware_admission_window, len(s.waiting) - start))]
    slots = [i for i, rid in enumerate(head) if movable(s.requests[rid])]
    if len(slots) < 2:
        return
    cached = {i: num_cached_tokens(s, head[i]) for i in slots}
    order = sorted(slots, key=lambda i: (-cached[i], i))  # deepest first, then queue order (S:2815-2817)
    for slot, source in zip(slots, order):
        s.waiting[start + slot] = head[source]
