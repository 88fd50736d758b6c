"""A counterexample is real: every committed goal file (tests/counterexamples/)
reaches its goal on the real vLLM 0.33.0 scheduler too, and the liveness
files' cycles persist on vLLM for hundreds of steps.

Skips without vLLM, unless SCHEDSPEC_REQUIRE_VLLM=1 or CI=true (then it
fails), as tests/test_vllm_diff.py does.
"""

from __future__ import annotations

import dataclasses

import pytest
from schedspec.proofs.search.counterexample import evaluate
from schedspec.proofs.search.goals import at_step, cycle_in, get_goal, state_key, steps_between
from schedspec.reference.engine import run_scenario
from schedspec.reference.scenario import load_scenario
from test_counterexample import FILES, goal_of


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_vllm_reaches_the_same_goal(vllm, path):
    s = load_scenario(path)
    name, k = goal_of(s)
    goal = get_goal(name)
    hit = evaluate(s, vllm, goal, k)
    assert hit is not None, f"vLLM does not reach {name} on {path.name}"
    # Same request(s), same steps as the spec.
    from schedspec.reference.impl import SpecScheduler

    spec_hit = evaluate(s, SpecScheduler(), goal, k)
    assert (hit.requests, hit.first_step, hit.last_step) == (spec_hit.requests, spec_hit.first_step,
                                                             spec_hit.last_step)
    # Step for step the same run as the spec's.
    from schedspec.reference.compare import compare_traces

    assert compare_traces(run_scenario(s, SpecScheduler()), run_scenario(s, vllm)) is None
    # With one step fewer vLLM does not reach it either: the predicate is not trivially true.
    assert evaluate(dataclasses.replace(s, max_steps=s.max_steps - 1), vllm, goal, k) is None


@pytest.mark.parametrize("path", [p for p in FILES if p.stem.startswith("liveness")], ids=lambda p: p.stem)
def test_vllm_livelock_persists(vllm, path):
    """vLLM's observed state repeats too, and 500 steps later the stuck requests are still unfinished."""
    s = dataclasses.replace(load_scenario(path), max_steps=500)
    transitions = []
    trace = run_scenario(s, vllm, on_step=transitions.append)
    assert trace["summary"]["steps"] == 500
    first, repeat = cycle_in(s, transitions)
    stuck = set(at_step(transitions, first).before.requests)
    assert stuck and stuck <= set(trace["summary"]["unfinished"])
    # Every later step repeats the cycle: the period holds to the end.
    period = repeat - first
    keys = [state_key(t.before) for t in steps_between(transitions, first, s.max_steps)]
    assert all(keys[i] == keys[i + period] for i in range(len(keys) - period))
