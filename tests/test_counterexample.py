"""`schedspec counterexample`: the goals, the search, the shrinker and the CLI, on the spec.

The committed regression files (tests/counterexamples/) were written by the
search; here each must still reach its goal on the spec, and stop reaching it
when its condition is taken away (one step fewer, or a larger budget), so no
goal predicate is true of everything.  The same files are replayed on vLLM in
tests/test_counterexample_vllm.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from schedspec.proofs.search.counterexample import GoalFailed, ImplementationFailed, evaluate, search
from schedspec.proofs.search.goals import GOALS, get_goal
from schedspec.reference.engine import run_scenario
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import RequestSpec, Scenario, load_scenario, save_scenario

from schedspec.cli.main import main as cli_main
from schedspec.spec.config import config_as_given
from broken_schedulers import BudgetPlusOne, ReversedRunning

HERE = Path(__file__).parent / "counterexamples"
FILES = sorted(HERE.glob("*.json"))


def goal_of(scenario):
    """(goal name, K) from the description the search wrote."""
    m = re.match(r"Counterexample for goal (\S+?)(?: \(K=(\d+)\))?: ", scenario.description)
    assert m, scenario.description
    return m.group(1), int(m.group(2) or 3)


def test_every_goal_has_a_regression_file():
    goals = {goal_of(load_scenario(f))[0] for f in FILES}
    # running-starved: none within the bound on the spec (see proofs/LIVENESS.md).
    assert set(GOALS) - {"running-starved"} <= goals


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_committed_file_reaches_its_goal_and_only_with_its_condition(path):
    s = load_scenario(path)
    name, k = goal_of(s)
    goal = get_goal(name)
    hit = evaluate(s, SpecScheduler(), goal, k)
    assert hit is not None, f"{path.name} no longer reaches {name}"
    # The description names the reproducing commands with this very file.
    assert f"--replay tests/counterexamples/{path.name}" in s.description
    assert f"schedspec run tests/counterexamples/{path.name}" in s.description
    # Shrunk to the end of the condition: one step fewer and it is not reached.
    assert hit.last_step == s.max_steps - 1
    assert evaluate(dataclasses.replace(s, max_steps=s.max_steps - 1), SpecScheduler(), goal, k) is None


def test_starvation_is_the_d_ge_b_scenario():
    s = load_scenario(HERE / "starvation.json")
    hit = evaluate(s, SpecScheduler(), get_goal("starvation"), 3)
    assert len(s.requests) == 2 and hit.values == {"D": 1, "B": 1}
    assert [r.prompt_len for r in s.requests] == [1, 1]
    # D < B: the waiting prompt gets tokens, the goal is gone.
    roomy = dataclasses.replace(s, config={**config_as_given(s.config), "max_num_scheduled_tokens": 2})
    assert evaluate(roomy, SpecScheduler(), get_goal("starvation"), 3) is None
    # A larger K is not reached in the same steps.
    assert evaluate(s, SpecScheduler(), get_goal("starvation"), 4) is None


def test_liveness_cycle_is_real_not_a_long_run():
    """The repeated state proves the run never ends: 2000 steps leave the same request unfinished."""
    for name in ("liveness-finishes.json", "liveness-finishes-resume.json"):
        s = load_scenario(HERE / name)
        hit = evaluate(s, SpecScheduler(), get_goal("liveness:finishes"), 3)
        long = run_scenario(dataclasses.replace(s, max_steps=2000), SpecScheduler())
        assert long["summary"]["steps"] == 2000
        assert set(hit.requests) <= set(long["summary"]["unfinished"])
    # A request that merely runs long is not a livelock: no repeated state.
    s = load_scenario(HERE / "starvation.json")
    assert evaluate(s, SpecScheduler(), get_goal("liveness:finishes"), 3) is None


def test_broken_variants_are_caught():
    # running-starved is never reached by the spec within the bound, but a reversed running loop reaches it.
    r = search(get_goal("running-starved"), 3, ReversedRunning(), tries=3000, budget_s=60, seed=1)
    assert r.found is not None and len(r.found.requests) <= 3
    assert evaluate(r.found, ReversedRunning(), get_goal("running-starved"), 3) is not None
    assert evaluate(r.found, SpecScheduler(), get_goal("running-starved"), 3) is None
    # A property the spec keeps is violated by a budget off by one, and the search says so.
    r = search(get_goal("property:token_budget_respected"), 3, BudgetPlusOne(), tries=3000, budget_s=60)
    assert r.found is not None and len(r.found.requests) == 1


def test_spec_keeps_a_property_within_the_bound():
    r = search(get_goal("property:kv_blocks_conserved"), 3, SpecScheduler(), tries=300, budget_s=60)
    assert r.found is None and r.tried == 300


def _cli(args, capsys):
    try:
        code = cli_main(args)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("goal", ["starvation", "stall", "priority-inversion"])
def test_cli_finds_writes_and_replays(goal, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(["counterexample", goal, "--budget-seconds", "60"], capsys)
    assert code == 0, err
    path = tmp_path / f"counterexample-{goal}.json"
    s = load_scenario(path)
    assert "random search + shrinking" in s.description and "random search + shrinking" in out
    assert f"--replay {path.name}" in s.description and f"schedspec run {path.name}" in s.description
    code, out, _ = _cli(["counterexample", goal, "--replay", str(path)], capsys)
    assert code == 0 and "reached" in out
    # Never overwritten: a second search writes a new file, -o onto it is refused.
    code, _, _ = _cli(["counterexample", goal], capsys)
    assert code == 0 and (tmp_path / f"counterexample-{goal}-2.json").exists()
    before = path.read_text()
    code, _, err = _cli(["counterexample", goal, "-o", str(path)], capsys)
    assert code == 2 and "not overwriting" in err and path.read_text() == before


def test_cli_fixed_config_none_within_bound_and_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"max_num_batched_tokens": 64, "max_num_seqs": 8, "max_model_len": 16,
                               "block_size": 4, "num_gpu_blocks": 100}))
    code, out, _ = _cli(["counterexample", "starvation", "--config", str(cfg), "--tries", "200"], capsys)
    # A budget of 64 tokens: at most 6 decodes can never take it all.
    assert code == 0 and "none within the bound" in out and "200 scenarios" in out
    code, out, _ = _cli(["counterexample", "property:grants_positive", "--tries", "100"], capsys)
    assert code == 0 and "none within the bound" in out
    # The search keeps the fixed config.
    cfg.write_text(json.dumps({"max_num_batched_tokens": 4, "max_num_scheduled_tokens": 1, "max_num_seqs": 4,
                               "max_model_len": 16, "block_size": 4, "num_gpu_blocks": 100}))
    code, out, _ = _cli(["counterexample", "starvation", "--config", str(cfg), "-o", "s.json"], capsys)
    assert code == 0 and load_scenario(tmp_path / "s.json").to_json()["config"] == json.loads(cfg.read_text())
    for args, word in ((["counterexample", "nosuchgoal"], "unknown goal"),
                       (["counterexample", "property:nosuch"], "unknown property"),
                       (["counterexample", "stall", "--k", "0"], "--k"),
                       (["counterexample", "stall", "--config", "missing.json"], "cannot read"),
                       (["counterexample", "stall", "--replay", "missing.json"], "cannot read")):
        code, _, err = _cli(args, capsys)
        assert code == 2 and word in err and len(err.strip().splitlines()) == 1, (args, err)
    cfg.write_text(json.dumps({"max_num_seqs": 0}))
    code, _, err = _cli(["counterexample", "stall", "--config", str(cfg)], capsys)
    assert code == 2 and "max_num_seqs" in err
    # --replay on a file that does not reach the goal: exit 1.
    code, out, _ = _cli(["counterexample", "thrash", "--replay", str(tmp_path / "s.json")], capsys)
    assert code == 1 and "NOT reached" in out


# --- steps by number: the engine lists no idle step -------------------------------------

# Both requests arrive at step 2, so the run lists no step 0 or 1: r0 (15 tokens,
# chunked prefill off, a budget of 1) never fits and r1 waits behind it forever.
LATE = Scenario("late-arrivals", {"max_num_batched_tokens": 16, "max_num_seqs": 1, "max_model_len": 16,
                                  "block_size": 4, "num_gpu_blocks": 5, "enable_chunked_prefill": False,
                                  "max_num_scheduled_tokens": 1},
                (RequestSpec("r0", 15, arrival_step=2),
                 RequestSpec("r1", 1, arrival_step=2, max_tokens=1, arrival_time=1.0)), max_steps=4)


def later(s: Scenario, shift: int) -> Scenario:
    """The same run, `shift` steps later."""
    return dataclasses.replace(
        s, max_steps=s.max_steps + shift,
        requests=tuple(dataclasses.replace(r, arrival_step=r.arrival_step + shift) for r in s.requests),
        aborts=tuple(dataclasses.replace(a, step=a.step + shift) for a in s.aborts))


def test_a_late_first_arrival_is_judged_by_step_number():
    """Regression: the finders indexed the transitions by step number, so a run whose
    first arrival is after step 0 raised IndexError (reported as "spec raised on a
    drawn scenario") or described the wrong steps."""
    hit = evaluate(LATE, SpecScheduler(), get_goal("liveness:waits-while-fits"), 3)
    assert hit is not None and (hit.requests, hit.first_step, hit.last_step) == (("r1",), 2, 3)
    assert "in step 2 of the cycle" in hit.detail


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_same_run_later_reaches_the_same_goal_later(path):
    s = load_scenario(path)
    name, k = goal_of(s)
    hit = evaluate(s, SpecScheduler(), get_goal(name), k)
    late = evaluate(later(s, 5), SpecScheduler(), get_goal(name), k)
    assert late is not None
    assert (late.requests, late.first_step, late.last_step, late.values) == \
        (hit.requests, hit.first_step + 5, hit.last_step + 5, hit.values)


def test_cli_search_and_replay_with_late_arrivals(tmp_path, monkeypatch, capsys):
    # Seed 11 drew a scenario with late arrivals in its first draws: exit 2, "spec raised ...: IndexError".
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(["counterexample", "liveness:waits-while-fits", "--seed", "11", "--tries", "20",
                           "--shrink-seconds", "2"], capsys)
    assert code == 0, err
    save_scenario(LATE, tmp_path / "late.json")
    code, out, err = _cli(["counterexample", "liveness:waits-while-fits", "--replay", "late.json"], capsys)
    assert code == 0 and "reached" in out, err


class Raises(SpecScheduler):
    name = "raises"

    def schedule(self):
        raise ZeroDivisionError("boom")


def test_a_failure_is_blamed_on_whoever_raised(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ImplementationFailed, match="raises raised on scenario 'late-arrivals': ZeroDivisionError"):
        evaluate(LATE, Raises(), get_goal("stall"), 3)
    with pytest.raises(ImplementationFailed):
        search(get_goal("stall"), 3, Raises(), tries=5)

    def broken(scenario, transitions, k):
        raise IndexError("list index out of range")

    monkeypatch.setitem(GOALS, "stall", dataclasses.replace(GOALS["stall"], find=broken))
    with pytest.raises(GoalFailed) as e:
        evaluate(LATE, SpecScheduler(), get_goal("stall"), 3)
    assert "internal error: goal stall raised" in str(e.value) and "not of spec" in str(e.value)
    code, _, err = _cli(["counterexample", "stall", "--tries", "5"], capsys)
    assert code == 3 and "internal error" in err and "spec raised" not in err
