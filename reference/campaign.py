"""Differential campaigns: run two implementations over scenarios (files or seeded
random ones), compare their traces, record coverage, and write (and shrink)
every diverging scenario, never overwriting a file."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Iterator

from ..errors import Progress, UsageError, shown
from ..spec.config import ConfigError, SchedulerConfig, config_from_dict
from .compare import Divergence, compare_traces
from .coverage import StepCoverage, add_coverage
from .engine import run_scenario
from .impl import ImplementationError, SpecScheduler, load_impl
from .scenario import Scenario, ScenarioError, load_scenario, save_scenario
from .shrink import shrink


class _Timed:
    """Wraps an implementation and adds up the time spent in its scheduler
    calls (add_request, finish_requests, schedule, update_from_output);
    construction (reset) and state read-back (observe) are not counted."""

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
        close = getattr(self.impl, "close", None)
        if close:
            close()


def _crash_trace(scenario: Scenario, impl, e: BaseException) -> dict[str, Any]:
    return {"scenario": scenario.name, "implementation": getattr(impl, "name", "?"), "steps": [],
            "crash": f"{type(e).__name__}: {e}"}


def _is_spec(impl) -> bool:
    return isinstance(getattr(impl, "impl", impl), SpecScheduler)


def _run_guarded(scenario: Scenario, a, b, on_step=(None, None)) -> tuple[dict, dict, Divergence | None]:
    """Like run_pair, but an implementation that raises is a divergence
    (field "crash"), not the end of the campaign.  `on_step`: the engine
    observers of a's run and of b's."""
    traces = []
    for impl, observer in zip((a, b), on_step):
        try:
            traces.append(run_scenario(scenario, impl, on_step=observer))
        except Exception as e:  # noqa: BLE001 - report it with the scenario
            traces.append(_crash_trace(scenario, impl, e))
    ta, tb = traces
    if "crash" in ta or "crash" in tb:
        return ta, tb, Divergence("crash", ta.get("crash", "<no crash>"), tb.get("crash", "<no crash>"), None,
                                  getattr(a, "name", "a"), getattr(b, "name", "b"))
    return ta, tb, compare_traces(ta, tb)


def _load_impl(name: str, device: str | None = None):
    try:
        return load_impl(name, device=device) if device is not None else load_impl(name)
    except ImplementationError as e:
        raise UsageError(str(e)) from None


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
    stem = safe_stem(stem)
    p = directory / f"{stem}.json"
    k = 2
    while p.exists():
        p = directory / f"{stem}-{k}.json"
        k += 1
    return p


def _repro_command(args, path: Path) -> str:
    cmd = f"schedspec diff --impl {args.impl}"
    if args.against != "spec":
        cmd += f" --against {args.against}"
    if getattr(args, "device", None):
        cmd += f" --device {args.device}"
    return f"{cmd} {path}"


def _resolve(path: str) -> str:
    try:
        from ..examples import resolve_scenario_path
    except ImportError:
        return path
    return resolve_scenario_path(path)


def _scenarios(args) -> Iterator[tuple[Scenario, bool]]:
    """(scenario, is_random) in run order.  Random scenarios draw the engine
    flags `args.flags` (generator.py; absent: none, as torch campaigns need)."""
    for f in args.files:
        try:
            yield load_scenario(_resolve(f)), False
        except ScenarioError as e:
            raise UsageError(str(e)) from None
    if args.num_scenarios:
        from .generator import FLAG_NAMES, FLAGS_ALL, FLAGS_OFF, generate_scenario, scenario_rng

        flags = getattr(args, "flags", None) or FLAGS_OFF
        # The flags drawn change the scenario of an index: say which were drawn.
        which = (" --flags all, not with torch" if flags == FLAGS_ALL
                 else " --flags " + ",".join(n for n, f in FLAG_NAMES.items() if f in flags))
        for i in range(args.num_scenarios):
            s = generate_scenario(scenario_rng(args.seed, i), i, flags)
            yield dataclasses.replace(
                s, name=f"random-s{args.seed}-{i}",
                description=f"random scenario {i} of seed {args.seed} (schedspec diff --scenarios N --seed "
                            f"{args.seed}{which}, N > {i})"), True


def flags_arg(text: str):
    """argparse type of `--flags`."""
    from .generator import parse_flags

    try:
        return parse_flags(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def campaign_flags(args):
    """The engine-flag combinations random scenarios draw: `--flags`, else every
    combination unless torch, which models neither flag, takes part.  Asking torch
    for a flag is a user error."""
    from .generator import FLAGS_OFF, IMPLS_WITHOUT_FLAGS, flags_for

    impls = (args.impl, args.against)
    flags = getattr(args, "flags", None)
    if flags is None:
        return flags_for(*impls)
    without = sorted(IMPLS_WITHOUT_FLAGS.intersection(impls))
    if without and flags != FLAGS_OFF:
        raise UsageError(f"--flags: {without[0]} models neither prefix caching nor async scheduling; "
                         "use --flags sync")
    return flags


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


def run_config_agreement(args, impl_a, impl_b, out) -> dict[str, Any]:
    from .generator import config_rng, generate_config_dict

    res = {"configs": args.configs, "both_accept": 0, "both_reject": 0, "disagreements": []}
    progress = Progress("configs", args.configs)
    try:
        for i in range(args.configs):
            rng = config_rng(args.seed, i)
            raw = generate_config_dict(rng, valid_bias=0.5)
            ok_a, why_a = _accepts(args.impl, impl_a, raw)
            ok_b, why_b = _accepts(args.against, impl_b, raw)
            if ok_a and ok_b:
                res["both_accept"] += 1
            elif not ok_a and not ok_b:
                res["both_reject"] += 1
            else:
                res["disagreements"].append({"index": i, "config": raw,
                                             args.impl: why_a or "accepts", args.against: why_b or "accepts"})
                if not args.json:
                    print(f"CONFIG DISAGREEMENT (config {i} of seed {args.seed}): {json.dumps(raw)}", file=out)
                    print(f"  {args.impl}: {why_a or 'accepts'}", file=out)
                    print(f"  {args.against}: {why_b or 'accepts'}", file=out)
            progress(i + 1, args.configs)
    finally:
        progress.close()
    return res


def _run_scenarios(args, files: list[tuple[Scenario, bool]], a: _Timed, b: _Timed, outdir: Path, out) -> dict:
    total = len(files) + (args.num_scenarios or 0)
    progress = Progress("diff", total, min_total=20)
    divergences = []
    steps = 0
    coverage: dict[str, int] = {}
    t0 = time.monotonic()
    source: Iterator[tuple[Scenario, bool]] = iter(files) if files else _scenarios(
        argparse.Namespace(files=[], num_scenarios=args.num_scenarios, seed=args.seed,
                           flags=campaign_flags(args)))
    # Prefix-cache and async coverage reads the spec's states: b's, or a's when a is the spec.
    observed = 0 if _is_spec(a) and not _is_spec(b) else 1
    try:
        for k, (scenario, is_random) in enumerate(source, 1):
            observers = [None, None]
            observers[observed] = StepCoverage(coverage)
            ta, tb, d = _run_guarded(scenario, a, b, tuple(observers))
            steps += min(len(ta.get("steps", [])), len(tb.get("steps", [])))
            add_coverage(scenario, tb, coverage)
            if d is not None:
                progress.close() if progress.enabled else None
                divergences.append(_report_divergence(args, scenario, is_random, d, a.impl, b.impl, outdir, out))
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
    if not args.json:
        pa, pb = per_step[a.name], per_step[b.name]
        ratio = f"  ({a.name}/{b.name} = {pa / pb:.1f}x)" if pa and pb else ""
        fmt = lambda x: f"{x:.3f} ms" if x is not None else "-"  # noqa: E731
        print(f"scenarios: {total}  steps compared: {steps}  divergences: {len(divergences)}  "
              f"time: {elapsed:.1f} s", file=out)
        print(f"time per step in scheduler calls: {a.name} {fmt(pa)}, {b.name} {fmt(pb)}{ratio}", file=out)
        if coverage:
            print("coverage: " + ", ".join(f"{k} {v}" for k, v in sorted(coverage.items())), file=out)
    return res


def _report_divergence(args, scenario: Scenario, is_random: bool, d: Divergence, impl_a, impl_b,
                       outdir: Path, out) -> dict[str, Any]:
    outdir.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {"scenario": scenario.name, **d.to_json()}
    path = _unique_path(outdir, scenario.name)
    save_scenario(dataclasses.replace(
        scenario, description=(scenario.description + " | " if scenario.description else "")
        + f"Reproduce: {_repro_command(args, path)}"), path)
    entry["file"] = str(path)
    if not args.json:
        print(f"DIVERGENCE in {shown(scenario.name)}: {d.describe()}", file=out)
        print(f"  scenario written to {path}", file=out)
    if is_random and not args.no_shrink and d.kind != "crash":
        small, sd = shrink(scenario, impl_a, impl_b, d, budget_s=args.shrink_seconds)
        mpath = _unique_path(outdir, f"{scenario.name}-min")
        small = dataclasses.replace(
            small, name=f"{scenario.name}-min",
            description=(f"Shrunk from {scenario.name} ({scenario.description}): {args.impl} and "
                         f"{args.against} first differ at "
                         + (f"step {sd.step}, " if sd.step is not None else "")
                         + f"field {sd.field}. Reproduce: {_repro_command(args, mpath)}"))
        save_scenario(small, mpath)
        entry["minimal"] = {"file": str(mpath), "requests": len(small.requests),
                            "max_steps": small.max_steps, **sd.to_json()}
        if not args.json:
            print(f"  shrunk to {len(small.requests)} request(s), {small.max_steps} step(s): {mpath}", file=out)
            print(f"  {sd.describe()}".replace("\n", "\n  "), file=out)
            print(f"  reproduce: {_repro_command(args, mpath)}", file=out)
    return entry
