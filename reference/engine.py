"""The engine loop of formats.md: aborts, arrivals, schedule, fake model, update.

`run_scenario` drives any implementation (reference/impl.py) through a scenario
and returns its trace (a `schedspec.trace/1` dict).  The fake model lives here:
a request scheduled in a step samples when, after the step's advance, its
num_computed_tokens reaches num_tokens: one token, plus one per draft it verified
and accepted (speculative decoding); a token is EOS when it is the request's
`output_len`-th output token.  With speculative decoding the fake drafter proposes
each request's drafts after a step (synchronous engine), from the scenario's
per-request patterns (formats.md, "Speculative decoding").
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

from schedspec.spec.config import ConfigError
from schedspec.spec.request import EOS_TOKEN_ID, Request, RequestStatus
from schedspec.spec.input_processor import make_request
from schedspec.spec.scheduler import append_output_tokens
from schedspec.spec.state import SchedulerOutput, SchedulerState
from .impl import DraftTaking, GrammarTaking, SchedulerImpl, takes_finished_recving, takes_finished_sending
from .prompts import NON_EOS_TOKEN_ID, prompt_token_ids
from .scenario import Scenario


# The finish reasons a trace reports (formats.md).
FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: "stopped",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "aborted",
    RequestStatus.FINISHED_ERROR: "error",
}

if TYPE_CHECKING:
    from .trace_io import TraceSink

TRACE_FORMAT = "schedspec.trace/1"


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


def next_token(output_len: int | None, r: Request, k: int = 1) -> int:
    """The request's `k`-th next output token: EOS when it is the `output_len`-th,
    counted over the outputs already applied; otherwise one non-EOS id for every
    request and position, so equal prompts produce equal outputs (formats.md)."""
    return EOS_TOKEN_ID if output_len == r.num_output_tokens + k else NON_EOS_TOKEN_ID


def cycled(pattern: Sequence[int], i: int) -> int:
    return pattern[i % len(pattern)]


@dataclass
class FakeModel:
    """The fake model and drafter of formats.md for one run.  Speculative decoding:
    the i-th time a request verifies drafts it accepts `num_accepted_tokens[i]` of
    them (cycled, at most those scheduled; -1 padding of an admission never); the
    i-th time the drafter proposes for it, `num_draft_tokens[i]` drafts (cycled).
    Under async scheduling the worker proposes into -1 placeholders, so a
    verification accepts at most the i-th draft count too."""

    output_len: Mapping[str, int | None]
    num_speculative_tokens: int = 0
    num_draft_tokens: Mapping[str, Sequence[int]] = field(default_factory=dict)
    num_accepted_tokens: Mapping[str, Sequence[int]] = field(default_factory=dict)
    verified: dict[str, int] = field(default_factory=dict)
    proposed: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, scenario: "Scenario | Mapping[str, int | None] | FakeModel", num_speculative_tokens: int = 0
           ) -> "FakeModel":
        if isinstance(scenario, FakeModel):
            return scenario
        if isinstance(scenario, Mapping):
            return cls(scenario)
        k = num_speculative_tokens
        return cls({r.id: r.output_len for r in scenario.requests}, k,
                   {r.id: r.num_draft_tokens or (k,) for r in scenario.requests},
                   {r.id: r.num_accepted_tokens or (k,) for r in scenario.requests})

    def sample(self, rid: str, r: Request, num_drafts: int = 0, padding: bool = False,
               async_drafts: bool = False) -> list[int]:
        """The tokens `rid` samples: one, plus one per accepted draft."""
        accepted = 0
        if num_drafts and not padding:
            i = self.verified.get(rid, 0)
            self.verified[rid] = i + 1
            accepted = min(cycled(self.num_accepted_tokens.get(rid, (0,)), i), num_drafts)
            if async_drafts:
                accepted = min(accepted, cycled(self.num_draft_tokens.get(rid, (0,)), i))
        return [next_token(self.output_len[rid], r, k) for k in range(1, accepted + 2)]

    def propose(self, rids: Sequence[str], state: SchedulerState) -> dict[str, list[int]]:
        """The drafter after a synchronous step, for the batch's requests still
        there: drafts for those that sampled, none for a prefill chunk."""
        drafts: dict[str, list[int]] = {}
        for rid in rids:
            r = state.requests.get(rid)
            if r is None:
                continue
            if r.is_prefill_chunk:
                drafts[rid] = []
                continue
            i = self.proposed.get(rid, 0)
            self.proposed[rid] = i + 1
            drafts[rid] = [NON_EOS_TOKEN_ID] * min(cycled(self.num_draft_tokens.get(rid, (0,)), i),
                                                   self.num_speculative_tokens)
        return drafts


def batch_drafts(output: SchedulerOutput) -> tuple[dict[str, int], frozenset[str]]:
    """Each request's number of drafts in a batch, and the admissions among them,
    whose drafts are -1 padding (S:1641-1646)."""
    return ({rid: len(ids) for rid, ids in output.scheduled_spec_decode_tokens},
            frozenset(output.scheduled_new_reqs + output.scheduled_resumed_reqs))


def fake_model(scenario: "Scenario | Mapping[str, int | None] | FakeModel", output: SchedulerOutput,
               state: SchedulerState) -> dict[str, list[int]]:
    """Sampled token ids for the step just scheduled (`state` is after the advance)."""
    model = FakeModel.of(scenario, state.config.num_speculative_tokens)
    drafts, admitted = batch_drafts(output)
    sampled: dict[str, list[int]] = {}
    for rid, _ in output.num_scheduled_tokens:
        r = state.requests[rid]
        if r.num_computed_tokens >= r.num_tokens:  # the prefill is complete
            sampled[rid] = model.sample(rid, r, drafts.get(rid, 0), rid in admitted)
    return sampled


def num_kept(state: SchedulerState, sampled: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """How many of each request's sampled tokens it keeps: those up to a stop (U:98-140)."""
    kept = {}
    for rid, tokens in sampled.items():
        r = state.requests[rid]
        kept[rid] = len(tokens) - append_output_tokens(r.copy(), tokens, state.config)[1]
    return kept


class KVLoads:
    """Asynchronous KV loads in flight (formats.md, kv_connector_load_steps): a load
    seen started after a schedule() is reported finished to the update_from_output
    of the engine step `kv_connector_load_steps` - 1 steps later (1: the same step),
    or to the first one after it, as the worker's finished_recving (S:2648, 3716-3721)."""

    def __init__(self, load_steps: Mapping[str, int]):
        self.load_steps = load_steps
        self.started: dict[str, int] = {}

    def seen(self, step: int, state: SchedulerState) -> None:
        for rid in self.load_steps:
            r = state.requests.get(rid)
            if r is not None and r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and not r.kv_load_finished:
                self.started.setdefault(rid, step)

    def due(self, step: int) -> list[str]:
        done = [rid for rid, start in self.started.items() if step - start + 1 >= self.load_steps[rid]]
        for rid in done:
            del self.started[rid]
        return done


class KVSends:
    """KV sends in flight (formats.md, kv_connector_send_steps): a request whose KV the
    connector sends, finished in engine step t, holds its blocks until the worker
    reports the send to the update_from_output of step t + kv_connector_send_steps, or
    to the first one after it, as finished_sending (S:2648, 3730-3733).  Not one
    finished mid-load: the load's report frees it (S:3722-3727), and vLLM asserts
    that a report names a request it holds (S:3716, 3731)."""

    def __init__(self, send_steps: Mapping[str, int]):
        self.send_steps = send_steps
        self.finished_at: dict[str, int] = {}

    def finished(self, step: int, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            if rid in self.send_steps:
                self.finished_at.setdefault(rid, step)

    def due(self, step: int, state: SchedulerState, loading: Collection[str] = ()) -> list[str]:
        """The sends reported at `step`, given the state before the update and the
        requests whose load is in flight or reported with it."""
        done = [rid for rid, at in self.finished_at.items() if step - at >= self.send_steps[rid]]
        for rid in done:
            del self.finished_at[rid]
        return [rid for rid in done if rid in state.requests and state.requests[rid].status.is_finished
                and rid not in loading]


def _update(impl: SchedulerImpl, output: SchedulerOutput, sampled: Mapping[str, list[int]],
            loads: KVLoads | None, step: int, sends: KVSends | None = None, state: SchedulerState | None = None):
    reports = {}
    if loads is not None and (finished_recving := loads.due(step)):
        reports["finished_recving"] = finished_recving
    loading = set(reports.get("finished_recving", ())) | set(loads.started if loads is not None else ())
    if sends is not None and (finished_sending := sends.due(step, state, loading)):
        reports["finished_sending"] = finished_sending
    return impl.update_from_output(output, sampled, **reports)


def _sync_step(impl: SchedulerImpl, model: FakeModel, step: int, loads: KVLoads | None, sends: KVSends | None):
    """formats.md steps 3-5: schedule, the fake model, update_from_output, and with
    speculative decoding the drafter (EngineCore.step, v1/engine/core.py:690-707)."""
    before = impl.observe()
    output = impl.schedule()
    mid = impl.observe()
    if loads is not None:
        loads.seen(step, mid)
    sampled = fake_model(model, output, mid)
    stopped = _update(impl, output, sampled, loads, step, sends, mid)
    if mid.config.num_speculative_tokens:
        impl.update_draft_token_ids(model.propose([rid for rid, _ in output.num_scheduled_tokens], impl.observe()))
    return before, output, mid, impl.observe(), sampled, stopped


def _async_step(impl: SchedulerImpl, step: int, model: FakeModel, in_flight: deque, loads: KVLoads | None,
                sends: KVSends | None):
    """formats.md's async engine step, as vLLM's EngineCore.step_with_batch_queue
    runs it with two batches in flight (v1/engine/core.py:708-822)."""
    before = impl.observe()
    called = before.has_requests()
    output, mid = SchedulerOutput(), before
    if called:
        output = impl.schedule()
        mid = impl.observe()
        if loads is not None:
            loads.seen(step, mid)
        # Which requests of this batch will sample is fixed now (is_prefill_chunk).
        sampling = [rid for rid, _ in output.num_scheduled_tokens if not mid.requests[rid].is_prefill_chunk]
        in_flight.append((step, output, sampling))
        if len(in_flight) < 2 and (output.total_num_scheduled_tokens > 0 or mid.has_requests()):
            return before, output, mid, mid, {}, (), True, None
    elif not in_flight:
        return before, output, mid, mid, {}, (), False, None
    applied, batch, sampling = in_flight.popleft()
    drafts, admitted = batch_drafts(batch)
    sampled: dict[str, list[int]] = {}
    for rid in sampling:
        r = mid.requests.get(rid)
        if r is not None:  # finished or aborted meanwhile: vLLM drops its output (S:2373-2381)
            sampled[rid] = model.sample(rid, r, drafts.get(rid, 0), rid in admitted, async_drafts=True)
    stopped = _update(impl, batch, sampled, loads, step, sends, mid)
    return before, output, mid, impl.observe(), sampled, stopped, called, applied


@dataclass(frozen=True)
class EngineStep:
    """What one engine step did: the states around `schedule()` and after the
    output applied, the tokens sampled and the requests the output stopped."""

    before: SchedulerState
    output: SchedulerOutput
    mid: SchedulerState
    after: SchedulerState
    sampled: Mapping[str, list[int]]
    stopped: Sequence[tuple[str, RequestStatus]]
    called: bool  # whether schedule() was called (async: not while nothing is held)
    applied: int | None  # the step whose batch update_from_output applied


def engine_step(impl: SchedulerImpl, step: int, model: "FakeModel | Mapping[str, int | None]",
                in_flight: deque | None, loads: KVLoads | None = None, sends: KVSends | None = None) -> EngineStep:
    """One engine step of formats.md on `impl`: synchronous when `in_flight` is None,
    else with two batches in flight; `loads` and `sends`, the KV loads and sends in flight.
    The engine loop and the hypothesis state machine (tests/machine.py) both step
    through here."""
    model = FakeModel.of(model)
    if in_flight is None:
        return EngineStep(*_sync_step(impl, model, step, loads, sends), True, step)
    return EngineStep(*_async_step(impl, step, model, in_flight, loads, sends))


def step_record(step: int, output: SchedulerOutput, mid: SchedulerState, after: SchedulerState,
                finished: list[list[str]], sampled: Mapping[str, Any],
                position: Mapping[str, int]) -> dict[str, Any]:
    """The trace step of formats.md for one engine step (`mid`: after schedule(),
    `after`: after update_from_output; `position`: each id's index in the scenario)."""
    return {
        "step": step,
        "scheduled": [[rid, n] for rid, n in output.num_scheduled_tokens],
        "new": list(output.scheduled_new_reqs),
        "resumed": list(output.scheduled_resumed_reqs),
        "preempted": list(output.preempted_req_ids),
        "finished": finished,
        "running": list(after.running),
        "waiting": list(after.waiting),
        # In scenario order; sorting the live requests, not scanning all of
        # them, keeps a step's cost independent of the scenario's size.
        "num_computed_tokens": {rid: after.requests[rid].num_computed_tokens
                                for rid in sorted(after.requests, key=position.__getitem__)},
        "num_free_blocks": after.num_free_blocks,
        # Ids that got a token this step (async: from the batch applied), in batch order.
        "sampled": list(sampled),
        "slots_held": len(mid.running),
    }


def is_idle_record(record: Mapping[str, Any]) -> bool:
    """A step in which the scheduler held no request: nothing scheduled,
    finished, running or waiting.  Such steps are not listed in a trace
    (formats.md, Trace); `summary.steps` still counts them."""
    if record.get("schedule_called") or record.get("applied_step") is not None and "schedule_called" in record:
        return False  # async: a batch was scheduled or applied, even an empty one
    return not (record["scheduled"] or record["finished"] or record["running"] or record["waiting"])


def finish_trace(scenario_name: str, impl_name: str, steps: list, num_steps: int, order: Sequence[str],
                 pending, summary: dict, sink=None) -> dict[str, Any]:
    """The trace of a finished run, with its summary; a sink (trace_io.py) gets it too."""
    trace = {
        "format": TRACE_FORMAT,
        "scenario": scenario_name,
        "implementation": impl_name,
        "steps": steps,
        "summary": {
            "steps": num_steps,
            "finished": len(order) - len(pending),
            "unfinished": [rid for rid in order if rid in pending],
            "requests": summary,
        },
    }
    if sink is not None:
        sink.end(trace)
    return trace


def _requests_of(scenario: Scenario, config) -> tuple[dict[str, Request], str | None]:
    """The spec's Request for every request of the scenario, or the first one's problem."""
    requests = {}
    tokens = prompt_token_ids(scenario) if config.enable_prefix_caching else {}
    for i, r in enumerate(scenario.requests):
        try:
            requests[r.id] = make_request(config, r.id, r.prompt_len, r.max_tokens, r.priority, r.arrival_time,
                                          tokens.get(r.id), r.lora_int_id, r.grammar_compile_steps is not None,
                                          r.kv_connector_tokens, r.kv_connector_load_steps is not None,
                                          r.kv_connector_send_steps is not None, r.mm_features)
        except ConfigError as e:
            return requests, f"requests[{i}].{e}"
    return requests, None


def _unmodelled(scenario: Scenario, impl: SchedulerImpl, name: str
                ) -> tuple[str | None, KVLoads | None, KVSends | None]:
    """What of the scenario's requests `impl` does not model (KV connector hits, encoder
    inputs, the worker's KV reports, grammars), as a rejection; else the KV loads and
    sends the engine reports."""
    has_mm = any(r.mm_features for r in scenario.requests)
    held = [i for i, r in enumerate(scenario.requests) if r.kv_connector_tokens]
    if held and getattr(impl, "models_kv_connector_hits", True) is False:
        return f"requests[{held[0]}].kv_connector_tokens: {name} does not model KV connector hits", None, None
    if has_mm and getattr(impl, "models_encoder_inputs", True) is False:
        i = next(i for i, r in enumerate(scenario.requests) if r.mm_features)
        return f"requests[{i}].mm_features: {name} does not model encoder inputs", None, None
    # The worker's reports: each needs its update_from_output argument.
    steps_of = {}
    for field, takes, what, argument in (
            ("kv_connector_load_steps", takes_finished_recving, "asynchronous KV loads", "finished_recving"),
            ("kv_connector_send_steps", takes_finished_sending, "KV connector sends", "finished_sending")):
        steps_of[field] = {r.id: getattr(r, field) for r in scenario.requests if getattr(r, field)}
        if steps_of[field] and not takes(impl):
            i = next(i for i, r in enumerate(scenario.requests) if getattr(r, field))
            return (f"requests[{i}].{field}: {name} does not model {what} "
                    f"(its update_from_output takes no {argument})"), None, None
    loads = KVLoads(steps_of["kv_connector_load_steps"]) if steps_of["kv_connector_load_steps"] else None
    sends = KVSends(steps_of["kv_connector_send_steps"]) if steps_of["kv_connector_send_steps"] else None
    if scenario.grammar_events() and not isinstance(impl, GrammarTaking):
        return (f"requests[].grammar_compile_steps: {name} does not model structured output "
                "(it has no grammar_compiled)"), None, None
    return None, loads, sends


def _feature_fields(record: dict[str, Any], config, e: EngineStep, has_mm: bool, kept: Mapping[str, int],
                    asynchronous: bool) -> None:
    """The trace fields of the features the scenario uses (formats.md, Trace)."""
    output = e.output
    if config.enable_prefix_caching:
        record["prefix_hits"] = dict(output.prefix_hits)
    if output.kv_connector_hits:
        record["kv_connector_hits"] = dict(output.kv_connector_hits)
    if has_mm:  # on every step, so that a comparison never skips them
        record["scheduled_encoder_inputs"] = {rid: list(ids) for rid, ids in output.scheduled_encoder_inputs}
        record["free_encoder_mm_hashes"] = list(output.free_encoder_mm_hashes)
    if config.num_speculative_tokens:
        record["scheduled_spec_decode_tokens"] = {rid: len(ids) for rid, ids in output.scheduled_spec_decode_tokens}
        record["new_tokens"] = kept
    if asynchronous:
        record["schedule_called"] = e.called
        record["applied_step"] = e.applied


class _EngineRun:
    """One run of a scenario between its steps: the events by step, the fake model,
    the batches in flight, and each request's summary."""

    def __init__(self, scenario: Scenario, impl: SchedulerImpl, config, requests: dict[str, Request],
                 loads: KVLoads | None, sends: KVSends | None):
        self.impl, self.config, self.requests, self.loads, self.sends = impl, config, requests, loads, sends
        self.arrivals, self.aborts = scenario.events_by_step()
        self.event_steps = sorted(set(self.arrivals) | set(self.aborts))
        self.grammars = scenario.grammar_events()
        self.has_mm = any(r.mm_features for r in scenario.requests)
        self.summary = {r.id: {"first_token_step": None, "finish_step": None, "finish_reason": None,
                               "num_output_tokens": 0, "num_preemptions": 0} for r in scenario.requests}
        self.order = [r.id for r in scenario.requests]
        self.position = {rid: i for i, rid in enumerate(self.order)}
        self.pending = set(self.order)  # not finished yet
        self.holds_requests = False  # whether the implementation held a request after the last step
        self.model = FakeModel.of(scenario, config.num_speculative_tokens)
        # Async scheduling: the batches in flight, oldest first (formats.md, async engine step).
        self.in_flight: deque | None = deque() if config.async_scheduling else None

    def idle_at(self, step: int) -> bool:
        """Whether nothing can happen at `step`: no request held, no arrival or abort."""
        return not self.holds_requests and step not in self.arrivals and step not in self.aborts

    def next_event(self, step: int, max_steps: int) -> int:
        """The next step with an arrival or an abort after `step` (max_steps: none)."""
        k = bisect.bisect_right(self.event_steps, step)
        return min(self.event_steps[k] if k < len(self.event_steps) else max_steps, max_steps)

    def step(self, step: int) -> tuple[dict[str, Any], EngineStep]:
        """One engine step: its trace record, and what the step did."""
        impl, in_flight = self.impl, self.in_flight
        finished = self.apply_events(step)
        e = engine_step(impl, step, self.model, in_flight, self.loads, self.sends)
        # Requests finished with an error come last, in id order: vLLM finishes them from a set.
        finished += [[rid, FINISH_REASON[status]] for rid, status in e.stopped
                     if status != RequestStatus.FINISHED_ERROR]
        finished += sorted([rid, FINISH_REASON[status]] for rid, status in e.stopped
                           if status == RequestStatus.FINISHED_ERROR)
        if self.sends is not None:
            self.sends.finished(step, [rid for rid, _ in finished])
        after = e.after
        self.holds_requests = bool(after.requests or after.running or after.waiting or in_flight
                                   or after.finished_req_ids and in_flight is not None)
        kept = num_kept(e.mid, e.sampled)
        self.tally(step, kept, e.output, finished)
        record = step_record(step, e.output, e.mid, after, finished, e.sampled, self.position)
        _feature_fields(record, self.config, e, self.has_mm, kept, in_flight is not None)
        return record, e

    def apply_events(self, step: int) -> list[list[str]]:
        """formats.md steps 1-2 of an engine step: aborts, arrivals, then the grammars that
        finish compiling now, before schedule() reads them.  The requests the aborts finished."""
        impl = self.impl
        finished: list[list[str]] = []
        for rid in self.aborts.get(step, ()):
            for done in impl.finish_requests([rid], RequestStatus.FINISHED_ABORTED):
                finished.append([done, "aborted"])
        for rid in self.arrivals.get(step, ()):
            impl.add_request(self.requests[rid])
        for failed in (False, True):
            ids = [rid for rid, f in self.grammars.get(step, ()) if f == failed]
            if ids:
                impl.grammar_compiled(ids, failed)
        return finished

    def tally(self, step: int, kept: Mapping[str, int], output: SchedulerOutput, finished: list[list[str]]) -> None:
        """The step's outputs, preemptions and finishes into the per-request summary."""
        summary = self.summary
        for rid, n in kept.items():
            s = summary[rid]
            s["num_output_tokens"] += n
            if s["first_token_step"] is None:
                s["first_token_step"] = step
        for rid in output.preempted_req_ids:
            summary[rid]["num_preemptions"] += 1
        for rid, reason in finished:
            summary[rid]["finish_step"] = step
            summary[rid]["finish_reason"] = reason
            self.pending.discard(rid)


def run_scenario(
    scenario: Scenario,
    impl: SchedulerImpl,
    *,
    on_step: Callable[[Transition], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    sink: "TraceSink | None" = None,
) -> dict[str, Any]:
    """Run `scenario` on `impl`; a rejected config or request gives an error trace.

    With `sink` (reference/trace_io.py's protocol: begin(header), step(record),
    end(trace)), each step record goes to the sink as it is made and is not
    kept: the returned trace then has `"steps": []` (the summary is complete),
    so a long run needs memory for its state only.

    Idle time is skipped: when the implementation holds no request, the engine
    jumps to the next step with an arrival or an abort instead of calling
    schedule() on an empty scheduler step after step; such steps are not listed
    (formats.md, Trace) and `summary.steps` counts them."""
    name = getattr(impl, "name", type(impl).__name__)
    header = {"format": TRACE_FORMAT, "scenario": scenario.name, "implementation": name}

    def rejected(message: str) -> dict[str, Any]:
        trace = error_trace(scenario, name, message)
        if sink is not None:
            sink.begin(header)
            sink.end(trace)
        return trace

    try:
        config = scenario.scheduler_config()
    except ConfigError as e:
        # The spec's structural checks on field types come first; an implementation
        # still decides what it accepts among well-typed configs below.
        return rejected(str(e))
    try:
        impl.reset(config)
    except (ConfigError, ValueError) as e:
        return rejected(str(e))
    requests, problem = _requests_of(scenario, config)
    if problem is None:
        problem, loads, sends = _unmodelled(scenario, impl, name)
    if problem is not None:
        return rejected(problem)

    # Refused before the trace is begun: a sink gets the error trace once
    # (tests/regressions/engine-drafts-refused-one-header.json).
    if config.num_speculative_tokens and not config.async_scheduling and not isinstance(impl, DraftTaking):
        return rejected(f"config.num_speculative_tokens: {name} does not model speculative decoding "
                        "(it has no update_draft_token_ids)")
    run = _EngineRun(scenario, impl, config, requests, loads, sends)
    steps: list[dict[str, Any]] = []
    if sink is not None:
        sink.begin(header)
    emit = sink.step if sink is not None else steps.append
    step = 0
    while step < scenario.max_steps and run.pending:
        if run.idle_at(step):
            # Nothing can happen before the next arrival or abort: go there.
            step = run.next_event(step, scenario.max_steps)
            if progress is not None:
                progress(step, scenario.max_steps)
            continue
        record, e = run.step(step)
        if not is_idle_record(record):
            emit(record)
            if on_step is not None:
                on_step(Transition(step, e.before, e.output, e.after, record))
        step += 1
        if progress is not None:
            progress(step, scenario.max_steps)

    return finish_trace(scenario.name, name, steps, step, run.order, run.pending, run.summary, sink)
