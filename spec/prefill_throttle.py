"""Prefill throttling, modelled from vLLM 0.33.0 (S = vllm/v1/core/sched/scheduler.py): steps that
carry no prefill at all, so that decodes run in longer uninterrupted stretches.

Two gates set one per-step flag, `defer_prefills`:
- the data-parallel gate: the engine core passes `schedule(throttle_prefills=True)`
  on the steps off its cadence (S:766-768);
- the local gate: `prefill_schedule_interval` > 1 on an engine without data
  parallelism holds prefill until that many executed steps have passed since the
  last step that carried one (S:796-807).
Either acts only when some running request decodes (a step with nothing else to
run is never held) and not while the last step that ran the waiting loop left
requests it could have admitted behind (`capacity_bound`, the escape of #44558).

A deferring step skips every running prefill chunk (S:838) and stops admission at
the first request with more than one token left to compute (S:1340).

The cadence's state is `PrefillCadence`.  vLLM counts executed steps whatever the
interval; they are read only under a local interval (S:803), and the spec counts
them only there, as it stamps `last_prefill_step` (S:1701).

Modelled from vLLM 0.33.0 on (versions.FEATURES_SINCE): for an older release the spec never defers and
keeps the cadence at its initial value (0.30.0 has the data-parallel gate, but
skipped requests wait in a queue of their own and there is no local interval;
spec/config.py refuses an interval there, and the monitor counts a throttled call
of an older release outside its scope).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from .request import Request, RequestStatus
from .versions import PREFILL_THROTTLE, models


@dataclass(frozen=True, eq=False)
class PrefillCadence:
    # Steps that scheduled tokens (S:424, 1693-1697), under a local interval.
    num_executed_steps: int = 0
    # The executed step that last carried prefill (S:1701-1702); None: none yet,
    # vLLM's -interval (S:420), so the first step is never held.
    last_prefill_step: int | None = None
    # Whether the last step that ran the waiting loop undeferred left a waiting
    # request it had not skipped (S:394, 1687-1689).
    capacity_bound: bool = False
    # Waiting requests skipped by the waiting loop, or enqueued waiting for their
    # grammar, since they arrived or were last admitted (S:241, 1078, 1610, 2778, 3149).
    # vLLM's is a set: each id once, in no meaningful order (equality ignores it).  A
    # tuple, not a frozenset: CrossHair cannot search states holding a set of symbolic
    # ids within its time (tests/test_crosshair.py).
    deferred_waiting: tuple[str, ...] = ()

    def key(self) -> tuple:
        return self.num_executed_steps, self.last_prefill_step, self.capacity_bound, frozenset(self.deferred_waiting)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrefillCadence) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())


def defers_prefills(w: Any, throttle_prefills: bool) -> bool:
    """The step's `defer_prefills` (S:766-768, 796-807), from `w`, the step's working
    state (scheduler.py `ScheduleWork`) before its running loop."""
    return gate(w.cadence, w.config, w.requests, w.running, throttle_prefills)


def holds_prefill(state: Any, throttle_prefills: bool = False) -> bool:
    """Whether `schedule(throttle_prefills)` on `state` (a SchedulerState) defers prefill."""
    return gate(state.prefill_cadence, state.config, state.requests, state.running, throttle_prefills)


def gate(cadence: PrefillCadence, config: Any, requests: Mapping[str, Request], running: Iterable[str],
         throttle_prefills: bool) -> bool:
    interval = config.prefill_schedule_interval
    if not modelled(config) or cadence.capacity_bound or all(requests[x].is_prefill_chunk for x in running):
        return False  # nothing decodes (a step is never held empty), or the escape of #44558
    if throttle_prefills:
        return True
    last = cadence.last_prefill_step
    # This call becomes executed step num_executed_steps + 1 if it schedules anything (S:800-804).
    return interval > 1 and last is not None and cadence.num_executed_steps + 1 - last < interval


def has_prefill_left(num_computed_tokens: int, num_tokens: int) -> bool:
    """More than the last token left to compute: what a deferring step holds back at
    admission (S:1340), and what an admission stamps as prefill (S:1654).  A request
    with only its last token left (a full prefix hit) is a decode here."""
    return num_computed_tokens < num_tokens - 1


# vLLM's blocked waiting statuses (S:2756-2761) in this scope: a grammar compiling, a KV load.
BLOCKED = (RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, RequestStatus.WAITING_FOR_REMOTE_KVS)


def modelled(config: Any) -> bool:
    return models(config, PREFILL_THROTTLE)


def enqueued(state: Any, request: Request) -> PrefillCadence:
    """The cadence of `state` once `request` joins waiting: one enqueued blocked counts
    as skipped (S:2776-2778)."""
    cadence = state.prefill_cadence
    if request.status not in BLOCKED or not modelled(state.config):
        return cadence
    # A new request: its id is in no queue yet, so not among the deferred.
    return replace(cadence, deferred_waiting=cadence.deferred_waiting + (request.request_id,))


def forget(cadence: PrefillCadence, request_ids: Iterable[str]) -> PrefillCadence:
    """These requests finished (S:2615, 3149)."""
    gone = set(cadence.deferred_waiting).intersection(request_ids)
    if not gone:
        return cadence
    return replace(cadence, deferred_waiting=tuple(x for x in cadence.deferred_waiting if x not in gone))


def after_waiting_loop(w: Any, skipped: Iterable[str]) -> PrefillCadence:
    """The waiting loop's requests: admitted ones are no longer deferred (S:1610), skipped
    ones are (S:1078); a step that did not defer records whether it was capacity-bound,
    with more waiting requests than deferred ones (S:1685-1689)."""
    c = w.cadence
    if not modelled(w.config):
        return c
    deferred = set(c.deferred_waiting).difference(w.new, w.resumed).union(skipped)
    bound = c.capacity_bound if w.defer_prefills else len(w.waiting) > len(deferred)
    return replace(c, deferred_waiting=tuple(sorted(deferred)), capacity_bound=bound)


def after_step(w: Any) -> PrefillCadence:
    """Count the step if it scheduled tokens, then stamp it if it carried prefill: a
    running prefill chunk, or an admission with prefill left, read before
    `_update_after_schedule` advances it (S:1650-1654, 1693-1702); under a local
    interval only (see the module's docstring)."""
    c = w.cadence
    if not modelled(w.config) or w.config.prefill_schedule_interval <= 1:
        return c
    n = c.num_executed_steps + (sum(w.scheduled.values()) > 0)
    admitted = (w.requests[x] for x in w.new + w.resumed)
    carried = w.prefill_scheduled or any(has_prefill_left(r.num_computed_tokens, r.num_tokens) for r in admitted)
    return replace(c, num_executed_steps=n, last_prefill_step=n if carried else c.last_prefill_step)
