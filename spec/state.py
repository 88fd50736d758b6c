"""Scheduler state and one step's decision, as plain frozen data.

The mappings inside are never mutated after construction; every transition in
`scheduler.py` builds new ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .block_pool import BlockPool
from .config import SchedulerConfig
from .request import Request


@dataclass(frozen=True)
class SchedulerState:
    config: SchedulerConfig
    # Every request that has arrived and not finished, by id.
    requests: Mapping[str, Request] = field(default_factory=dict)
    # The running list in order (S:226).
    running: tuple[str, ...] = ()
    # The waiting queue in pop order: a deque for FCFS, heap order for PRIORITY (Q).
    waiting: tuple[str, ...] = ()
    # KV blocks held per request; a request holding none is absent.
    req_to_num_blocks: Mapping[str, int] = field(default_factory=dict)
    num_free_blocks: int = -1
    # With enable_prefix_caching, the pool block by block; the two fields above
    # are then its summary (block_pool.py).
    block_pool: BlockPool | None = None
    # Ids finished since the last schedule(): `has_requests()` stays true until
    # schedule() flushes them (sched/interface.py:205-208; the async engine loop).
    finished_req_ids: tuple[str, ...] = ()

    def __post_init__(self):
        if self.num_free_blocks == -1:
            object.__setattr__(self, "num_free_blocks", self.config.num_usable_blocks)
        if self.block_pool is None and self.config.enable_prefix_caching:
            object.__setattr__(self, "block_pool", BlockPool(self.config.num_gpu_blocks))

    def has_requests(self) -> bool:
        return bool(self.running or self.waiting or self.finished_req_ids)

    def num_blocks(self, request_id: str) -> int:
        return self.req_to_num_blocks.get(request_id, 0)


@dataclass(frozen=True)
class SchedulerOutput:
    """What one `schedule()` decided (O:232-325, reduced to the core scope)."""

    # (request_id, num_scheduled_tokens) in grant order: the running loop's
    # order, then admissions; grants refunded by a priority preemption are absent.
    num_scheduled_tokens: tuple[tuple[str, int], ...] = ()
    scheduled_new_reqs: tuple[str, ...] = ()
    scheduled_resumed_reqs: tuple[str, ...] = ()
    scheduled_running_reqs: tuple[str, ...] = ()
    # In preemption order.
    preempted_req_ids: tuple[str, ...] = ()
    # Prefix caching: for each admitted request, in admission order, the tokens
    # found in the cache (its num_computed_tokens as set on admission).
    prefix_hits: tuple[tuple[str, int], ...] = ()

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(n for _, n in self.num_scheduled_tokens)

    @property
    def scheduled(self) -> dict[str, int]:
        return dict(self.num_scheduled_tokens)

    @property
    def admitted(self) -> tuple[str, ...]:
        return self.scheduled_new_reqs + self.scheduled_resumed_reqs
