"""Differential campaigns: run two implementations over scenarios (files or seeded
random ones), compare their traces, record coverage, and write (and shrink)
every diverging scenario, never overwriting a file.

A campaign is described by a `CampaignOptions` (plain values; the command line,
cli/diff.py, builds one from its flags) and run by `run_campaign` (any two
implementations, one scenario at a time) or gpu/campaign.py
`run_batched_campaign` (torch against the spec, whole batches at a time); both
report divergences through `report_divergence`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from schedspec.base.errors import UsageError, shown
from schedspec.base.progress import Progress
from schedspec.spec.config import ConfigError, SchedulerConfig, config_from_dict

from .compare import Divergence, compare_runs
from .coverage import StepCoverage, add_coverage
from .engine import run_scenario
from .example_files import resolve_scenario_path
from .impl import SpecScheduler
from .scenario import Scenario, ScenarioError, load_scenario, save_scenario
from .shrink import shrink


@dataclasses.dataclass(frozen=True)
class CampaignOptions:
    """What a campaign needs besides the implementations themselves.

    `impl` and `against`: the two implementations' names as `--impl` takes them
    (reports, messages and the reproduce command name them so); `seed` and
    `num_scenarios`: the random scenarios (None or 0: none); `configs`: how many
    random configs the config-agreement check draws (None: no check); `flags`:
    the engine-flag combinations random scenarios draw (reference/generator.py;
    None: the default for the pair, see `campaign_flags`); `device`: where torch
    runs (None: its default), also named in the reproduce command; `batch_size`:
    scenarios torch steps at once in the batched campaign (None: its default);
    `out_dir`: where diverging scenarios are written; `shrink` and
    `shrink_seconds`: whether a diverging random scenario is shrunk, and the time
    budget for one; `quiet`: print nothing on the output stream (the caller
    prints the returned report, e.g. as JSON)."""

    impl: str
    against: str = "spec"
    seed: int = 0
    num_scenarios: int | None = None
    configs: int | None = None
    flags: tuple[tuple[bool, bool], ...] | None = None
    device: str | None = None
    batch_size: int | None = None
    out_dir: Path = Path("divergences")
    shrink: bool = True
    shrink_seconds: float = 120.0
    quiet: bool = False


class TimedImpl:
    """Wraps an implementation and adds up the time spent in its scheduler
    calls (add_request, finish_requests, schedule, update_from_output);
    construction (reset) and state read-back (observe) are not counted.
    `impl` is the wrapped implementation, `name` its name, `seconds` the time,
    `steps` the schedule() calls."""

    def __init__(self, impl):
        self.impl = impl
        self.name = getattr(impl, "name", type(impl).__name__)
        self.seconds = 0.0
        self.steps = 0

    def _timed(self, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t

    def reset(self, config):
        return self.impl.reset(config)

    def add_request(self, request):
        return self._timed(self.impl.add_request, request)

    def finish_requests(self, ids, status):
        return self._timed(self.impl.finish_requests, ids, status)

    def schedule(self):
        self.steps += 1
        return self._timed(self.impl.schedule)

    def update_from_output(self, output, sampled):
        return self._timed(self.impl.update_from_output, output, sampled)

    def observe(self):
        return self.impl.observe()

    def close(self):
        close_impl(self.impl)


def close_impl(impl) -> None:
    """Call `impl.close()` if the implementation has one (vLLM's adapter does)."""
    close = getattr(impl, "close", None)
    if close:
        close()


def crash_trace(scenario: Scenario, impl, e: BaseException) -> dict[str, Any]:
    """The trace of a run that raised `e`: no steps, and the exception as `crash`."""
    return {"scenario": scenario.name, "implementation": getattr(impl, "name", "?"), "steps": [],
            "crash": f"{type(e).__name__}: {e}"}


def run_guarded(scenario: Scenario, impl, on_step=None) -> dict[str, Any]:
    """run_scenario, where an implementation that raises gives its crash trace
    (a divergence to report with the scenario, not the end of the campaign)."""
    try:
        return run_scenario(scenario, impl, on_step=on_step)
    except Exception as e:  # noqa: BLE001 - report it with the scenario
        return crash_trace(scenario, impl, e)


def _is_spec(impl) -> bool:
    return isinstance(getattr(impl, "impl", impl), SpecScheduler)


def _run_pair(scenario: Scenario, a, b, on_step=(None, None)) -> tuple[dict, dict, Divergence | None]:
    """Both runs (`on_step`: the engine observers of a's run and of b's) and
    their first divergence, a crash included."""
    ta, tb = (run_guarded(scenario, impl, observer) for impl, observer in zip((a, b), on_step))
    return ta, tb, compare_runs(ta, tb, getattr(a, "name", "a"), getattr(b, "name", "b"))


def safe_stem(name: str, limit: int = 80) -> str:
    """A scenario name made into a file name that stays inside its folder: only
    letters, digits, `.`, `_` and `-`; no leading dot (`..`, hidden files); at
    most `limit` characters (names longer than 255 bytes fail with "File name
    too long").  A changed name gets a short hash of the original so that two
    names never map to the same file stem by accident."""
    import hashlib
    import re

    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).lstrip(".") or "scenario"
    if stem != name or len(stem) > limit:
        digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        stem = f"{stem[:limit - 9]}-{digest}"
    return stem


def _unique_path(directory: Path, stem: str) -> Path:
    """directory/<safe stem>.json, or -2, -3, ... before .json: a file that does not exist yet."""
    stem = safe_stem(stem)
    p = directory / f"{stem}.json"
    k = 2
    while p.exists():
        p = directory / f"{stem}-{k}.json"
        k += 1
    return p


def repro_command(options: CampaignOptions, path: Path) -> str:
    """The command that reruns the campaign's two implementations on `path`."""
    cmd = f"schedspec diff --impl {options.impl}"
    if options.against != "spec":
        cmd += f" --against {options.against}"
    if options.device:
        cmd += f" --device {options.device}"
    return f"{cmd} {path}"


def load_scenario_files(paths: Iterable[str]) -> list[tuple[Scenario, bool]]:
    """(scenario, False) per file (or shipped example's name); a UsageError for
    one that cannot be read."""
    out = []
    for f in paths:
        try:
            out.append((load_scenario(resolve_scenario_path(f)), False))
        except ScenarioError as e:
            raise UsageError(str(e)) from None
    return out


def random_scenarios(num_scenarios: int | None, seed: int,
                     flags: Sequence[tuple[bool, bool]] | None = None) -> Iterator[tuple[Scenario, bool]]:
    """(scenario, True) for the random scenarios 0 .. num_scenarios - 1 of `seed`,
    drawing the engine-flag combinations `flags` (reference/generator.py; None:
    none, as torch campaigns need).  Each one's description says how to draw it again."""
    if not num_scenarios:
        return
    from .generator import FLAG_NAMES, FLAGS_ALL, FLAGS_OFF, generate_scenario, scenario_rng

    flags = flags or FLAGS_OFF
    # The flags drawn change the scenario of an index: say which were drawn.
    which = (" --flags all, not with torch" if flags == FLAGS_ALL
             else " --flags " + ",".join(n for n, f in FLAG_NAMES.items() if f in flags))
    for i in range(num_scenarios):
        s = generate_scenario(scenario_rng(seed, i), i, flags)
        yield dataclasses.replace(
            s, name=f"random-s{seed}-{i}",
            description=f"random scenario {i} of seed {seed} (schedspec diff --scenarios N --seed "
                        f"{seed}{which}, N > {i})"), True


def campaign_flags(options: CampaignOptions):
    """The engine-flag combinations random scenarios draw: `options.flags`, else
    every combination unless torch, which models neither flag, takes part.
    Asking torch for a flag is a user error."""
    from .generator import FLAGS_OFF, IMPLS_WITHOUT_FLAGS, flags_for

    impls = (options.impl, options.against)
    if options.flags is None:
        return flags_for(*impls)
    without = sorted(IMPLS_WITHOUT_FLAGS.intersection(impls))
    if without and options.flags != FLAGS_OFF:
        raise UsageError(f"--flags: {without[0]} models neither prefix caching nor async scheduling; "
                         "use --flags sync")
    return options.flags


def _accepts(impl_name: str, impl, raw: dict[str, Any]) -> tuple[bool, str]:
    if impl_name == "spec":
        try:
            config_from_dict(raw)
            return True, ""
        except ConfigError as e:
            return False, str(e)
    try:
        cfg = SchedulerConfig(**{k: (float(v) if k == "watermark" else v) for k, v in raw.items()})
        impl.reset(cfg)
        return True, ""
    except (ConfigError, ValueError) as e:
        return False, str(e)


def run_config_agreement(options: CampaignOptions, impl_a, impl_b, out) -> dict[str, Any]:
    """`options.configs` random configs near vLLM's acceptance boundaries (seed
    `options.seed`): does each implementation accept each one?  The counts and
    every disagreement."""
    from .generator import config_rng, generate_config_dict

    n, a_name, b_name = options.configs or 0, options.impl, options.against
    res = {"configs": options.configs, "both_accept": 0, "both_reject": 0, "disagreements": []}
    progress = Progress("configs", n)
    try:
        for i in range(n):
            rng = config_rng(options.seed, i)
            raw = generate_config_dict(rng, valid_bias=0.5)
            ok_a, why_a = _accepts(a_name, impl_a, raw)
            ok_b, why_b = _accepts(b_name, impl_b, raw)
            if ok_a and ok_b:
                res["both_accept"] += 1
            elif not ok_a and not ok_b:
                res["both_reject"] += 1
            else:
                res["disagreements"].append({"index": i, "config": raw,
                                             a_name: why_a or "accepts", b_name: why_b or "accepts"})
                if not options.quiet:
                    print(f"CONFIG DISAGREEMENT (config {i} of seed {options.seed}): {json.dumps(raw)}", file=out)
                    print(f"  {a_name}: {why_a or 'accepts'}", file=out)
                    print(f"  {b_name}: {why_b or 'accepts'}", file=out)
            progress(i + 1, n)
    finally:
        progress.close()
    return res


def campaign_source(options: CampaignOptions, files: list[tuple[Scenario, bool]],
                    flags: Sequence[tuple[bool, bool]] | None) -> tuple[int, Iterable[tuple[Scenario, bool]]]:
    """How many scenarios a campaign runs, and them in order: `files` if any,
    else `options.num_scenarios` random ones drawing `flags`."""
    total = len(files) + (options.num_scenarios or 0)
    return total, (files if files else random_scenarios(options.num_scenarios, options.seed, flags))


def print_campaign_report(res: dict[str, Any], elapsed: float, timing: str, out) -> None:
    """A campaign's closing lines: the totals, `timing` (the time per step as
    the campaign measured it) and the coverage counters."""
    print(f"scenarios: {res['scenarios']}  steps compared: {res['steps_compared']}  divergences: "
          f"{len(res['divergences'])}  time: {elapsed:.1f} s", file=out)
    print(timing, file=out)
    if res["coverage"]:
        print("coverage: " + ", ".join(f"{k} {v}" for k, v in res["coverage"].items()), file=out)


def run_campaign(options: CampaignOptions, files: list[tuple[Scenario, bool]], a: TimedImpl, b: TimedImpl,
                 out) -> dict[str, Any]:
    """Runs `a` against `b` on `files` (from load_scenario_files), or when there
    are none on `options.num_scenarios` random scenarios, one at a time; writes
    and reports each divergence (report_divergence).  The report: `scenarios`,
    `steps_compared`, `divergences`, `ms_per_step` (per implementation, in its
    scheduler calls), `seconds`, `coverage`."""
    total, source = campaign_source(options, files, campaign_flags(options))
    progress = Progress("diff", total, min_total=20)
    divergences = []
    steps = 0
    coverage: dict[str, int] = {}
    t0 = time.monotonic()
    # Prefix-cache and async coverage reads the spec's states: b's, or a's when a is the spec.
    observed = 0 if _is_spec(a) and not _is_spec(b) else 1
    try:
        for k, (scenario, is_random) in enumerate(source, 1):
            observers = [None, None]
            observers[observed] = StepCoverage(coverage)
            ta, tb, d = _run_pair(scenario, a, b, tuple(observers))
            steps += min(len(ta.get("steps", [])), len(tb.get("steps", [])))
            add_coverage(scenario, tb, coverage)
            if d is not None:
                progress.close() if progress.enabled else None
                divergences.append(report_divergence(options, scenario, is_random, d, a.impl, b.impl, out))
            progress(k, total)
    finally:
        progress.close()
    elapsed = time.monotonic() - t0
    per_step = {x.name: (1000.0 * x.seconds / x.steps if x.steps else None) for x in (a, b)}
    res = {
        "scenarios": total,
        "steps_compared": steps,
        "divergences": divergences,
        "ms_per_step": per_step,
        "seconds": round(elapsed, 1),
        "coverage": dict(sorted(coverage.items())),
    }
    if not options.quiet:
        pa, pb = per_step[a.name], per_step[b.name]
        ratio = f"  ({a.name}/{b.name} = {pa / pb:.1f}x)" if pa and pb else ""
        fmt = lambda x: f"{x:.3f} ms" if x is not None else "-"  # noqa: E731
        print_campaign_report(res, elapsed, f"time per step in scheduler calls: {a.name} {fmt(pa)}, "
                              f"{b.name} {fmt(pb)}{ratio}", out)
    return res


def report_divergence(options: CampaignOptions, scenario: Scenario, is_random: bool, d: Divergence, impl_a,
                      impl_b, out) -> dict[str, Any]:
    """Writes the diverging scenario to `options.out_dir` (a fresh file) with the
    command that reproduces it in its description; a random one is also shrunk
    (`impl_a` and `impl_b` rerun it) and the small one written beside it.  The
    report's entry for the divergence."""
    outdir = options.out_dir
    outdir.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {"scenario": scenario.name, **d.to_json()}
    path = _unique_path(outdir, scenario.name)
    save_scenario(dataclasses.replace(
        scenario, description=(scenario.description + " | " if scenario.description else "")
        + f"Reproduce: {repro_command(options, path)}"), path)
    entry["file"] = str(path)
    if not options.quiet:
        print(f"DIVERGENCE in {shown(scenario.name)}: {d.describe()}", file=out)
        print(f"  scenario written to {path}", file=out)
    if is_random and options.shrink and d.kind != "crash":
        small, sd = shrink(scenario, impl_a, impl_b, d, budget_s=options.shrink_seconds)
        mpath = _unique_path(outdir, f"{scenario.name}-min")
        small = dataclasses.replace(
            small, name=f"{scenario.name}-min",
            description=(f"Shrunk from {scenario.name} ({scenario.description}): {options.impl} and "
                         f"{options.against} first differ at "
                         + (f"step {sd.step}, " if sd.step is not None else "")
                         + f"field {sd.field}. Reproduce: {repro_command(options, mpath)}"))
        save_scenario(small, mpath)
        entry["minimal"] = {"file": str(mpath), "requests": len(small.requests),
                            "max_steps": small.max_steps, **sd.to_json()}
        if not options.quiet:
            print(f"  shrunk to {len(small.requests)} request(s), {small.max_steps} step(s): {mpath}", file=out)
            print(f"  {sd.describe()}".replace("\n", "\n  "), file=out)
            print(f"  reproduce: {repro_command(options, mpath)}", file=out)
    return entry


__all__ = ["CampaignOptions", "TimedImpl", "campaign_flags", "campaign_source", "close_impl", "crash_trace",
           "load_scenario_files", "print_campaign_report", "random_scenarios", "repro_command",
           "report_divergence", "run_campaign", "run_config_agreement", "run_guarded", "safe_stem"]
