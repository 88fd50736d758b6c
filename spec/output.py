"""One `schedule()`'s decision, as plain frozen data (O = vllm/v1/core/sched/output.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerOutput:
    """What one `schedule()` decided (O:220-307, reduced to the core scope)."""

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
    # request scheduled with drafts, in grant order; -1 ids pad a new decode (S:1641-1646).
    scheduled_spec_decode_tokens: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # KV connector: for each admission that loads external tokens, in admission
    # order, how many (kv_connector.py); its num_computed_tokens counts them too.
    kv_connector_hits: tuple[tuple[str, int], ...] = ()
    # Encoder inputs: (request_id, the input ids it encodes) in grant order (O `scheduled_encoder_inputs`),
    # and the encoder cache entries evicted this step (O `free_encoder_mm_hashes`, E:341-355).
    scheduled_encoder_inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()
    free_encoder_mm_hashes: tuple[str, ...] = ()

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(n for _, n in self.num_scheduled_tokens)

    @property
    def scheduled(self) -> dict[str, int]:
        return dict(self.num_scheduled_tokens)

    @property
    def admitted(self) -> tuple[str, ...]:
        return self.scheduled_new_reqs + self.scheduled_resumed_reqs

    def computed_on_admission(self, rid: str, num_computed_tokens: int) -> int:
        """`rid`'s num_computed_tokens once this step admitted it: its prefix hit
        (else `num_computed_tokens`, what it had) and the tokens a KV connector loaded."""
        return dict(self.prefix_hits).get(rid, num_computed_tokens) + dict(self.kv_connector_hits).get(rid, 0)
