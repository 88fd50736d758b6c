"""What-if sweeps: one workload under a grid of scheduler configs, all in one
torch batch (one scenario per grid point and workload).

A workload is one scenario (its requests, aborts and base config) or several
generator scenarios; a grid is the product of `--set FIELD=V1,V2,...` axes,
each overriding one `config` field.  Per grid point the figures are those of
reference/metrics.py, pooled over the workloads: throughput (output tokens per
step), TTFT and end-to-end latency percentiles (steps,
and ms under the step-time model of metrics.py), preemptions.  A grid point
whose config (or a request under it) vLLM rejects is a row with the reason.

Latency here is `finish_step - arrival_step + 1` (the arrival step counts, as
for TTFT) over requests that finished by EOS or length; aborted requests and
unfinished ones are left out, and `unfinished` counts the latter.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schedspec.reference.errors import UsageError
from schedspec.reference.outputs import PLOT_MARKER
from schedspec.reference.metrics import percentile
from schedspec.reference.scenario import Scenario
from schedspec.spec.config import CONFIG_FIELDS, ConfigError, check_field, config_as_given, unknown_field

PLOT_SOFTWARE = f"{PLOT_MARKER} (schedspec sweep)"  # reference/outputs.py is_schedspec_plot: ours to replace
MAX_SCENARIOS = 100_000  # one batch; beyond this the tensors and traces outgrow a laptop


@dataclasses.dataclass(frozen=True)
class Axis:
    field: str
    values: tuple[Any, ...]


def _check_type(field: str, value: Any, text: str) -> None:
    """The field's JSON type and schedspec's bound (spec/config.py, the config table)."""
    try:
        check_field(field, value)
    except ConfigError as e:
        raise UsageError(f"--set {field}: value {text!r}: {str(e).split(': ', 1)[1]}") from None


def parse_set(items: Sequence[str]) -> list[Axis]:
    """`FIELD=V1,V2,...` per item; values are JSON scalars (a bare word is a
    string, for `policy=fcfs,priority`).  Raises UsageError naming the field."""
    axes: list[Axis] = []
    seen: set[str] = set()
    for item in items:
        field, eq, rest = item.partition("=")
        field = field.strip()
        if not eq or not field:
            raise UsageError(f"--set {item!r}: expected FIELD=V1,V2,... (e.g. max_num_seqs=32,64)")
        if field not in CONFIG_FIELDS:
            raise UsageError(f"--set {field}: {unknown_field(field, CONFIG_FIELDS).replace('field', 'config field', 1)}")
        if field in seen:
            raise UsageError(f"--set {field}: given twice; list all its values in one --set")
        seen.add(field)
        texts = [t.strip() for t in rest.split(",")]
        if not rest.strip() or any(not t for t in texts):
            raise UsageError(f"--set {field}: empty value in {rest!r}; expected V1,V2,...")
        values = []
        for t in texts:
            try:
                v = json.loads(t)
            except ValueError:
                if not t.replace("_", "").replace("-", "").isalnum():
                    raise UsageError(f"--set {field}: cannot parse value {t!r}") from None
                v = t
            if isinstance(v, (list, dict)):
                raise UsageError(f"--set {field}: value {t!r} must be a scalar")
            _check_type(field, v, t)
            if v in values:
                raise UsageError(f"--set {field}: value {t} listed twice")
            values.append(v)
        axes.append(Axis(field, tuple(values)))
    if not axes:
        raise UsageError("give at least one --set FIELD=V1,V2,...")
    return axes


def grid_points(axes: Sequence[Axis]) -> list[dict[str, Any]]:
    """The product of the axes, the last axis varying fastest."""
    return [dict(zip((a.field for a in axes), combo)) for combo in itertools.product(*(a.values for a in axes))]


def point_label(point: dict[str, Any]) -> str:
    return ",".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in point.items())


def with_shared_prefix(workloads: Sequence[Scenario], n: int) -> list[Scenario]:
    """The workloads with a shared system prompt: every request's first
    min(n, prompt_len) tokens are one prefix group's (formats.md "Additions"),
    shared within each workload, so prefix caching has something to hit
    (`--shared-prefix N`).  A request with explicit prompt_token_ids keeps them."""
    if n < 0:
        raise ValueError(f"shared prefix {n}: must be >= 0")
    out = []
    for w in workloads:
        reqs = tuple(r if getattr(r, "prompt_token_ids", None) is not None
                     else dataclasses.replace(r, prefix_group="shared" if n else None,
                                              prefix_len=min(n, r.prompt_len) if n else 0)
                     for r in w.requests)
        out.append(dataclasses.replace(w, requests=reqs))
    return out


def grid_scenarios(workloads: Sequence[Scenario], points: Sequence[dict[str, Any]]) -> list[Scenario]:
    """Point-major: the scenarios of grid point p are [p*K, (p+1)*K)."""
    out = []
    for point in points:
        for w in workloads:
            out.append(dataclasses.replace(w, name=f"{w.name}[{point_label(point)}]",
                                           config={**config_as_given(w.config), **point}))
    return out


def _durations(trace: dict[str, Any], step_ms: float, token_ms: float) -> dict[int, float]:
    return {st["step"]: step_ms + token_ms * sum(n for _, n in st["scheduled"]) for st in trace["steps"]}


def point_figures(workloads: Sequence[Scenario], traces: Sequence[dict[str, Any]], step_ms: float = 20.0,
                  token_ms: float = 0.0) -> dict[str, Any]:
    """One grid point's row, pooled over the workloads that accept its config,
    from each trace's summary (the per-step records are needed only for
    `token_ms` > 0, where a step's duration depends on its tokens).  The row is
    rejected when every workload rejects it; otherwise `rejected_workloads`
    counts the ones that did (a random workload mixes base configs)."""
    errors = [(w.name, t["error"]) for w, t in zip(workloads, traces) if "error" in t]
    first_error = None
    if errors:
        name, why = errors[0]
        first_error = why + (f" (in {len(errors)} of {len(workloads)} workloads; first {name})"
                             if len(workloads) > 1 else "")
    if len(errors) == len(workloads):
        return {"status": "rejected", "reason": first_error}
    steps = out_tokens = preemptions = unfinished = 0
    ttft_s, ttft_ms, lat_s, lat_ms = [], [], [], []
    for w, t in zip(workloads, traces):
        if "error" in t:
            continue
        summary = t["summary"]
        steps += summary["steps"]
        unfinished += len(summary["unfinished"])
        dur = _durations(t, step_ms, token_ms) if token_ms else {}

        def span_ms(first: int, last: int, dur=dur) -> float:  # steps first .. last inclusive, as metrics.py
            return sum(dur.get(k, step_ms) for k in range(first, last + 1)) if dur else step_ms * (last - first + 1)

        arrival = {r.id: r.arrival_step for r in w.requests}
        for rid, r in summary["requests"].items():
            out_tokens += r["num_output_tokens"]
            preemptions += r["num_preemptions"]
            if r["first_token_step"] is not None:
                ttft_s.append(r["first_token_step"] - arrival[rid] + 1)
                ttft_ms.append(span_ms(arrival[rid], r["first_token_step"]))
            if r["finish_reason"] in ("stopped", "length"):
                lat_s.append(r["finish_step"] - arrival[rid] + 1)
                lat_ms.append(span_ms(arrival[rid], r["finish_step"]))
    return {
        "status": "ok",
        "steps": steps,
        "output_tokens": out_tokens,
        "throughput_tok_per_step": out_tokens / steps if steps else None,
        "ttft_steps_p50": percentile(ttft_s, 50), "ttft_steps_p99": percentile(ttft_s, 99),
        "ttft_ms_p50": percentile(ttft_ms, 50), "ttft_ms_p99": percentile(ttft_ms, 99),
        "latency_steps_p50": percentile(lat_s, 50), "latency_steps_p99": percentile(lat_s, 99),
        "latency_ms_p50": percentile(lat_ms, 50), "latency_ms_p99": percentile(lat_ms, 99),
        "preemptions": preemptions,
        "unfinished": unfinished,
        "rejected_workloads": len(errors),
        "reason": first_error,
    }


def spec_traces(scenarios: Sequence[Scenario], keep_steps: bool, workers: int = 1, ray_address: str | None = None,
                progress=None) -> list[dict[str, Any]]:
    """The spec's trace of each scenario, in order, computed on `workers`
    processes (or Ray actors) by reference/workers.py."""
    from schedspec.reference.workers import Job, SetupError, WorkerFailure, run_job

    job = Job("schedspec.reference.campaign_worker:setup_one", ("spec", None),
              "schedspec.reference.campaign_worker:run_trace")
    traces: dict[int, dict[str, Any]] = {}
    try:
        for i, trace in run_job(job, [(i, (s, keep_steps)) for i, s in enumerate(scenarios)], workers=workers,
                                ray_address=ray_address):
            if isinstance(trace, WorkerFailure):  # the spec crashed or hung its worker: a finding, said loudly
                raise UsageError(f"the spec's worker {trace.kind} on {scenarios[i].name}: {trace.detail}")
            traces[i] = trace
            if progress is not None:
                progress(len(traces), len(scenarios))
    except SetupError as e:
        raise UsageError(str(e)) from None
    return [traces[i] for i in range(len(scenarios))]


def run_sweep(workloads: Sequence[Scenario], axes: Sequence[Axis], *, device: str | None = None,
              step_ms: float = 20.0, token_ms: float = 0.0, progress=None, impl: str = "torch",
              workers: int = 1, ray_address: str | None = None) -> dict[str, Any]:
    """Every (grid point, workload), one row per point: on torch in one
    run_batch call, or on the spec (`impl` "spec") one scenario at a time on
    `workers` processes.  Per-step records are kept only when the time model
    needs them."""
    from .batch import run_batch
    from .device import resolve_device

    points = grid_points(axes)
    scenarios = grid_scenarios(workloads, points)
    if len(scenarios) > MAX_SCENARIOS:
        raise UsageError(f"--set: {len(points)} grid points x {len(workloads)} workloads = {len(scenarios)} "
                         f"scenarios; at most {MAX_SCENARIOS} fit one sweep")
    t = time.perf_counter()
    if impl == "spec":
        traces = spec_traces(scenarios, bool(token_ms), workers, ray_address, progress)
    else:
        traces = run_batch(scenarios, device=device, progress=progress, record_steps=bool(token_ms))
    seconds = time.perf_counter() - t
    k = len(workloads)
    rows = []
    for i, point in enumerate(points):
        rows.append({"config": point, **point_figures(workloads, traces[i * k:(i + 1) * k], step_ms, token_ms)})
    return {
        "workloads": [w.name for w in workloads],
        "axes": {a.field: list(a.values) for a in axes},
        "implementation": impl,
        "device": str(resolve_device(device)) if impl == "torch" else "cpu",
        "workers": workers if impl == "spec" else None,
        "scenarios": len(scenarios),
        "scenario_steps": sum(tr["summary"]["steps"] for tr in traces if "summary" in tr),
        "seconds": round(seconds, 3),
        "step_ms": step_ms,
        "token_ms": token_ms,
        "rows": rows,
    }


def _f(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def format_table(result: dict[str, Any]) -> str:
    fields = list(result["axes"])
    several = len(result["workloads"]) > 1
    head = fields + (["workloads"] if several else []) + ["tok/step", "TTFT p50", "TTFT p99", "lat p50", "lat p99", "preempt",
                     "unfinished", "steps"]
    rows = [head]
    notes = []
    for r in result["rows"]:
        cells = [json.dumps(r["config"][f]) if not isinstance(r["config"][f], str) else r["config"][f]
                 for f in fields]
        if r["status"] == "rejected":
            rows.append(cells + (["0"] if several else []) + ["rejected"]
                        + [""] * (len(head) - len(cells) - 1 - several))
            notes.append(f"  rejected {point_label(r['config'])}: {r['reason']}")
            continue
        if several:
            cells.append(str(len(result["workloads"]) - r["rejected_workloads"]))
            if r["rejected_workloads"]:
                notes.append(f"  partly rejected {point_label(r['config'])}: {r['reason']}")
        rows.append(cells + [_f(r["throughput_tok_per_step"], 2), _f(r["ttft_steps_p50"]), _f(r["ttft_steps_p99"]), _f(r["latency_steps_p50"]),
                             _f(r["latency_steps_p99"]), str(r["preemptions"]), str(r["unfinished"]),
                             str(r["steps"])])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = [f"# sweep of {', '.join(result['workloads'][:3])}"
           + (f" and {len(result['workloads']) - 3} more" if len(result["workloads"]) > 3 else "")
           + f": {len(result['rows'])} grid points, {result['scenarios']} scenarios "
           + (f"in one torch batch on {result['device']}" if result.get("implementation", "torch") == "torch"
              else f"on the spec, {result['workers']} worker(s)")
           + f", {result['scenario_steps']} scenario-steps in {result['seconds']:.2f} s",
           "# tok/step = output tokens per step; TTFT and lat(ency) in steps, arrival step included"
           + ("; workloads = how many accept the grid point (the figures pool those)" if several else "")]
    return "\n".join(out + lines + notes)


def plot_sweep(result: dict[str, Any], path: str | Path, title: str | None = None) -> Path:
    """Four panels over the grid points: throughput, TTFT p50/p99, latency
    p50/p99, preemptions; a rejected point is marked, not drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fields = list(result["axes"])
    labels = ["\n".join(str(r["config"][f]) for f in fields) for r in rows]
    xs = list(range(len(rows)))
    ok = [r["status"] == "ok" for r in rows]
    width_in = min(max(8.0, 0.55 * len(rows) + 3), 24.0)
    fig, axs = plt.subplots(2, 2, figsize=(width_in, 7.5), dpi=110, sharex=True)

    def bars(ax, keys, names, ylabel):
        n = len(keys)
        w = 0.8 / n
        top = 0.0
        for j, (key, name) in enumerate(zip(keys, names)):
            vals = [(r[key] if r["status"] == "ok" and r[key] is not None else 0) for r in rows]
            top = max([top, *vals])
            ax.bar([x - 0.4 + w * (j + 0.5) for x in xs], vals, width=w, label=name)
        for x, good in zip(xs, ok):
            if not good:
                ax.text(x, 0, "rejected", rotation=90, ha="center", va="bottom", fontsize=7, color="crimson")
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, top * 1.25 if top else 1)  # headroom for the legend
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        if n > 1:
            ax.legend(fontsize=8, frameon=False)

    bars(axs[0][0], ["throughput_tok_per_step"], ["output"], "output tokens per step")
    axs[0][0].set_title("throughput")
    bars(axs[0][1], ["ttft_steps_p50", "ttft_steps_p99"], ["p50", "p99"], "steps")
    axs[0][1].set_title("TTFT")
    bars(axs[1][0], ["latency_steps_p50", "latency_steps_p99"], ["p50", "p99"], "steps")
    axs[1][0].set_title("end-to-end latency")
    bars(axs[1][1], ["preemptions"], ["preemptions"], "preemptions")
    axs[1][1].set_title("preemptions")
    for ax in axs[1]:
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_xlabel(" / ".join(fields))
    fig.suptitle(title or f"sweep of {', '.join(result['workloads'][:2])}"
                 + (" ..." if len(result["workloads"]) > 2 else ""))
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, metadata={"Software": PLOT_SOFTWARE})
    plt.close(fig)
    return out


__all__ = [
    "Axis",
    "format_table",
    "grid_points",
    "grid_scenarios",
    "parse_set",
    "plot_sweep",
    "point_figures",
    "run_sweep",
    "spec_traces",
]
