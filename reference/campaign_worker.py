"""What one campaign worker does (reference/workers.py runs it in this process, in a
local worker process or on a Ray actor): load the two implementations once,
then run one scenario at a time and answer with a plain, JSON-able result.

A result holds everything the campaign merges (steps compared, coverage counts,
time in scheduler calls) and, for a divergence, the divergence and its shrunk
scenario; it holds no file name and prints nothing.  The campaign
(reference/campaign.py) writes files and prints in scenario order, so its
report does not depend on which worker ran what, or when.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import errors
from .loader import load_impl
from schedspec.spec.versions import DEFAULT_RELEASE

from .campaign import (
    CampaignOptions,
    TimedImpl,
    campaign_features,
    close_impl,
    random_scenario,
    run_guarded,
)
from .compare import compare_runs
from .coverage import StepCoverage, add_coverage
from .impl import SpecScheduler
from .scenario import Scenario
from .shrink import shrink



@dataclasses.dataclass
class PairContext:
    """A worker's two implementations, as the campaign's options name them."""

    options: CampaignOptions
    flags: tuple
    a: TimedImpl
    b: TimedImpl

    def close(self) -> None:
        """Close both implementations (vLLM's adapter holds resources)."""
        self.a.close()
        self.b.close()

    def report(self) -> dict[str, float]:
        """Load time per implementation, for the campaign's timing lines."""
        return {self.options.impl: round(getattr(self.a.impl, "load_seconds", 0.0), 2),
                self.options.against: round(getattr(self.b.impl, "load_seconds", 0.0), 2)}


def setup_pair(options: CampaignOptions, flags: tuple, devices: tuple[str | None, str | None],
               announce: bool = False) -> PairContext:
    """Loads `options.impl` and `options.against` (ImplementationError, one
    line, when one cannot be).  `announce`: say so on stderr before a slow load
    (the one worker of a campaign run in its own process; many workers would
    repeat it)."""
    status = errors.status if announce else None
    a = load_impl(options.impl, device=devices[0], status=status)
    try:
        b = load_impl(options.against, device=devices[1], status=status)
    except Exception:
        close_impl(a)
        raise
    return PairContext(options, flags, TimedImpl(a), TimedImpl(b))


def is_spec(impl) -> bool:
    return isinstance(getattr(impl, "impl", impl), SpecScheduler)


def scenario_of(item: tuple, flags: tuple, features: frozenset[str] = frozenset(),
                release: str = DEFAULT_RELEASE) -> tuple[Scenario, bool]:
    """An item is ("random", seed, index) (the worker draws it, for vLLM `release`:
    cheaper than sending it) or ("file", scenario)."""
    if item[0] == "random":
        return random_scenario(item[1], item[2], flags, features, release), True
    return item[1], False


def run_item(ctx: PairContext, item: tuple, heartbeat) -> dict[str, Any]:
    """Both implementations on one scenario: the result the campaign merges."""
    scenario, is_random = scenario_of(item, ctx.flags, campaign_features(ctx.options), ctx.options.release)
    a, b, options = ctx.a, ctx.b, ctx.options
    coverage: dict[str, int] = {}
    # Prefix-cache and async coverage reads the spec's states: b's, or a's when a is the spec.
    observers = [None, None]
    observers[0 if is_spec(a) and not is_spec(b) else 1] = StepCoverage(coverage)
    before = (a.seconds, a.steps, b.seconds, b.steps)
    ta, tb = (run_guarded(scenario, impl, observer) for impl, observer in zip((a, b), observers))
    d = compare_runs(ta, tb, getattr(a, "name", "a"), getattr(b, "name", "b"))
    add_coverage(scenario, tb, coverage)
    result: dict[str, Any] = {
        "scenario": scenario.name,
        "steps": min(len(ta.get("steps", [])), len(tb.get("steps", []))),
        "coverage": coverage,
        "seconds": [a.seconds - before[0], b.seconds - before[2]],
        "calls": [a.steps - before[1], b.steps - before[3]],
    }
    if d is None and "error" in ta and "error" in tb:  # both refused it: nothing was compared
        result["rejected"] = tb["error"]
    if d is not None:
        found: dict[str, Any] = {"divergence": dataclasses.asdict(d)}
        if is_random and options.shrink and d.kind != "crash":
            heartbeat("shrinking")
            small, sd = shrink(scenario, a.impl, b.impl, d, budget_s=options.shrink_seconds)
            found["minimal"] = {"scenario": small.to_json(), "divergence": dataclasses.asdict(sd)}
        result["found"] = found
    return result




# --- one implementation's traces (schedspec sweep --impl spec) ------------------------------------


def setup_one(name: str, device: str | None = None):
    """One implementation, loaded once per worker."""
    return load_impl(name, device=device)


def run_trace(impl, item: tuple[Scenario, bool], heartbeat) -> dict[str, Any]:
    """The trace of `impl` on a scenario (a crash trace if it raises); the
    per-step records only when asked for (they are most of a trace's size)."""
    scenario, keep_steps = item
    trace = run_guarded(scenario, impl)
    if not keep_steps:
        trace = {k: v for k, v in trace.items() if k != "steps"}
    return trace


__all__ = ["PairContext", "is_spec", "run_item", "run_trace", "scenario_of", "setup_one", "setup_pair"]
