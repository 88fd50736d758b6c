"""Batched differential campaigns: torch against the spec.

`schedspec diff --impl torch --scenarios N --seed S` (or `--impl spec --against
torch`, or scenario files) lands here.  The torch implementation steps a whole
chunk of scenarios at once (gpu/batch.py `run_batch`, `--batch-size` of them,
default 1024); the spec runs each scenario alone; every pair of traces is
compared step by step with reference/compare.py.  Progress, coverage,
divergence files and shrinking are those of the per-scenario campaign
(reference/campaign.py); shrinking drives torch one scenario at a time
(`TorchScheduler`, S = 1) against the spec.

A batch that raises is rerun one scenario at a time, so a crash is pinned on
the scenario that causes it and reported as that scenario's divergence.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator
from typing import Any

from schedspec.base.progress import Progress
from schedspec.reference.campaign import (
    CampaignOptions,
    TimedImpl,
    campaign_source,
    close_impl,
    crash_trace,
    print_campaign_report,
    report_divergence,
    run_guarded,
)
from schedspec.reference.compare import compare_runs
from schedspec.reference.coverage import StepCoverage, add_coverage
from schedspec.reference.generator import IMPL_FLAGS
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import Scenario

DEFAULT_BATCH_SIZE = 1024
BATCHED_PAIR = frozenset({"torch", "spec"})
# The engine-flag combinations (enable_prefix_caching, async_scheduling) torch
# models, which its random campaigns draw: prefix caching on and off, synchronous.
TORCH_FLAGS = IMPL_FLAGS["torch"]


def is_batched_pair(impl: str, against: str) -> bool:
    """The batched path serves torch against the spec (either order)."""
    return {impl, against} == BATCHED_PAIR


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


class _TorchCrash:
    name = "torch"


def run_torch_batch(scenarios: list[Scenario], device: str | None, progress=None) -> list[dict[str, Any]]:
    """Traces of `scenarios` from one run_batch call; if the batch raises, the
    scenarios are rerun alone and the ones that raise get a crash trace."""
    from .batch import run_batch

    try:
        traces = (run_batch(scenarios, device=device, progress=progress) if progress is not None
                  else run_batch(scenarios, device=device))
        if len(traces) != len(scenarios):
            raise RuntimeError(f"run_batch returned {len(traces)} traces for {len(scenarios)} scenarios")
        return traces
    except Exception:
        if len(scenarios) == 1:
            raise
    out = []
    for s in scenarios:
        try:
            out.append(run_batch([s], device=device)[0])
        except Exception as e:  # noqa: BLE001 - reported as this scenario's divergence
            out.append(crash_trace(s, _TorchCrash(), e))
    return out


def run_batched_campaign(options: CampaignOptions, files: list[tuple[Scenario, bool]], out) -> dict[str, Any]:
    """The batched counterpart of reference/campaign.py `run_campaign`, torch on
    `options.device` against the spec: the same report keys, and `batch_size`,
    `device` and the torch timing basis."""
    from .device import resolve_device
    from .impl import TorchScheduler

    device = options.device
    batch_size = options.batch_size or DEFAULT_BATCH_SIZE
    torch_is_a = options.impl == "torch"
    flags = options.flags if options.flags and set(options.flags) <= set(TORCH_FLAGS) else TORCH_FLAGS
    total, source = campaign_source(options, files, flags)
    spec = TimedImpl(SpecScheduler())
    shrink_impls: list[Any] = []  # (a, b), made at the first divergence

    def impls_for_shrinking():
        if not shrink_impls:
            torch_impl = TorchScheduler(device=device)  # one scenario at a time
            pair = (torch_impl, SpecScheduler()) if torch_is_a else (SpecScheduler(), torch_impl)
            shrink_impls.extend(pair)
        return shrink_impls

    progress = Progress("diff", total, min_total=20)
    divergences: list[dict[str, Any]] = []
    coverage: dict[str, int] = {}
    steps = 0
    torch_seconds = spec_seconds = 0.0
    torch_steps = spec_steps = 0
    done = 0
    t0 = time.monotonic()
    try:
        for chunk in _chunks(source, batch_size):
            scenarios = [s for s, _ in chunk]
            # A big batch steps for a while before its first trace: show its steps too.
            steps_bar = Progress(f"torch batch of {len(chunk)}, step", 1, enabled=progress.enabled)
            t = time.perf_counter()
            try:
                torch_traces = run_torch_batch(scenarios, device, steps_bar if steps_bar.enabled else None)
            finally:
                steps_bar.close()
            torch_seconds += time.perf_counter() - t
            torch_steps += sum(len(tt.get("steps", [])) for tt in torch_traces)
            for (scenario, is_random), tt in zip(chunk, torch_traces):
                t = time.perf_counter()
                # Coverage of what prefix caching did (hits, hits on resumption,
                # evictions) comes from the spec's states, step by step.
                st = run_guarded(scenario, spec, StepCoverage(coverage))
                spec_seconds += time.perf_counter() - t
                spec_steps += len(st.get("steps", []))
                ta, tb = (tt, st) if torch_is_a else (st, tt)
                d = compare_runs(ta, tb, options.impl, options.against)
                steps += min(len(ta.get("steps", [])), len(tb.get("steps", [])))
                add_coverage(scenario, tb, coverage)
                done += 1
                if d is not None:
                    progress.close()
                    a_impl, b_impl = impls_for_shrinking()
                    divergences.append(report_divergence(options, scenario, is_random, d, a_impl, b_impl, out))
                progress(done, total)
    finally:
        progress.close()
        for impl in shrink_impls:
            close_impl(impl)
    elapsed = time.monotonic() - t0
    ms = lambda sec, n: 1000.0 * sec / n if n else None  # noqa: E731
    per_step = {"torch": ms(torch_seconds, torch_steps), "spec": ms(spec.seconds, spec.steps)}
    engine_per_step = {"torch": per_step["torch"], "spec": ms(spec_seconds, spec_steps)}
    res = {
        "scenarios": total,
        "steps_compared": steps,
        "divergences": divergences,
        "ms_per_step": per_step,
        "ms_per_step_engine": engine_per_step,
        "batch_size": batch_size,
        "device": str(resolve_device(device)),
        "seconds": round(elapsed, 1),
        "coverage": dict(sorted(coverage.items())),
    }
    if not options.quiet:
        fmt = lambda x: f"{x:.4f} ms" if x is not None else "-"  # noqa: E731
        pt, ps, pse = per_step["torch"], per_step["spec"], engine_per_step["spec"]
        ratio = f"  (torch: {pse / pt:.1f}x the spec's steps per second)" if pt and pse else ""
        print_campaign_report(
            res, elapsed, f"time per scenario-step: torch {fmt(pt)} (batches of {batch_size} on {res['device']}, "
            f"the whole run_batch, traces included), spec {fmt(pse)} (the whole engine loop; {fmt(ps)} of it in "
            f"scheduler calls){ratio}", out)
    return res


__all__ = ["DEFAULT_BATCH_SIZE", "TORCH_FLAGS", "is_batched_pair", "run_batched_campaign", "run_torch_batch"]
