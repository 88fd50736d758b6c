"""One `schedule()`'s decision, as plain frozen data (O = vllm/v1/core/sched/output.py)."""

from __future__ import annotations

from dataclasses import dataclass


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
    # Speculative decoding: (request_id, the draft ids it verifies this step) for each
    # request scheduled with drafts, in grant order; -1 ids pad a new decode (S:1577-1582).
    scheduled_spec_decode_tokens: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(n for _, n in self.num_scheduled_tokens)

    @property
    def scheduled(self) -> dict[str, int]:
        return dict(self.num_scheduled_tokens)

    @property
    def admitted(self) -> tuple[str, ...]:
        return self.scheduled_new_reqs + self.scheduled_resumed_reqs
