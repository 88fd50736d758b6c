"""A replayable scenario for a divergence, where the run can be rebuilt from what
the engine asked of the scheduler.

The monitor keeps, for each scheduler it has watched from birth, the run as a
scenario file would say it (docs/formats.md): the config, each request with the
step it arrived at (the number of `schedule()` calls before its `add_request`),
its prompt and limits, the output at which it sampled its stop token, and each
abort with its step.  On a divergence this becomes a scenario whose last step
is the diverging one.

A rebuilt scenario is only *claimed* replayable once it is replayed: vLLM
(through the adapter) and the spec run it side by side, and it is written only
when they diverge there too.  An engine loop other than the one formats.md
describes, output tokens that matter (prefix caching over generated text), or
anything the format cannot say (another finish status, stop tokens other than
the fake model's) make the replay differ, and the divergence is reported
without a scenario, with the reason.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from schedspec.reference.scenario import Abort, RequestSpec, Scenario, save_scenario
from schedspec.spec.request import RequestStatus

LOG_ATTR = "schedspec_run"  # on a vLLM scheduler: its RunLog, or None when not watched from birth


class RunLog:
    """What one scheduler was asked, from its first call, as scenario parts."""

    def __init__(self, config) -> None:
        self.config = config
        self.steps = 0  # schedule() calls so far
        self.requests: dict[str, RequestSpec] = {}
        self.aborts: list[Abort] = []
        self.broken = ""  # why the run can no longer be rebuilt, once it cannot

    def stop(self, why: str) -> None:
        if not self.broken:
            self.broken = why

    def record(self, call: str, prepared: Any) -> None:
        """A checked call: what it adds to the run."""
        a = prepared.args
        if call == "schedule":
            if a.get("throttle_prefills"):
                self.stop("schedule(throttle_prefills=True): a scenario has no data-parallel cadence")
            self.steps += 1
        elif call == "add_request":
            r = a["request"]
            self.requests[r.request_id] = RequestSpec(
                id=r.request_id, prompt_len=r.num_prompt_tokens, arrival_step=self.steps, max_tokens=r.max_tokens,
                priority=r.priority, arrival_time=r.arrival_time,
                prompt_token_ids=tuple(r.prompt_token_ids) if self.config.enable_prefix_caching else None)
        elif call == "finish_requests":
            if a["status"] != RequestStatus.FINISHED_ABORTED:
                self.stop(f"finish_requests with {a['status'].name}: a scenario aborts only")
            done = (prepared.observed_result or {}).get("finished", ())
            self.aborts.extend(Abort(rid, self.steps) for rid in done)
        elif call == "update_from_output":
            pre = prepared.pre
            for rid, tokens in a["sampled"].items():
                r = pre.requests.get(rid)
                spec = self.requests.get(rid)
                if r is None or spec is None or spec.output_len is not None:
                    continue
                for k, token in enumerate(tokens, 1):
                    if token == r.eos_token_id or token in r.stop_token_ids:
                        # The fake model samples EOS as output number output_len (formats.md).
                        self.requests[rid] = dataclasses.replace(spec, output_len=r.num_output_tokens + k)
                        break

    def scenario(self, name: str) -> Scenario:
        return Scenario(name=name, config=self.config, requests=tuple(self.requests.values()),
                        aborts=tuple(self.aborts), max_steps=self.steps + 1,
                        description=f"rebuilt by schedspec's runtime monitor from a diverging run ({name})")


def run_log(sched: Any, config: Callable[[], Any]) -> RunLog | None:
    """The scheduler's RunLog, started at its first call when it holds nothing yet."""
    d = sched.__dict__
    if LOG_ATTR not in d:
        fresh = not getattr(sched, "requests", None) and not getattr(sched, "finished_req_ids", None) \
            and not getattr(sched, "current_step", 0)
        d[LOG_ATTR] = RunLog(config()) if fresh else None
    return d[LOG_ATTR]


def replay_and_write(log: RunLog, name: str, directory: Path) -> tuple[Path | None, str]:
    """Write the rebuilt scenario if vLLM and the spec diverge on it too:
    (path, "") or (None, why not)."""
    from schedspec.reference.compare import compare_runs
    from schedspec.reference.engine import run_scenario
    from schedspec.reference.impl import SpecScheduler
    from schedspec.reference.scenario import scenario_problem
    from schedspec.reference.vllm_adapter import VllmScheduler

    if log.broken:
        return None, log.broken
    scenario = log.scenario(name)
    problem = scenario_problem(scenario)
    if problem:
        return None, f"the rebuilt scenario is not a valid file: {problem}"
    vllm = VllmScheduler()
    try:
        d = compare_runs(run_scenario(scenario, vllm), run_scenario(scenario, SpecScheduler()), "vllm", "spec")
    finally:
        vllm.close()
    if d is None:
        return None, "replayed through schedspec's engine, vLLM and the spec agree: the run is not rebuilt exactly"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.scenario.json"
    k = 2
    while path.exists():
        path = directory / f"{name}-{k}.scenario.json"
        k += 1
    return save_scenario(scenario, path), ""


__all__ = ["LOG_ATTR", "RunLog", "replay_and_write", "run_log"]
