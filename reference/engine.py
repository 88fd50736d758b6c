"""The engine loop of formats.md: aborts, arrivals, schedule, fake model, update.

`run_scenario` drives any implementation (reference/impl.py) through a scenario
and returns its trace (a `schedspec.trace/1` dict).  The fake model lives here:
a request scheduled in a step samples exactly one token when, after the step's
advance, its num_computed_tokens reaches num_tokens; the token is EOS when it is
the request's `output_len`-th output token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..spec.config import ConfigError
from ..spec.request import EOS_TOKEN_ID, FINISH_REASON, RequestStatus, make_request
from ..spec.state import SchedulerOutput, SchedulerState
from .impl import SchedulerImpl
from .scenario import Scenario

TRACE_FORMAT = "schedspec.trace/1"
NON_EOS_TOKEN_ID = 100


@dataclass(frozen=True)
class Transition:
    """One engine step as the property checker sees it."""

    step: int
    before: SchedulerState  # after aborts and arrivals, before schedule()
    output: SchedulerOutput
    after: SchedulerState  # after update_from_output
    record: dict[str, Any]  # the trace step


def error_trace(scenario: Scenario, impl_name: str, message: str) -> dict[str, Any]:
    return {"format": TRACE_FORMAT, "scenario": scenario.name, "implementation": impl_name,
            "error": message, "steps": []}


def fake_model(scenario: Scenario, output: SchedulerOutput, state: SchedulerState) -> dict[str, list[int]]:
    """Sampled token ids for the step just scheduled (`state` is after the advance)."""
    output_len = {r.id: r.output_len for r in scenario.requests}
    sampled: dict[str, list[int]] = {}
    for rid, _ in output.num_scheduled_tokens:
        r = state.requests[rid]
        if r.num_computed_tokens >= r.num_tokens:  # the prefill is complete
            nth = r.num_output_tokens + 1
            sampled[rid] = [EOS_TOKEN_ID if output_len[rid] == nth else NON_EOS_TOKEN_ID]
    return sampled


def run_scenario(
    scenario: Scenario,
    impl: SchedulerImpl,
    *,
    on_step: Callable[[Transition], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run `scenario` on `impl`; a rejected config or request gives an error trace."""
    name = getattr(impl, "name", type(impl).__name__)
    try:
        config = scenario.scheduler_config()
    except ConfigError as e:
        # The spec's structural checks on field types come first; an implementation
        # still decides what it accepts among well-typed configs below.
        return error_trace(scenario, name, str(e))
    try:
        impl.reset(config)
    except (ConfigError, ValueError) as e:
        return error_trace(scenario, name, str(e))
    requests = {}
    for i, r in enumerate(scenario.requests):
        try:
            requests[r.id] = make_request(config, r.id, r.prompt_len, r.max_tokens, r.priority, r.arrival_time)
        except ConfigError as e:
            return error_trace(scenario, name, f"requests[{i}].{e}")

    arrivals: dict[int, list[str]] = {}
    for r in scenario.requests:
        arrivals.setdefault(r.arrival_step, []).append(r.id)
    aborts: dict[int, list[str]] = {}
    for a in scenario.aborts:
        aborts.setdefault(a.step, []).append(a.id)

    summary = {r.id: {"first_token_step": None, "finish_step": None, "finish_reason": None,
                      "num_output_tokens": 0, "num_preemptions": 0} for r in scenario.requests}
    order = [r.id for r in scenario.requests]
    pending = set(order)  # not finished yet
    steps: list[dict[str, Any]] = []
    step = 0
    while step < scenario.max_steps and pending:
        finished: list[list[str]] = []
        for rid in aborts.get(step, ()):
            for done in impl.finish_requests([rid], RequestStatus.FINISHED_ABORTED):
                finished.append([done, "aborted"])
        for rid in arrivals.get(step, ()):
            impl.add_request(requests[rid])
        before = impl.observe()
        output = impl.schedule()
        mid = impl.observe()
        sampled = fake_model(scenario, output, mid)
        stopped = impl.update_from_output(output, sampled)
        after = impl.observe()
        finished += [[rid, FINISH_REASON[status]] for rid, status in stopped]

        for rid in sampled:
            s = summary[rid]
            s["num_output_tokens"] += 1
            if s["first_token_step"] is None:
                s["first_token_step"] = step
        for rid in output.preempted_req_ids:
            summary[rid]["num_preemptions"] += 1
        for rid, reason in finished:
            summary[rid]["finish_step"] = step
            summary[rid]["finish_reason"] = reason
            pending.discard(rid)

        record = {
            "step": step,
            "scheduled": [[rid, n] for rid, n in output.num_scheduled_tokens],
            "new": list(output.scheduled_new_reqs),
            "resumed": list(output.scheduled_resumed_reqs),
            "preempted": list(output.preempted_req_ids),
            "finished": finished,
            "running": list(after.running),
            "waiting": list(after.waiting),
            "num_computed_tokens": {rid: after.requests[rid].num_computed_tokens
                                    for rid in order if rid in after.requests},
            "num_free_blocks": after.num_free_blocks,
            "sampled": [rid for rid, _ in output.num_scheduled_tokens if rid in sampled],
            "slots_held": len(mid.running),
        }
        steps.append(record)
        if on_step is not None:
            on_step(Transition(step, before, output, after, record))
        step += 1
        if progress is not None:
            progress(step, scenario.max_steps)

    return {
        "format": TRACE_FORMAT,
        "scenario": scenario.name,
        "implementation": name,
        "steps": steps,
        "summary": {
            "steps": len(steps),
            "finished": len(order) - len(pending),
            "unfinished": [rid for rid in order if rid in pending],
            "requests": summary,
        },
    }
