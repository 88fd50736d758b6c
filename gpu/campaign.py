"""Batched differential campaigns: torch against the spec.

`schedspec diff --impl torch --scenarios N --seed S` (or `--impl spec --against
torch`, or scenario files) lands here.  The torch implementation steps a whole
chunk of scenarios at once (gpu/batch.py `run_batch`, `--batch-size` of them,
default 1024); the spec runs each scenario alone; every pair of traces is
compared with the spec's (`compare_with_spec`): torch's steps stay trace text,
made column by column (gpu/trace_text.py), and are compared with the spec's
steps as text; only a scenario whose text differs has its torch trace parsed
and compared field by field with reference/compare.py, which builds the same
divergence report as ever.  Progress, coverage,
divergence files and shrinking are those of the per-scenario campaign
(reference/campaign.py); shrinking drives torch one scenario at a time
(`TorchScheduler`, S = 1) against the spec.

A batch that raises is rerun one scenario at a time, so a crash is pinned on
the scenario that causes it and reported as that scenario's divergence.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

from schedspec.reference.progress import Progress
from schedspec.reference.campaign import (
    CampaignOptions,
    TimedImpl,
    campaign_source,
    close_impl,
    crash_trace,
    note_rejected,
    print_campaign_report,
    report_divergence,
    run_guarded,
)
from schedspec.reference.compare import Divergence, compare_runs
from schedspec.reference.coverage import StepCoverage, add_coverage
from schedspec.reference.generator import IMPL_FLAGS
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import Scenario

from .trace_text import TorchTrace

DEFAULT_BATCH_SIZE = 1024
BATCHED_PAIR = frozenset({"torch", "spec"})
# The engine-flag combinations (enable_prefix_caching, async_scheduling) torch
# models, which its random campaigns draw: all four.
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


def run_torch_batch(scenarios: list[Scenario], device: str | None, progress=None) -> list[TorchTrace]:
    """Traces of `scenarios` from one run_batch_traces call (gpu/trace_text.py
    `TorchTrace`: the steps as trace text); if the batch raises, the scenarios
    are rerun alone and the ones that raise get a crash trace."""
    from .batch import run_batch_traces

    try:
        traces = (run_batch_traces(scenarios, device=device, progress=progress) if progress is not None
                  else run_batch_traces(scenarios, device=device))
        if len(traces) != len(scenarios):
            raise RuntimeError(f"run_batch_traces returned {len(traces)} traces for {len(scenarios)} scenarios")
        return traces
    except Exception:
        if len(scenarios) == 1:
            raise
    out = []
    for s in scenarios:
        try:
            out.append(run_batch_traces([s], device=device)[0])
        except Exception as e:  # noqa: BLE001 - reported as this scenario's divergence
            out.append(TorchTrace.from_dict(crash_trace(s, _TorchCrash(), e)))
    return out


# json.dumps(steps, separators=(", ", ": ")), made once; a trace is a tree of
# lists and dicts, so the check for cycles (a fifth of the time) is left out.
_STEPS_JSON = json.JSONEncoder(separators=(", ", ": "), check_circular=False)


def _plain_run(trace: dict[str, Any]) -> bool:
    return "error" not in trace and "crash" not in trace and isinstance(trace.get("summary"), dict)


def compare_with_spec(tt: TorchTrace, spec: dict[str, Any], torch_is_a: bool, a_name: str,
                      b_name: str) -> tuple[Divergence | None, bool]:
    """compare_runs(torch, spec) (in the campaign's order), and whether the torch
    trace's text had to be parsed into dicts.

    Both runs' steps as text first: torch's text (gpu/trace_text.py) is what
    json.dumps writes for the same steps, so equal text is equal steps, and the
    summaries (one dict each) are then compared as compare_traces does.  Where
    the text differs (or a side is an error or crash trace) the torch trace is
    parsed and compare_runs builds the divergence report it always built; text
    that differs while the steps agree (a value of another JSON type that
    Python calls equal) gives None there too."""
    if tt.is_run and _plain_run(spec):
        # json.dumps of the whole list writes ", " between steps where the trace text has ",\n"
        # (no raw newline can occur inside JSON text, so the replacement is exact)
        if _STEPS_JSON.encode(spec["steps"]) == "[" + tt.steps_text().replace(",\n", ", ") + "]":
            t_head = {**tt.header, "steps": [], "summary": tt.summary}
            s_head = {**spec, "steps": []}
            ta, tb = (t_head, s_head) if torch_is_a else (s_head, t_head)
            return compare_runs(ta, tb, a_name, b_name), False
    parsed = tt.is_text  # an error or crash trace is a dict already
    td = tt.to_dict()
    ta, tb = (td, spec) if torch_is_a else (spec, td)
    return compare_runs(ta, tb, a_name, b_name), parsed


def run_batched_campaign(options: CampaignOptions, files: list[tuple[Scenario, bool]], out) -> dict[str, Any]:
    """The batched counterpart of reference/campaign.py `run_campaign`, torch on
    `options.device` against the spec: the same report keys, and `batch_size`,
    `device` and the torch timing basis."""
    batch_size = options.batch_size or DEFAULT_BATCH_SIZE
    flags = options.flags if options.flags and set(options.flags) <= set(TORCH_FLAGS) else TORCH_FLAGS
    total, source = campaign_source(options, files, flags)
    c = _BatchedCampaign(options, out, Progress("diff", total, min_total=20))
    t0 = time.monotonic()
    try:
        for chunk in _chunks(source, batch_size):
            torch_traces = c.run_torch(chunk)
            for (scenario, is_random), tt in zip(chunk, torch_traces):
                c.compare(scenario, is_random, tt)
                c.progress(c.done, total)
    finally:
        c.progress.close()
        for impl in c.shrink_impls:
            close_impl(impl)
    return c.report(total, batch_size, time.monotonic() - t0)


class _BatchedCampaign:
    """`run_batched_campaign`'s state: the spec, the findings (divergences,
    coverage, given files both refused) and the counts and times it reports."""

    def __init__(self, options: CampaignOptions, out, progress: Progress) -> None:
        self.options, self.out, self.progress = options, out, progress
        self.torch_is_a = options.impl == "torch"
        self.spec = TimedImpl(SpecScheduler())
        self.shrink_impls: list[Any] = []  # (a, b), made at the first divergence
        self.divergences: list[dict[str, Any]] = []
        self.coverage: dict[str, int] = {}
        self.rejected: list[dict[str, str]] = []  # given files both implementations refused
        self.steps = 0
        self.torch_seconds = self.spec_seconds = self.compare_seconds = 0.0
        self.parsed_traces = 0  # torch traces parsed into dicts (a side's text differed, or an error or crash trace)
        self.torch_steps = self.spec_steps = 0
        self.done = 0

    def impls_for_shrinking(self) -> list[Any]:
        if not self.shrink_impls:
            from .impl import TorchScheduler

            torch_impl = TorchScheduler(device=self.options.device)  # one scenario at a time
            pair = (torch_impl, SpecScheduler()) if self.torch_is_a else (SpecScheduler(), torch_impl)
            self.shrink_impls.extend(pair)
        return self.shrink_impls

    def run_torch(self, chunk: list[tuple[Scenario, bool]]) -> list[TorchTrace]:
        """The torch traces of a chunk of scenarios, timed."""
        # A big batch steps for a while before its first trace: show its steps too.
        steps_bar = Progress(f"torch batch of {len(chunk)}, step", 1, enabled=self.progress.enabled)
        t = time.perf_counter()
        try:
            torch_traces = run_torch_batch([s for s, _ in chunk], self.options.device,
                                           steps_bar if steps_bar.enabled else None)
        finally:
            steps_bar.close()
        self.torch_seconds += time.perf_counter() - t
        self.torch_steps += sum(tt.num_steps for tt in torch_traces)
        return torch_traces

    def compare(self, scenario: Scenario, is_random: bool, tt: TorchTrace) -> None:
        """Run the spec on `scenario`, compare its trace with torch's `tt`, and
        report what that finds."""
        options, out = self.options, self.out
        t = time.perf_counter()
        # Coverage of what prefix caching did (hits, hits on resumption,
        # evictions) comes from the spec's states, step by step.
        st = run_guarded(scenario, self.spec, StepCoverage(self.coverage))
        self.spec_seconds += time.perf_counter() - t
        self.spec_steps += len(st.get("steps", []))
        t = time.perf_counter()
        d, parsed = compare_with_spec(tt, st, self.torch_is_a, options.impl, options.against)
        self.compare_seconds += time.perf_counter() - t
        self.parsed_traces += parsed
        self.steps += min(tt.num_steps, len(st.get("steps", [])))
        # coverage reads the second trace; torch's (parsed) only when it differs from the spec's
        add_coverage(scenario, st if self.torch_is_a or d is None else tt.to_dict(), self.coverage)
        self.done += 1
        if d is None and not is_random and "error" in st:  # a given file both refused: say why
            self.progress.close()
            self.rejected.append(note_rejected(scenario.name, st["error"], None if options.quiet else out))
        if d is not None:
            self.progress.close()
            a_impl, b_impl = self.impls_for_shrinking()
            self.divergences.append(report_divergence(options, scenario, is_random, d, a_impl, b_impl, out))

    def report(self, total: int, batch_size: int, elapsed: float) -> dict[str, Any]:
        """The campaign's report (and, unless quiet, its closing lines)."""
        from .device import resolve_device

        ms = lambda sec, n: 1000.0 * sec / n if n else None  # noqa: E731
        per_step = {"torch": ms(self.torch_seconds, self.torch_steps), "spec": ms(self.spec.seconds, self.spec.steps)}
        engine_per_step = {"torch": per_step["torch"], "spec": ms(self.spec_seconds, self.spec_steps)}
        res = {
            "scenarios": total,
            "steps_compared": self.steps,
            "divergences": self.divergences,
            "ms_per_step": per_step,
            "ms_per_step_engine": engine_per_step,
            "batch_size": batch_size,
            "device": str(resolve_device(self.options.device)),
            "seconds": round(elapsed, 1),
            "compare_seconds": round(self.compare_seconds, 2),
            "torch_traces_parsed": self.parsed_traces,
            "coverage": dict(sorted(self.coverage.items())),
            **({"rejected": self.rejected} if self.rejected else {}),
        }
        if not self.options.quiet:
            fmt = lambda x: f"{x:.4f} ms" if x is not None else "-"  # noqa: E731
            pt, ps, pse = per_step["torch"], per_step["spec"], engine_per_step["spec"]
            ratio = f"  (torch: {pse / pt:.1f}x the spec's steps per second)" if pt and pse else ""
            print_campaign_report(
                res, elapsed, f"time per scenario-step: torch {fmt(pt)} (batches of {batch_size} on {res['device']}, "
                f"the whole run_batch, traces included), spec {fmt(pse)} (the whole engine loop; {fmt(ps)} of it in "
                f"scheduler calls){ratio}", self.out)
        return res


__all__ = ["DEFAULT_BATCH_SIZE", "TORCH_FLAGS", "compare_with_spec", "is_batched_pair", "run_batched_campaign",
           "run_torch_batch"]
