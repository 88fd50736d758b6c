"""The versioned spec (spec/versions.py): the release a config models, its config
checks, each version gate on the scenario that shows it, and the command line's
`--vllm-version` / `--impl vllm==X` handling.  No vLLM needed: the releases' own
runs are tests/test_vllm_releases.py."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schedspec.cli.vllm_version import requested_release, split_impl
from schedspec.reference.engine import run_scenario
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import load_scenario
from schedspec.spec import versions
from schedspec.spec.config import CONFIG_TABLE, ConfigError, SchedulerConfig, config_as_given, config_from_dict, validate_config

ROOT = Path(__file__).resolve().parents[1]
CHANGES = ROOT / "docs" / "changes"


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "schedspec", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def trace_on(path: Path, release: str) -> dict:
    scenario = load_scenario(path)
    scenario = dataclasses.replace(scenario, config={**config_as_given(scenario.config), "vllm_version": release})
    return run_scenario(scenario, SpecScheduler())


def step(trace: dict, k: int) -> dict:
    return next(s for s in trace["steps"] if s["step"] == k)


# --- the release a config models ------------------------------------------------------------


def test_the_default_release_is_the_newest_and_every_gate_is_in_force():
    c = SchedulerConfig()
    assert c.vllm_version == versions.DEFAULT_RELEASE == versions.RELEASES[-1] == "0.34.0"
    assert all(versions.has(c, g) for g in versions.GATES)


def test_a_gate_is_off_exactly_before_its_release():
    for gate in versions.GATES.values():
        for release in versions.RELEASES:
            expected = versions.release_key(release) >= versions.release_key(gate.since)
            assert versions.has(release, gate.name) is expected, (gate.name, release)
        assert gate.source and gate.rule


def test_gates_between_adjacent_releases_partition_the_gates():
    pairs = list(zip(versions.RELEASES, versions.RELEASES[1:]))
    seen = [g.name for a, b in pairs for g in versions.gates_between(a, b)]
    assert sorted(seen) == sorted(versions.GATES)  # each gate changes between exactly one pair
    assert versions.gates_between("0.33.0", "0.33.0") == []


def test_an_unknown_release_is_refused_naming_the_field():
    with pytest.raises(ConfigError) as e:
        config_from_dict({"vllm_version": "0.29.0"})
    assert e.value.field == "config.vllm_version" and "0.29.0" in str(e.value)
    with pytest.raises(ConfigError) as e:
        config_from_dict({"vllm_version": 33})
    assert e.value.field == "config.vllm_version" and "string" in str(e.value)


def test_max_num_scheduled_tokens_0_is_accepted_only_before_0_32_0():
    assert config_from_dict({"max_num_scheduled_tokens": 0, "vllm_version": "0.31.0"}).token_budget == 0
    for release in ("0.32.0", "0.33.0"):
        with pytest.raises(ConfigError) as e:
            config_from_dict({"max_num_scheduled_tokens": 0, "vllm_version": release})
        assert e.value.field == "config.max_num_scheduled_tokens"


def test_fields_a_release_lacks_are_refused_unless_they_say_its_behaviour():
    for name, (since, absent, _) in versions.FIELDS_SINCE.items():
        older = versions.RELEASES[versions.RELEASES.index(since) - 1]
        # Left out, the field means the older behaviour.
        assert getattr(config_from_dict({"vllm_version": older}), name) == absent
        assert getattr(config_from_dict({name: absent, "vllm_version": older}), name) == absent
        other = (not absent) if isinstance(absent, bool) else (0.25 if absent == 0.5 else 0.5) \
            if isinstance(absent, float) else 1
        with pytest.raises(ConfigError) as e:
            validate_config(dataclasses.replace(SchedulerConfig(vllm_version=older), **{name: other}))
        assert e.value.field == f"config.{name}" and since in str(e.value)
        config_from_dict({name: other, "vllm_version": since})  # the release that has it takes it


# --- each gate on the scenario that shows it ------------------------------------------------


def test_every_gate_has_its_scenario_and_the_scenario_tells_the_releases_apart():
    for gate in versions.GATES.values():
        path = CHANGES / f"{gate.name}.json"
        assert path.is_file(), f"gate {gate.name} has no scenario {path}"
        before = versions.RELEASES[versions.RELEASES.index(gate.since) - 1]
        assert trace_on(path, before)["steps"] != trace_on(path, gate.since)["steps"], gate.name


def test_priority_self_preemption_continues_from_0_33_0():
    # What vLLM 0.33.0 and 0.32.0 did on this scenario (tests/test_vllm_releases.py replays it).
    path = CHANGES / "priority_self_preemption_continues.json"
    new, old = step(trace_on(path, "0.33.0"), 3), step(trace_on(path, "0.32.0"), 3)
    assert new["preempted"] == old["preempted"] == ["r0"]
    assert new["scheduled"] == [["r1", 1]]
    assert old["scheduled"] == []


# --- the command line ----------------------------------------------------------------------


def test_impl_names_and_requested_releases():
    assert split_impl("vllm==0.30.0") == ("vllm", "0.30.0")
    assert split_impl("spec") == ("spec", None)
    assert requested_release(["diff", "--impl", "vllm==0.31.0", "x.json"]) == "0.31.0"
    assert requested_release(["diff", "--against=vllm==0.25.0"]) == "0.25.0"
    assert requested_release(["diff", "--impl", "vllm", "--against", "spec"]) is None


def test_scenarios_without_a_release_take_the_commands(tmp_path):
    path = CHANGES / "priority_self_preemption_continues.json"
    assert load_scenario(path, "0.32.0").config.vllm_version == "0.32.0"
    assert load_scenario(path).config.vllm_version == versions.DEFAULT_RELEASE
    data = json.loads(path.read_text())
    data["config"]["vllm_version"] = "0.31.0"
    (tmp_path / "s.json").write_text(json.dumps(data))
    # A release the file names is its own, whatever the reader is given.
    assert load_scenario(tmp_path / "s.json", "0.32.0").scheduler_config().vllm_version == "0.31.0"
    # Written back, a scenario names its release unless it is the newest (the default).
    assert load_scenario(path, "0.32.0").to_json()["config"]["vllm_version"] == "0.32.0"
    assert "vllm_version" not in load_scenario(path).to_json()["config"]


def test_cli_vllm_version_selects_the_spec_release():
    path = str(CHANGES / "priority_self_preemption_continues.json")
    new = run_cli("run", path, "--timeline", "all")
    old = run_cli("run", path, "--timeline", "all", "--vllm-version", "0.32.0")
    assert new.returncode == old.returncode == 0, new.stderr + old.stderr
    line = lambda out: next(x for x in out.splitlines() if x.startswith("step    3"))  # noqa: E731
    assert "r1:1" in line(new.stdout) and "r1:1" not in line(old.stdout)


@pytest.mark.parametrize("args, words", [
    (("validate", "table3-b16", "--vllm-version", "0.29.0"), ("--vllm-version", "0.29.0", "0.33.0")),
    (("run", "table3-b16", "--impl", "vllm==0.19.0"), ("--impl vllm==0.19.0", "not a vLLM release")),
])
def test_cli_refuses_unknown_releases_in_one_line(args, words):
    p = run_cli(*args)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert all(w in p.stderr for w in words), p.stderr
    assert "Traceback" not in p.stderr


def test_a_vllm_not_modelled_runs_against_the_newest_modelled_release_at_or_below_it(tmp_path):
    f = versions.spec_release_for
    assert f("0.34.0") == "0.34.0" and f("0.33.0") == "0.33.0"
    assert f("0.34.1.dev12+gabc123") == f("0.34.0.post1") == f("0.35.0") == "0.34.0"
    assert f("0.35.0rc1") == "0.34.0" and f("0.34.0rc2") == "0.33.0" and f("0.33.5") == "0.33.0"
    assert f("0.19.0") is None and f("main") is None
    # A later release: not refused as unknown, but its environment is asked for, in one line.
    p = run_cli("diff", "--impl", "vllm==0.99.0", "table3-b16", env={"SCHEDSPEC_CACHE": str(tmp_path)})
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "schedspec install-vllm --version 0.99.0" in p.stderr


def test_cli_names_the_install_command_when_a_release_env_is_missing(tmp_path):
    p = run_cli("diff", "--impl", "vllm==0.30.0", "table3-b16", env={"SCHEDSPEC_CACHE": str(tmp_path)})
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "schedspec install-vllm --version 0.30.0" in p.stderr and "0.30.0" in p.stderr


def test_cli_refuses_two_releases_in_one_command(tmp_path):
    """A usage error whatever is installed: said before any release's environment
    is asked for (an empty cache folder has none)."""
    for env in (None, {"SCHEDSPEC_CACHE": str(tmp_path)}):
        for flag in (["--vllm-version", "0.31.0"], ["--vllm-version=0.31.0"]):
            p = run_cli("run", "table3-b16", *flag, "--impl", "vllm==0.33.0", env=env)
            assert p.returncode == 2 and "0.31.0 and 0.33.0" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_long_prefill_threshold_above_max_model_len_is_refused_from_0_28_0():
    raw = {"long_prefill_token_threshold": 9000, "max_model_len": 8192}
    for release in ("0.20.0", "0.25.0"):
        assert config_from_dict({**raw, "vllm_version": release}).long_prefill_token_threshold == 9000
    for release in ("0.28.0", "0.33.0"):
        with pytest.raises(ConfigError) as e:
            config_from_dict({**raw, "vllm_version": release})
        assert e.value.field == "config.long_prefill_token_threshold"


def test_negative_bounds_only_in_0_20_0():
    assert config_from_dict({"long_prefill_token_threshold": -1, "vllm_version": "0.20.0"})
    with pytest.raises(ConfigError):
        config_from_dict({"long_prefill_token_threshold": -1, "vllm_version": "0.25.0"})


def test_docs_changes_md_is_generated_from_the_gates_and_their_scenarios():
    from schedspec.reference.changes import render_markdown

    assert (ROOT / "docs" / "changes.md").read_text() == render_markdown(CHANGES), \
        "regenerate: schedspec changes --adjacent --markdown docs/changes.md -o docs/changes (or render_markdown)"
    text = render_markdown(CHANGES)
    assert all(f"`{g}`" in text for g in versions.GATES) and "stale" not in text


def test_changes_finds_the_gate_between_two_releases_on_the_spec(tmp_path):
    from schedspec.reference.changes import find_changes

    found = find_changes("0.25.0", "0.28.0", scenarios=40, seed=1, shrink_seconds=5)
    assert [c.gates for c in found] == [("input_budget",)]
    assert find_changes("0.31.0", "0.32.0", scenarios=40, seed=1, shrink_seconds=5) == []


def test_install_vllm_refuses_an_unknown_release_in_one_line():
    p = run_cli("install-vllm", "--version", "0.19.0")  # older than every modelled release
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "--version" in p.stderr, p.stderr


def test_install_vllm_is_idempotent_for_an_installed_release():
    from schedspec.cli.vllm_version import env_python
    from schedspec.monitor.peer_environment import foreign_schedspec

    # Only an environment that already runs this checkout: install-vllm points the one it
    # is given at the schedspec that runs it, and a test must not re-point a user's.
    installed = [r for r in versions.RELEASES[:-1] if env_python(r).exists() and not foreign_schedspec(str(env_python(r)))]
    if not installed:
        pytest.skip("no release environment installed that runs this checkout (schedspec install-vllm --version X)")
    p = run_cli("install-vllm", "--version", installed[0])
    assert p.returncode == 0 and "already installed" in p.stdout, p.stdout + p.stderr


def violations_on(release: str, n: int, seed: int = 3) -> dict[str, int]:
    """Property violations of the spec modelling `release` on n random scenarios it accepts."""
    from schedspec.reference.changes import ReleaseSpec, valid_in
    from schedspec.reference.generator import FLAGS_ALL, generate_scenario, scenario_rng
    from schedspec.spec.properties import check_step

    found: dict[str, int] = {}

    def on_step(t) -> None:
        for name, verdict in check_step(t.before, t.output, t.after).items():
            if not verdict.holds:
                found[name] = found.get(name, 0) + 1

    for i in range(n):
        s = generate_scenario(scenario_rng(seed, i), i, FLAGS_ALL)
        if valid_in(s, release):
            run_scenario(s, ReleaseSpec(release), on_step=on_step)
    return found


@pytest.mark.parametrize("release", versions.RELEASES)
def test_properties_per_release(release):
    """Every property holds on the spec modelling each release, but one: before 0.28.0 a
    step can grant more than max_num_batched_tokens (no input budget), a vLLM bug that
    0.28.0 fixed (docs/changes/input_budget.json replays it on the real 0.25.0)."""
    found = violations_on(release, 120)
    if versions.has(release, versions.INPUT_BUDGET):
        assert found == {}
    else:
        assert set(found) <= {"token_budget_respected"}
    path = CHANGES / "input_budget.json"
    bad = violations_on_file(path, release)
    assert ("token_budget_respected" in bad) is not versions.has(release, versions.INPUT_BUDGET)


def violations_on_file(path: Path, release: str) -> set[str]:
    from schedspec.reference.changes import ReleaseSpec
    from schedspec.spec.properties import check_step

    bad: set[str] = set()
    run_scenario(load_scenario(path), ReleaseSpec(release),
                 on_step=lambda t: bad.update(n for n, v in check_step(t.before, t.output, t.after).items()
                                              if not v.holds))
    return bad


@pytest.mark.parametrize("args, words", [
    (("changes", "0.30.0", "0.30.0"), ("both 0.30.0",)),
    (("changes", "0.30.0", "0.29.0"), ("B", "0.29.0")),
    (("changes", "0.30.0"), ("two releases",)),
    (("changes", "--adjacent", "0.30.0"), ("not both",)),
])
def test_changes_refuses_bad_releases_in_one_line(args, words):
    p = run_cli(*args)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert all(w in p.stderr for w in words) and "Traceback" not in p.stderr, p.stderr


def test_changes_writes_one_replayable_scenario_per_rule_change(tmp_path):
    p = run_cli("changes", "0.30.0", "0.31.0", "--scenarios", "40", "--seed", "1", "--shrink-seconds", "5",
                "-o", str(tmp_path), "--json-out", str(tmp_path / "r.json"))
    assert p.returncode == 0, p.stderr
    report = json.loads((tmp_path / "r.json").read_text())["changes"]
    assert [c["gates"] for c in report] == [["long_prefill_threshold_needs_two"]]
    path = tmp_path / "long_prefill_threshold_needs_two.json"
    assert trace_on(path, "0.30.0")["steps"] != trace_on(path, "0.31.0")["steps"]


def test_generated_scenarios_draw_only_the_fields_their_release_has():
    # Older releases lack some fields: the generator leaves them out instead of
    # drawing scenarios the release refuses, and changes nothing else.
    from schedspec.reference.generator import FLAGS_ALL, generate_scenario, scenario_rng

    dropped = 0
    for release in versions.RELEASES:
        lacking = versions.fields_lacking(release)
        for i in range(300):
            newest = generate_scenario(scenario_rng(5, i), i, FLAGS_ALL)
            s = generate_scenario(scenario_rng(5, i), i, FLAGS_ALL, release)
            config_from_dict({**config_as_given(s.config), "vllm_version": release})  # raises if refused
            # and the drafter rows a release accepts (a parallel drafter's, before 0.34.0)
            rows = "max_num_new_slots_for_drafting"
            for name, row in CONFIG_TABLE.items():
                if name not in (rows, "vllm_version"):  # a field the release lacks is at its default
                    assert getattr(s.config, name) == (row.default if name in lacking else getattr(newest.config, name))
            assert s.config.vllm_version == release
            assert (s.requests, s.aborts, s.max_steps) == (newest.requests, newest.aborts, newest.max_steps)
            dropped += any(getattr(newest.config, name) != CONFIG_TABLE[name].default for name in lacking)
    assert dropped > 0  # the check saw scenarios that needed a field dropped
    assert versions.fields_lacking("0.20.0") == {"max_num_active_seqs", "watermark", "cache_aware_admission_window",
                                                 "cache_aware_admission_threshold"}
    assert versions.fields_lacking(versions.DEFAULT_RELEASE) == frozenset()
