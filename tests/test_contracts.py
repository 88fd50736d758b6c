"""The PEP 316 contracts on the spec's public functions, evaluated on every step
of random campaign scenarios.

CrossHair (tests/test_crosshair.py) cannot build a state that meets
`schedule`'s preconditions within CI time, so there its contracts would only be
documentation; here every `post:` condition of `schedule` and
`update_from_output` is evaluated on real steps (the `pre:` lines are
CrossHair's small search bounds, not conditions of the function, and are not
applied), and a broken spec is shown to violate them."""

from __future__ import annotations

import re

import pytest

from mutants import Mutation, mutated
from schedspec.reference.engine import fake_model, run_scenario
from schedspec.reference.generator import generate_scenario, scenario_rng
from schedspec.reference.impl import SpecScheduler
from schedspec.spec import scheduler as spec_scheduler

SCENARIOS = 150


def postconditions(fn) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^\s*post:(.*)$", fn.__doc__ or "", re.M)]


def broken_posts(scheduler, scenarios, first_only: bool = False) -> dict[str, int]:
    """post condition -> how many steps violated it, running `scheduler`'s
    schedule and update_from_output on each step's state; with `first_only`, up
    to the end of the first scenario where one is violated."""
    posts = {"schedule": postconditions(spec_scheduler.schedule),
             "update_from_output": postconditions(spec_scheduler.update_from_output)}
    assert len(posts["schedule"]) >= 4 and len(posts["update_from_output"]) >= 2
    env = dict(vars(spec_scheduler))  # a contract reads the names of its module, as CrossHair does
    bad: dict[str, int] = {}

    def on_step(scenario):
        def check(t):
            state = t.before
            result = scheduler.schedule(state)
            for cond in posts["schedule"]:
                if not eval(cond, env, {"state": state, "__return__": result}):  # noqa: S307 - our own docstrings
                    bad[f"schedule: {cond}"] = bad.get(f"schedule: {cond}", 0) + 1
            output, mid = result
            sampled = fake_model(scenario, output, mid)
            ret = scheduler.update_from_output(mid, output, sampled)
            for cond in posts["update_from_output"]:
                names = {"state": mid, "output": output, "sampled_token_ids": sampled, "finished_recving": (),
                         "finished_sending": (), "__return__": ret}
                if not eval(cond, env, names):  # noqa: S307
                    bad[f"update_from_output: {cond}"] = bad.get(f"update_from_output: {cond}", 0) + 1
        return check

    for scenario in scenarios:
        run_scenario(scenario, SpecScheduler(), on_step=on_step(scenario))
        if bad and first_only:
            break
    return bad


@pytest.fixture(scope="module")
def scenarios():
    return [generate_scenario(scenario_rng(11, i), i) for i in range(SCENARIOS)]


def test_contracts_hold_on_campaign_steps(scenarios):
    assert broken_posts(spec_scheduler, scenarios) == {}


# Each a broken rule (with the spec's own assertion on it removed, so that only
# the contracts can notice).
M = Mutation
MUTANTS = {
    "admission over budget": [M("scheduler.num_new_tokens_waiting", "min(n, chunk_budget(s))", "min(n, chunk_budget(s) + 1)"),
                              M("scheduler.schedule", "assert s.token_budget >= 0 and s.input_budget >= 0", "pass")],
    "preemption leaks blocks": [M("kv_cache.BlockCountsWork.free",
                                  "self.num_free_blocks += self.req_to_num_blocks.pop(request_id, 0)",
                                  "self.req_to_num_blocks.pop(request_id, 0)")],
    "admission after preemption": [M("scheduler.schedule", "not s.preempted", "True")],
    "finished request kept": [M("scheduler.update_from_output",
                                "remove_finished(w, [x for x, _ in finished], kv_connector.hold(w, finished))",
                                "remove_finished(w, [], kv_connector.hold(w, finished))")],
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_contracts_catch_a_broken_spec(name, scenarios):
    with mutated(MUTANTS[name]) as mutant:
        assert broken_posts(mutant, scenarios, first_only=True), f"no contract caught {name!r}"
