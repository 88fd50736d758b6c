"""The witnesses of `initial`, `inductive:add_request`, `inductive:abort` and
`inductive:schedule+update` say something, and the spec replays it.

Their goal was once `True` (any run), which shows nothing (issue 15).  Now
(proofs/witness.py goal_formula):
- initial: from the empty state the run reaches a state with a running and a
  waiting request, which satisfies every state invariant;
- add: a request arrives while another one, holding blocks, is present;
- abort: an abort removes a request holding blocks, and another request stays;
- schedule+update: the step grants tokens.
Each witness scenario is run through the spec's engine and the claim is
checked on the trace, not on the z3 model.
"""

from __future__ import annotations

import pytest
import z3

from schedspec.proofs import witness as W
from schedspec.proofs.witness import find_witness
from schedspec.proofs.release import DEFAULT
from schedspec.reference.engine import run_scenario
from schedspec.reference.impl import SpecScheduler
from schedspec.spec.invariants import check_state


def replay(scenario) -> dict:
    steps = {}
    run_scenario(scenario, SpecScheduler(), on_step=lambda t: steps.__setitem__(t.step, t))
    return steps


@pytest.fixture(scope="module")
def witnesses():
    return {g: find_witness(g, DEFAULT) for g in ("initial", "inductive:add", "inductive:abort", "inductive:step",
                                         "running-kept")}


def test_initial_witness_is_a_non_empty_state_satisfying_the_invariant(witnesses):
    res, scenario = witnesses["initial"]
    assert res.status == "proved", res
    after = replay(scenario)[res.model["step"]].after
    assert after.running and after.waiting
    assert all(v.holds for v in check_state(after).values())


def test_add_witness_changes_a_non_empty_state(witnesses):
    res, scenario = witnesses["inductive:add"]
    assert res.status == "proved", res
    k = res.model["step"]
    steps = replay(scenario)
    new = [r.id for r in scenario.requests if r.arrival_step == k]
    assert new and k - 1 in steps
    prior = steps[k - 1].after  # the state add_request is applied to
    assert any(prior.num_blocks(r) > 0 for r in prior.requests)
    before = steps[k].before
    assert set(prior.requests) < set(before.requests) and set(new) <= set(before.requests)


def test_abort_witness_removes_a_request_holding_blocks(witnesses):
    res, scenario = witnesses["inductive:abort"]
    assert res.status == "proved", res
    k = res.model["step"]
    steps = replay(scenario)
    aborted = [a.id for a in scenario.aborts if a.step == k]
    assert aborted and k - 1 in steps
    prior = steps[k - 1].after
    assert any(prior.num_blocks(a) > 0 for a in aborted if a in prior.requests)
    stays = set(prior.requests) - set(aborted)
    assert stays and stays <= set(steps[k].before.requests)
    assert not set(aborted) & set(steps[k].before.requests)


def test_step_witness_grants_tokens(witnesses):
    res, scenario = witnesses["inductive:step"]
    assert res.status == "proved", res
    assert replay(scenario)[res.model["step"]].output.num_scheduled_tokens


def test_running_kept_witness(witnesses):
    """loop:running_never_starved's witness: a request running before and after the
    step, behind another running request, received tokens."""
    res, scenario = witnesses["running-kept"]
    assert res.status == "proved", res
    t = replay(scenario)[res.model["step"]]
    kept = [r for i, r in enumerate(t.before.running) if i > 0 and r in t.after.running]
    assert any(r in t.output.scheduled for r in kept), (t.before.running, t.after.running, t.output)


@pytest.mark.parametrize("goal", ["initial", "inductive:add", "inductive:abort"])
def test_goal_is_not_true_of_every_run(goal):
    """The goal formula is unsatisfiable at step 0 for add and abort (nothing can
    be present before the first arrival), and for `initial` on a run of one
    request (no state has a running and a waiting request): so it is no `True`."""
    n = 1 if goal == "initial" else W.BMC_REQUESTS
    c, specs, (arrive, abort_at), trace, cons = W.unroll(1, n, DEFAULT, aborts=goal == "inductive:abort")
    s = z3.Solver()
    s.add(*cons, W.goal_formula(goal, trace[0], 0, arrive, abort_at))
    assert s.check() == z3.unsat
