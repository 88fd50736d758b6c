"""Idle time: when the scheduler holds no request, the engine jumps to the next
arrival; such steps are not listed, and summary.steps and the metrics still count them."""

from __future__ import annotations

import pytest
from schedspec.reference.baselines import run_baseline
from schedspec.reference.engine import is_idle_record, run_scenario
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.metrics import compute_metrics
from schedspec.reference.scenario import Abort, RequestSpec, Scenario


class CountingSpec(SpecScheduler):
    name = "spec"

    def __init__(self):
        super().__init__()
        self.schedules = 0

    def schedule(self):
        self.schedules += 1
        if self.schedules > 1000:  # fail fast instead of stepping through the idle time
            raise AssertionError("the engine steps through idle time one step at a time")
        return super().schedule()


def _scenario(arrivals, max_steps=100, aborts=()):
    reqs = tuple(RequestSpec(id=f"r{i}", prompt_len=5, arrival_step=a, max_tokens=3, arrival_time=float(i))
                 for i, a in enumerate(arrivals))
    return Scenario(name="idle", config={"max_num_batched_tokens": 64, "max_num_seqs": 4},
                    requests=reqs, aborts=tuple(Abort(rid, s) for rid, s in aborts), max_steps=max_steps)


def _with_idle_steps_listed(trace, free_blocks):
    """The trace as the engine wrote it before idle steps were skipped: every
    step from 0 to summary.steps - 1 listed."""
    listed = {st["step"]: st for st in trace["steps"]}
    steps = []
    for k in range(trace["summary"]["steps"]):
        steps.append(listed.get(k) or {
            "step": k, "scheduled": [], "new": [], "resumed": [], "preempted": [], "finished": [],
            "running": [], "waiting": [], "num_computed_tokens": {}, "num_free_blocks": free_blocks,
            "sampled": [], "slots_held": 0})
    return {**trace, "steps": steps}


def test_a_far_arrival_is_reached_in_a_jump():
    sc = _scenario([0, 999_999_990], max_steps=10**9)
    impl = CountingSpec()
    trace = run_scenario(sc, impl)
    assert impl.schedules < 20  # stepping one by one would be a billion calls
    assert trace["summary"]["unfinished"] == []
    assert [st["step"] for st in trace["steps"]] == [0, 1, 2, 999_999_990, 999_999_991, 999_999_992]
    assert trace["summary"]["steps"] == 999_999_993
    m = compute_metrics(sc, trace)["overall"]
    assert m["steps"] == 999_999_993 and m["total_ms"] == 20.0 * 999_999_993
    assert m["ttft_steps_mean"] == 1 and m["itl_steps_mean"] == 1


def test_an_arrival_at_or_after_max_steps_ends_the_run_at_max_steps():
    sc = _scenario([0, 10**9], max_steps=10**9)
    impl = CountingSpec()
    trace = run_scenario(sc, impl)
    assert impl.schedules == 3
    assert trace["summary"]["steps"] == 10**9 and trace["summary"]["unfinished"] == ["r1"]


@pytest.mark.parametrize("arrivals, aborts", [
    ([5, 6, 30], ()),                 # idle before the first arrival and in the middle
    ([0, 0, 20, 21], [("r3", 22)]),   # an abort after an idle gap
    ([0, 40], [("r0", 30)]),          # an abort of a finished request inside the gap
])
def test_skipped_steps_are_exactly_the_idle_ones_and_metrics_agree(arrivals, aborts):
    sc = _scenario(arrivals, aborts=aborts)
    trace = run_scenario(sc, SpecScheduler())
    steps = [st["step"] for st in trace["steps"]]
    assert steps[0] == arrivals[0] and not any(is_idle_record(st) for st in trace["steps"])
    assert len(steps) < trace["summary"]["steps"]  # something was skipped
    full = _with_idle_steps_listed(trace, trace["steps"][-1]["num_free_blocks"])
    for step_ms, token_ms in ((20.0, 0.0), (10.0, 0.5)):
        assert compute_metrics(sc, trace, step_ms, token_ms) == compute_metrics(sc, full, step_ms, token_ms)
    # the skipped steps are those in which the scheduler held nothing
    for k in range(trace["summary"]["steps"]):
        if k not in steps:
            assert all(not (a <= k <= (trace["summary"]["requests"][r.id]["finish_step"] or 10**9))
                       for r, a in zip(sc.requests, arrivals))


@pytest.mark.parametrize("kind", ["static", "request", "iteration"])
def test_baselines_skip_idle_time_too(kind):
    # Four arrivals fill max_num_seqs, so even the static batch launches at once
    # (a static batch that waits to fill is not idle: its waiting steps are listed).
    sc = _scenario([0, 0, 0, 0, 999_999_990], max_steps=10**9)
    trace = run_baseline(sc, kind)
    assert trace["summary"]["unfinished"] == [] and trace["summary"]["steps"] == 999_999_993
    assert len(trace["steps"]) == 6


def test_torch_batch_lists_the_same_steps():
    pytest.importorskip("torch")
    from schedspec.gpu.batch import run_batch
    from schedspec.reference.compare import compare_traces

    scs = [_scenario([5, 6, 30]), _scenario([0, 0, 20, 21], aborts=[("r3", 22)])]
    for sc, t in zip(scs, run_batch(scs, device="cpu")):
        assert compare_traces(run_scenario(sc, SpecScheduler()), t) is None
