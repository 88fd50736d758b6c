"""Witnesses that are fixed scenarios replayed on the spec, for the claims whose
property the bounded encoding's BMC (witness.py) cannot reach: a scenario shows
the property applies, and holds, on a real run.

The loop claims' scenarios are files of the scenario format (formats.md) in
witnesses/, package data read by the scenario loader like any other file; each
one's description starts with `fixed_witness_description`'s words, so that
`schedspec prove -o DIR` writes it out as a witness file it recognises.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from schedspec.reference.scenario import Scenario, load_scenario

from .obligation import Result

WITNESS_DIR = Path(__file__).parent / "witnesses"


def load_witness(name: str) -> Scenario:
    """The fixed witness scenario witnesses/<name>.json."""
    return load_scenario(WITNESS_DIR / f"{name}.json")


def fixed_witness_description(what: str) -> str:
    # It starts with cli/prove.py's WITNESS_MARK, so that a rerun of `prove`
    # replaces the file instead of writing a fresh name beside it.
    return ("z3 bounded-model-checking witness file of `schedspec prove` (this one not found by BMC: a fixed "
            f"scenario replayed on the spec): {what}. Reproduce: schedspec check <this file>")


def replay_witness(scenario, prop: str, label: str, shows: Callable[[Any], bool]) -> tuple[Result, Any]:
    """A fixed scenario replayed on the spec as a claim's witness: `prop` must hold
    on every step and apply on a step where `shows(transition)`; `step` is the
    first such step."""
    from schedspec.reference.engine import run_scenario
    from schedspec.reference.impl import SpecScheduler
    from schedspec.spec.properties import PROPERTIES

    t0 = time.perf_counter()
    seen: dict[str, Any] = {label: None, "holds": True}
    check_prop = PROPERTIES[prop].check

    def on_step(t):
        v = check_prop(t.before, t.output, t.after)
        seen["holds"] = seen["holds"] and v.holds
        if v.applicable and seen[label] is None and shows(t):
            seen[label] = t.step

    run_scenario(scenario, SpecScheduler(), on_step=on_step)
    ok = seen["holds"] and seen[label] is not None
    return Result("proved" if ok else "refuted", time.perf_counter() - t0,
                  f"replay on the spec: {seen}", {"step": seen[label]}), scenario
