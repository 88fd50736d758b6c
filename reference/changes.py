"""The behavioural changelog: scenarios on which two vLLM releases schedule
differently, found on the spec with its version gates (spec/versions.py).

`find_changes(a, b, ...)` runs seeded random scenarios (every engine flag drawn) on
the spec modelling release `a` and on the spec modelling release `b`; a scenario
whose traces differ is labelled with the gate responsible (the adjacent releases
between `a` and `b` whose specs already differ on it), shrunk to the smallest
scenario that still differs, and kept, one per distinct rule change.  Whether the
real releases agree with the spec on that scenario is the differential tester's
question: `schedspec diff --impl vllm==A FILE` and `--impl vllm==B FILE`
(cli/changes.py `--confirm` runs both).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from schedspec.spec import versions
from schedspec.spec.config import ConfigError, config_as_given, validate_config
from schedspec.spec.versions import GATES, RELEASES, Gate, gates_between, release_key

from .compare import compare_traces
from .engine import run_scenario
from .impl import SpecScheduler
from .scenario import Scenario
from .shrink import shrink_while


class ReleaseSpec(SpecScheduler):
    """The spec modelling vLLM release `version`, whatever release a scenario names."""

    def __init__(self, version: str) -> None:
        super().__init__()
        self.version = version
        self.name = f"spec@{version}"

    def reset(self, config) -> None:
        super().reset(dataclasses.replace(config, vllm_version=self.version))


def valid_in(scenario: Scenario, version: str) -> bool:
    """Is the scenario's config one release `version` accepts?"""
    try:
        validate_config(dataclasses.replace(scenario.config, vllm_version=version))
        return True
    except ConfigError:
        return False


def releases_from(a: str, b: str) -> list[str]:
    lo, hi = sorted((a, b), key=release_key)
    return [r for r in RELEASES if release_key(lo) <= release_key(r) <= release_key(hi)]


def traces_differ(scenario: Scenario, a: str, b: str):
    """The first difference between the spec's traces at releases a and b, or None."""
    return compare_traces(run_scenario(scenario, ReleaseSpec(a)), run_scenario(scenario, ReleaseSpec(b)))


def responsible_gates(scenario: Scenario, a: str, b: str) -> tuple[str, ...]:
    """The gates of the adjacent release pairs between a and b whose specs differ
    on `scenario`: where, release by release, the behaviour changes."""
    chain = releases_from(a, b)
    found: list[str] = []
    for lo, hi in zip(chain, chain[1:]):
        if traces_differ(scenario, lo, hi) is not None:
            found += gates_making_the_difference(scenario, hi, [g.name for g in gates_between(lo, hi)])
    return tuple(found)


def gates_making_the_difference(scenario: Scenario, release: str, gates: list[str]) -> list[str]:
    """Of the `gates` of `release`, those that alone change the spec's trace of `scenario`
    when reverted; all of them when none does alone (the change needs them together)."""
    if len(gates) <= 1:
        return gates
    trace = run_scenario(scenario, ReleaseSpec(release))
    alone = []
    for g in gates:
        with versions.reverted(g):
            if compare_traces(trace, run_scenario(scenario, ReleaseSpec(release))) is not None:
                alone.append(g)
    return alone or gates


@dataclasses.dataclass
class Change:
    gates: tuple[str, ...]  # the rule change(s) responsible
    scenario: Scenario  # the smallest scenario found, config without vllm_version
    found_in: str  # the random scenario it was shrunk from
    step: int | None  # the first step the releases differ at
    field: str
    values: tuple[Any, Any]  # release a's and release b's value there


def find_changes(a: str, b: str, *, scenarios: int, seed: int, shrink_seconds: float = 60.0,
                 progress: Callable[[int, int], None] | None = None) -> list[Change]:
    """One Change per distinct set of responsible gates, in the order found."""
    from .generator import FLAGS_ALL, features_in, generate_scenario, scenario_rng

    spec_a, spec_b = ReleaseSpec(a), ReleaseSpec(b)
    # Every feature the older release's spec models is drawn: a rule of a feature changes too.
    features = features_in(min(a, b, key=release_key))
    changes: dict[tuple[str, ...], Change] = {}
    for i in range(scenarios):
        if progress:
            progress(i, scenarios)
        s = dataclasses.replace(generate_scenario(scenario_rng(seed, i), i, FLAGS_ALL, features=features),
                                name=f"random-s{seed}-{i}")
        if not (valid_in(s, a) and valid_in(s, b)):
            continue
        d = compare_traces(run_scenario(s, spec_a), run_scenario(s, spec_b))
        if d is None:
            continue
        gates = responsible_gates(s, a, b)
        if gates in changes:
            continue

        def still(c: Scenario, gates=gates):
            if not (valid_in(c, a) and valid_in(c, b)):
                return None
            found = compare_traces(run_scenario(c, spec_a), run_scenario(c, spec_b))
            return found if found is not None and found.kind == d.kind and \
                responsible_gates(c, a, b) == gates else None

        small, sd, _ = shrink_while(s, still, d, last_step=lambda x: x.step, budget_s=shrink_seconds)
        changes[gates] = Change(gates, small, s.name, sd.step, sd.field, (sd.a, sd.b))
    return list(changes.values())


def describe(change: Change, a: str, b: str) -> str:
    gates = [GATES[g] for g in change.gates]
    where = f"step {change.step}, " if change.step is not None else ""
    return (f"{' + '.join(g.name for g in gates)}: vLLM {a} and {b} first differ at {where}field "
            f"{change.field} ({a}: {change.values[0]!r}; {b}: {change.values[1]!r}). "
            f"Shrunk from {change.found_in}.")


def gate_lines(gate: Gate) -> str:
    return f"**{gate.name}** (from {gate.since}): {gate.rule} Source: {gate.source}."


__all__ = ["Change", "ReleaseSpec", "describe", "find_changes", "gate_lines", "releases_from", "render_markdown", "responsible_gates",
           "traces_differ", "valid_in"]


def config_changes(a: str, b: str) -> list[str]:
    """The config checks that change between releases a < b (spec/versions.py)."""
    from schedspec.spec.versions import CHECKS_SINCE, FIELDS_SINCE, MINIMUM_SINCE

    out = []
    between = lambda r: release_key(a) < release_key(r) <= release_key(b)  # noqa: E731
    for name, (since, absent, source) in FIELDS_SINCE.items():
        if between(since):
            out.append(f"new field `{name}` (before: absent, i.e. {absent!r}; {source})")
    for name, steps in MINIMUM_SINCE.items():
        for since, bound in steps:
            if between(since):
                out.append(f"`{name}` must be >= {bound} (before: "
                           f"{'no bound' if steps[0][0] == since else steps[steps.index((since, bound)) - 1][1]})")
    for name, (since, source) in CHECKS_SINCE.items():
        if between(since):
            out.append(f"new check `{name}` ({source})")
    return out


def render_markdown(scenario_dir) -> str:
    """docs/changes.md: for each pair of adjacent releases, the rules that changed
    (the gates), each with its vLLM source lines and its minimal scenario from
    `scenario_dir`/<gate>.json (the spec at both releases, step by step where
    they first differ).  A function of the gates and those files alone, so CI can
    check the checked-in file is current (tests/test_versions.py)."""
    import json
    from pathlib import Path

    from .scenario import load_scenario

    d = Path(scenario_dir)
    lines = [f"# Behavioural changelog of vLLM's V1 scheduler, {RELEASES[0]} to {RELEASES[-1]}", "",
             "Generated by `schedspec changes --adjacent --markdown docs/changes.md -o docs/changes` "
             "from the version gates (spec/versions.py) and their minimal scenarios "
             "(docs/changes/<gate>.json); do not edit by hand.  Each scenario is replayable on both "
             "real releases: `schedspec diff --impl vllm==X docs/changes/<gate>.json` agrees with the "
             "spec for X = either release (`schedspec changes A B --confirm`).", ""]
    for a, b in zip(RELEASES, RELEASES[1:]):
        gates = gates_between(a, b)
        lines += [f"## {a} -> {b}", ""]
        config = config_changes(a, b)
        if config:
            lines += ["Config checks: " + "; ".join(config) + ".", ""]
        if not gates:
            lines += [f"Scheduling rules: no change found (`schedspec diff --impl vllm=={b}` and "
                      f"`--impl vllm=={a}` both agree with the spec, whose rules are the same at both).", ""]
        for g in gates:
            lines += [f"### `{g.name}`", "", g.rule, "", f"Source: {g.source}.", ""]
            path = d / f"{g.name}.json"
            if not path.is_file():
                lines += ["(no scenario yet)", ""]
                continue
            s = load_scenario(path)
            d_ab = traces_differ(s, a, b)
            cfg = json.dumps(config_as_given(s.config), sort_keys=True)
            lines += [f"Scenario `docs/changes/{path.name}` ({len(s.requests)} request(s), {s.max_steps} "
                      f"step(s)): config `{cfg}`.", ""]
            if d_ab is not None:
                where = f"step {d_ab.step}, " if d_ab.step is not None else ""
                lines += [f"First difference at {where}`{d_ab.field}`: {a} gives `{json.dumps(d_ab.a)}`, "
                          f"{b} gives `{json.dumps(d_ab.b)}`.", ""]
            else:
                lines += ["(the spec gives the same trace at both releases: the scenario is stale)", ""]
    return "\n".join(lines).rstrip() + "\n"
