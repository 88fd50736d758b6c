"""The seed's three batching granularities (Table 1) as runnable baselines.

`run_baseline(scenario, kind)` runs a scenario under one of them and returns a
`schedspec.trace/1` dict (docs/formats.md) that every trace tool reads: the
metrics (reference/metrics.py), the budget plot (reference/plot.py), a diff
against the spec.  `implementation` is "baseline-static", "baseline-request"
or "baseline-iteration".

Step model (the seed's, not vLLM's token budget):

* Each step every active batch member produces exactly one output token.  A
  request's prompt is processed in its admission step, which also yields its
  first output token, so a request with output length L is busy for L steps.
* Output length L = `output_len` (EOS, finish reason "stopped") when it is set
  and not beyond the length limit; otherwise the length limit
  min(max_tokens, max_model_len - prompt_len) (reason "length").  `max_tokens`
  defaults to max_model_len - prompt_len as in formats.md.
* The batch capacity is config `max_num_seqs`.  There is no token budget: a
  baseline never limits how many tokens a step processes.
* Aborts from the scenario are applied at the start of their step, before
  arrivals, as in the engine.  An aborted member of a static or request-level
  batch still holds its slot until the batch boundary; an aborted request at
  the iteration level gives its slot and KV blocks back at once.

Kinds:

* "static": a batch launches only when the previous one is over and either
  `max_num_seqs` requests are waiting or no more arrivals will come (no request
  of the scenario arrives after this step); it takes the first `max_num_seqs`
  waiting requests.  Every member holds its slot until the whole batch is done;
  new arrivals wait.
* "request": request-level dynamic batching.  As soon as the previous batch is
  over, whatever is waiting (up to `max_num_seqs`) forms the next batch, even a
  batch of one.  Slots are released only at the batch boundary.
* "iteration": the second seed's loop.  Each step (1) reaps the requests that
  finished in the previous step (their slots and KV blocks are free again),
  (2) admits from the FCFS waiting queue while a slot is free and the KV pool
  (config `block_size`, `num_gpu_blocks` - 1 usable blocks) can hold the
  request's full sequence, ceil((prompt_len + L) / block_size) blocks, reserved
  whole at admission; the first request that does not fit stops admission
  (break, head-of-line), (3) steps: every running request produces a token.

A batch is over when all its members have finished (or been aborted); the next
batch can launch in the step after the last member finished.

Trace fields, read after the step as in the engine:

* `scheduled`: `[id, n]` for every active member in batch (admission) order;
  n = prompt_len in the admission step (the whole prompt), 1 afterwards.
* `new`: requests admitted this step (a new static/request batch, or
  iteration-level admissions); `resumed` and `preempted` are always empty
  (a baseline never preempts).
* `finished`: this step's aborts first, then the requests that produced their
  last token, in scheduled order.
* `running`: the members still generating (admitted, not finished), in
  admission order.  A finished member of a static/request batch is not
  "running" although its slot stays held: see `slots_held`.
* `waiting`: arrived, unfinished, not admitted, in FCFS (arrival) order.
* `num_computed_tokens`: for every arrived, unfinished request, vLLM's meaning:
  tokens whose KV is computed.  Waiting: 0.  Running with o output tokens:
  prompt_len + o - 1 (the last sampled token is not computed yet).
* `num_free_blocks`: iteration only (the other two have no KV pool): usable
  blocks minus the blocks reserved by running requests.
* `sampled`: the ids that produced a token this step (every active member).
* `slots_held`: batch slots occupied during the step.  Static/request: every
  member of the current batch, finished or not, until the boundary.
  Iteration: the running requests of the step, including those finishing in it.
"""

from __future__ import annotations

import math
from typing import Any

from schedspec.spec.config import ConfigError
import bisect

from .engine import TRACE_FORMAT, error_trace, finish_trace, is_idle_record
from .scenario import Scenario, validate_scenario

KINDS = ("static", "request", "iteration")


def _length_and_reason(r, max_model_len: int) -> tuple[int, str]:
    max_tokens = r.max_tokens if r.max_tokens is not None else max_model_len - r.prompt_len
    limit = min(max_tokens, max_model_len - r.prompt_len)
    if r.output_len is not None and r.output_len <= limit:
        return r.output_len, "stopped"  # EOS is checked before length
    return limit, "length"


class _Batching:
    """The state of one baseline run: the queues, the current batch, the KV pool
    (iteration level) and each request's outputs and summary."""

    def __init__(self, scenario: Scenario, kind: str, config):
        self.kind, self.cap = kind, config.max_num_seqs
        self.specs = {r.id: r for r in scenario.requests}
        self.order = [r.id for r in scenario.requests]
        self.target = {rid: _length_and_reason(r, config.max_model_len) for rid, r in self.specs.items()}
        self.blocks_needed = {rid: math.ceil((self.specs[rid].prompt_len + self.target[rid][0]) / config.block_size)
                              for rid in self.order}
        self.last_arrival = max((r.arrival_step for r in scenario.requests), default=-1)
        self.outputs = {rid: 0 for rid in self.order}
        self.summary = {rid: {"first_token_step": None, "finish_step": None, "finish_reason": None,
                              "num_output_tokens": 0, "num_preemptions": 0} for rid in self.order}
        self.pending = set(self.order)  # not finished
        self.arrived: set[str] = set()
        self.waiting: list[str] = []
        self.running: list[str] = []  # admitted, still generating, in admission order
        self.batch: list[str] = []  # static/request: every member of the current batch
        self.free_blocks = config.num_usable_blocks
        self.reserved: dict[str, int] = {}

    def abort(self, step: int, rid: str, finished: list[list[str]]) -> None:
        if rid not in self.pending:
            return  # already finished: nothing happens, nothing recorded
        self.pending.discard(rid)
        finished.append([rid, "aborted"])
        self.summary[rid]["finish_step"] = step
        self.summary[rid]["finish_reason"] = "aborted"
        if rid in self.waiting:
            self.waiting.remove(rid)
        if rid in self.running:
            self.running.remove(rid)  # a static/request slot stays in `batch`
            if self.kind == "iteration":
                self.free_blocks += self.reserved.pop(rid)

    def admit(self, step: int) -> list[str]:
        """The requests admitted in `step`."""
        new: list[str] = []
        if self.kind == "iteration":
            while self.waiting and len(self.running) < self.cap:
                rid = self.waiting[0]
                if self.blocks_needed[rid] > self.free_blocks:
                    break  # head-of-line: the ones behind it wait too
                self.waiting.pop(0)
                self.free_blocks -= self.blocks_needed[rid]
                self.reserved[rid] = self.blocks_needed[rid]
                self.running.append(rid)
                new.append(rid)
        else:
            if self.batch and not self.running:
                self.batch = []  # the batch is over: its slots are free
            if not self.batch and self.waiting:
                if self.kind == "request" or len(self.waiting) >= self.cap or step >= self.last_arrival:
                    new = self.waiting[:self.cap]
                    del self.waiting[:self.cap]
                    self.batch = list(new)
                    self.running = list(new)
        return new

    def produce(self, step: int, finished: list[list[str]]) -> list[list[Any]]:
        """Every running request produces one token; those done finish.  The step's `scheduled`."""
        scheduled: list[list[Any]] = []
        done_now: list[str] = []
        for rid in self.running:
            scheduled.append([rid, self.specs[rid].prompt_len if self.outputs[rid] == 0 else 1])
            self.outputs[rid] += 1
            s = self.summary[rid]
            s["num_output_tokens"] = self.outputs[rid]
            if s["first_token_step"] is None:
                s["first_token_step"] = step
            length, reason = self.target[rid]
            if self.outputs[rid] >= length:
                done_now.append(rid)
                finished.append([rid, reason])
                s["finish_step"] = step
                s["finish_reason"] = reason
        for rid in done_now:
            self.pending.discard(rid)
            self.running.remove(rid)
            if self.kind == "iteration":
                self.free_blocks += self.reserved.pop(rid)  # reaped before the next admission
        return scheduled

    def step(self, step: int, arrivals: dict[int, list[str]], aborts: dict[int, list[str]]) -> dict[str, Any]:
        """One step: aborts (before arrivals), arrivals, admission, every running request
        producing a token; its trace record."""
        finished: list[list[str]] = []
        for rid in aborts.get(step, ()):
            self.abort(step, rid, finished)
        for rid in arrivals.get(step, ()):
            self.arrived.add(rid)
            self.waiting.append(rid)
        new = self.admit(step)
        slots_held = len(self.batch) if self.kind != "iteration" else len(self.running)
        scheduled = self.produce(step, finished)
        record: dict[str, Any] = {
            "step": step,
            "scheduled": scheduled,
            "new": new,
            "resumed": [],
            "preempted": [],
            "finished": finished,
            "running": list(self.running),
            "waiting": list(self.waiting),
            "num_computed_tokens": {
                rid: (self.specs[rid].prompt_len + self.outputs[rid] - 1 if self.outputs[rid] else 0)
                for rid in self.order if rid in self.arrived and rid in self.pending},
        }
        if self.kind == "iteration":
            record["num_free_blocks"] = self.free_blocks
        record["sampled"] = [rid for rid, _ in scheduled]
        record["slots_held"] = slots_held
        return record


def run_baseline(scenario: Scenario, kind: str, *, sink=None) -> dict[str, Any]:
    """Run `scenario` under the `kind` batching baseline ("static", "request",
    "iteration"); return its trace.  A scenario the spec rejects gives an error
    trace, as the engine does.  `sink` and idle steps as in the engine's
    run_scenario: records go to the sink instead of the returned trace, and
    steps in which nothing is held are skipped, not listed."""
    if kind not in KINDS:
        raise ValueError(f"unknown baseline {kind!r}; use one of {', '.join(KINDS)}")
    name = f"baseline-{kind}"
    try:
        config = validate_scenario(scenario)
    except ConfigError as e:
        trace = error_trace(scenario, name, str(e))
        if sink is not None:
            sink.begin({k: trace[k] for k in ("format", "scenario", "implementation")})
            sink.end(trace)
        return trace

    b = _Batching(scenario, kind, config)
    arrivals, aborts = scenario.events_by_step()
    steps: list[dict[str, Any]] = []
    if sink is not None:
        sink.begin({"format": TRACE_FORMAT, "scenario": scenario.name, "implementation": name})
    emit = sink.step if sink is not None else steps.append
    event_steps = sorted(set(arrivals) | set(aborts))

    step = 0
    while step < scenario.max_steps and b.pending:
        if not b.running and not b.waiting and step not in arrivals and step not in aborts:
            # Idle: nothing changes before the next arrival or abort.
            k = bisect.bisect_right(event_steps, step)
            step = min(event_steps[k] if k < len(event_steps) else scenario.max_steps, scenario.max_steps)
            continue
        record = b.step(step, arrivals, aborts)
        if not is_idle_record(record):
            emit(record)
        step += 1

    return finish_trace(scenario.name, name, steps, step, b.order, b.pending, b.summary, sink)


__all__ = ["KINDS", "run_baseline"]
