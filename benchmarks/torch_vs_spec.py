"""Scenario-steps per second: the executable spec against the batched torch
implementation, at S = 1, 64, 1024 and 8192 scenarios, measured in the same run.

Both sides do the whole engine loop of formats.md and return the same traces:
the spec runs each scenario alone (reference/engine.py `run_scenario`); torch
steps all S scenarios at once (gpu/batch.py `run_batch`).  A scenario-step is
one step of one scenario's trace, counted on the torch traces (the spec's are
equal, which the differential campaign checks).

Workloads (fixed, so runs compare):
- `generator` (default): campaign scenarios 0..S-1 of seed 0 (reference/generator.py),
  the workload `schedspec diff --impl torch` runs: mixed configs, preemption, aborts;
- `decode`: a steady decode-heavy workload, 32 requests per scenario that keep
  decoding for all 200 steps (4 arrive per step over the first 8 steps).

The spec side of a large S is estimated from its first `--spec-sample` scenarios
(the output marks it `est.`): the spec handles scenarios one by one, so its rate
does not depend on S.  Each torch size runs in a fresh child process, which
reports its peak RSS growth during run_batch (traces included) and the bytes
of tensor state per scenario (the static Batch and one State, padding included).
Torch is timed twice: with full traces, and with `record_steps=False` (the
stepping and the per-request summaries, no per-step records), which is what a
sweep or a throughput run needs.

`--prefix-caching` turns `enable_prefix_caching` on in every scenario (the
generator workload then draws it on and off, as torch campaigns do), likewise
`--async-scheduling` for `async_scheduling` (both: the generator draws the four
combinations), and
`--shared-prefix N` gives the decode workload's requests a shared system prompt
of N tokens (prefix_group, formats.md).  `--summaries-only` skips the run with
full traces (only the `record_steps=False` run is timed).  `--write-traces DIR`
writes every full trace to disk, on both sides, inside the timed run: the spec
through reference/trace_io.py's TraceWriter as it steps (`run --trace-out`),
torch each chunk of steps to the files as it is rendered (gpu/batch.py
`write_batch_traces`); DIR is emptied of the files each side wrote before the
next measurement, and after every write and removal the benchmark waits,
untimed, until the file system has written its dirty pages back (`os.sync`),
so that no timed run pays for the flushing of another's traces.

`--repeat N` measures each size in N rounds (a fresh torch child, then the spec
right after it) and gives each side's best round: this machine's speed moves
by about 10 % from minute to minute, and one round can catch either side at a
slow moment.  The spec's best is taken over every round that ran its sample
(all sizes), so repeating never favours torch; each round's own ratio is
printed under its row, and the RSS column gives the largest round.

    python benchmarks/torch_vs_spec.py [--device cpu|cuda] [--workload generator|decode]
                                       [--sizes 1,64,1024,8192] [--spec-sample 1024]
                                       [--prefix-caching] [--async-scheduling] [--shared-prefix N]
                                       [--summaries-only] [--write-traces DIR] [--repeat N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import multiprocessing as mp
import random
import resource
import sys
import time

from schedspec.reference.engine import run_scenario
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import RequestSpec, Scenario


def generator_workload(n: int, prefix_caching: bool = False, shared_prefix: int = 0,
                       async_scheduling: bool = False) -> list[Scenario]:
    from schedspec.reference.generator import generate_scenario, scenario_rng

    flags = tuple((p, a) for p in ((False, True) if prefix_caching else (False,))
                  for a in ((False, True) if async_scheduling else (False,)))
    return [dataclasses.replace(generate_scenario(scenario_rng(0, i), i, flags), name=f"random-s0-{i}")
            for i in range(n)]


def decode_workload(n: int, prefix_caching: bool = False, shared_prefix: int = 0,
                    async_scheduling: bool = False) -> list[Scenario]:
    out = []
    for i in range(n):
        rng = random.Random(f"bench-decode/{i}")
        reqs = tuple(RequestSpec(id=f"r{j}", prompt_len=rng.randint(16, 256) + shared_prefix, arrival_step=j // 4,
                                 max_tokens=1000, arrival_time=float(j),
                                 prefix_group="system" if shared_prefix else None, prefix_len=shared_prefix)
                     for j in range(32))
        config = {"max_num_batched_tokens": 1024, "max_num_seqs": 64, "max_model_len": 2048,
                  "block_size": 16, "num_gpu_blocks": 8192, "policy": rng.choice(["fcfs", "priority"])}
        if prefix_caching:
            config["enable_prefix_caching"] = True
        if async_scheduling:
            config["async_scheduling"] = True
        out.append(Scenario(name=f"decode-{i}", config=config, requests=reqs, max_steps=200))
    return out


WORKLOADS = {"generator": generator_workload, "decode": decode_workload}


def _rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux


def _tensor_bytes(scenarios, device) -> int | None:
    """Bytes of the batch's tensors (the static Batch and one step State) for
    the accepted scenarios, built as gpu/batch.py builds them."""
    from schedspec.gpu.batch import build_batch, config_row, prefix_columns, prepare
    from schedspec.gpu.device import resolve_device
    from schedspec.gpu.state import initial_state

    prepared = [p for p in map(prepare, scenarios) if not isinstance(p, str)]
    if not prepared:
        return None
    dev = resolve_device(device)
    import torch

    prefix = {}
    if any(p.prefix_caching for p in prepared):
        prefix = prefix_columns(prepared, max([len(p.ids) for p in prepared] + [1]), dev)
    if any(p.async_scheduling for p in prepared):
        prefix["async_sched"] = torch.tensor([p.async_scheduling for p in prepared], dtype=torch.bool, device=dev)
    b = build_batch([config_row(p.config) for p in prepared], [p.columns for p in prepared], dev, prefix)
    total = 0
    def size(t) -> int:
        if dataclasses.is_dataclass(t):  # the block-level pool (prefix caching)
            return sum(size(getattr(t, f.name)) for f in dataclasses.fields(t))
        return t.element_size() * t.nelement() if hasattr(t, "element_size") else 0

    return sum(size(getattr(obj, f.name)) for obj in (b, initial_state(b)) for f in dataclasses.fields(obj))


def summaries_only(scenarios, device) -> tuple[float, int]:
    """run_batch without per-step records (`record_steps=False`: the stepping,
    the compaction of finished scenarios and the summaries, no per-step trace
    building): what the batched scheduler itself costs."""
    import torch
    from schedspec.gpu.batch import run_batch

    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    traces = run_batch(scenarios, device=device, record_steps=False)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t, sum(tr["summary"]["steps"] for tr in traces if "summary" in tr)


def write_torch_traces(scenarios, device, trace_dir: str) -> tuple[int, int]:
    """Run the batch and write each scenario's full trace to trace_dir/torch-<i>.json:
    (scenario-steps listed, rejected scenarios).  The files are written as the
    run goes (gpu/batch.py `write_batch_traces`), as the spec side writes each
    trace as it steps; an older tree writes them after the whole batch
    (`run_batch_traces`), or as dicts."""
    from schedspec.gpu import batch
    from schedspec.reference.trace_io import write_trace

    steps = errors = 0
    if hasattr(batch, "write_batch_traces"):
        paths = [os.path.join(trace_dir, f"torch-{i}.json") for i in range(len(scenarios))]
        written = batch.write_batch_traces(scenarios, paths, device=device)
        return sum(n for n, _ in written), sum(e is not None for _, e in written)
    if hasattr(batch, "run_batch_traces"):
        for i, tr in enumerate(batch.run_batch_traces(scenarios, device=device)):
            tr.write(os.path.join(trace_dir, f"torch-{i}.json"))
            steps += tr.num_steps
            errors += tr.error is not None
        return steps, errors
    for i, tr in enumerate(batch.run_batch(scenarios, device=device)):
        write_trace(tr, os.path.join(trace_dir, f"torch-{i}.json"))
        steps += len(tr.get("steps", []))
        errors += "error" in tr
    return steps, errors


def torch_child(workload: str, n: int, device: str | None, threads: int, conn, opts: dict | None = None) -> None:
    """One torch measurement in a fresh process: (seconds, scenario-steps, rss growth kB, tensor bytes)."""
    import torch

    if threads:
        torch.set_num_threads(threads)

    from schedspec.gpu.batch import run_batch

    opts = opts or {}
    summaries = opts.pop("summaries_only", False)
    trace_dir = opts.pop("trace_dir", None)
    scenarios = WORKLOADS[workload](n, **opts)
    run_batch(WORKLOADS[workload](2, **opts), device=device)  # warm-up: imports, first kernels
    tensor_bytes = _tensor_bytes(scenarios, device)
    if summaries:
        eng = summaries_only(scenarios, device)
        conn.send((None, eng[1], None, tensor_bytes, 0, eng))
        conn.close()
        return
    before = _rss_kb()
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    if trace_dir:
        steps, errors = write_torch_traces(scenarios, device, trace_dir)
        traces = None
    else:  # in memory: the trace dicts run_batch returns
        traces = run_batch(scenarios, device=device)
        steps = sum(tr["summary"]["steps"] for tr in traces if "summary" in tr)  # idle steps too, as summaries_only
        errors = sum(1 for tr in traces if "error" in tr)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    rss = _rss_kb() - before
    del traces
    _settle(trace_dir)
    eng = summaries_only(scenarios, device)
    if eng[1] != steps:
        raise AssertionError(f"run_batch without records stepped {eng[1]} scenario-steps, with records {steps}")
    conn.send((seconds, steps, rss, tensor_bytes, errors, eng))
    conn.close()


def measure_torch(workload: str, n: int, device: str | None, threads: int, opts: dict | None = None):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=torch_child, args=(workload, n, device, threads, child, dict(opts or {})))
    p.start()
    child.close()
    res = parent.recv()
    p.join()
    return res


def measure_spec(scenarios: list[Scenario], trace_dir: str | None = None) -> tuple[float, int]:
    """The spec's (seconds, scenario-steps); with trace_dir each trace is written
    as the run goes (TraceWriter, as `schedspec run --trace-out` does)."""
    from schedspec.reference.trace_io import TraceWriter

    t = time.perf_counter()
    steps = 0
    for i, s in enumerate(scenarios):
        if trace_dir:
            counter = _Count()
            with TraceWriter(os.path.join(trace_dir, f"spec-{i}.json")) as w:
                run_scenario(s, SpecScheduler(), sink=_Tee(w, counter))
            steps += counter.n
        else:
            steps += len(run_scenario(s, SpecScheduler()).get("steps", []))
    return time.perf_counter() - t, steps


class _Count:
    """A trace sink that counts the steps written."""

    n = 0

    def begin(self, header):
        pass

    def step(self, record):
        self.n += 1

    def end(self, trace):
        pass


class _Tee:
    def __init__(self, *sinks):
        self.sinks = sinks

    def begin(self, header):
        for s in self.sinks:
            s.begin(header)

    def step(self, record):
        for s in self.sinks:
            s.step(record)

    def end(self, trace):
        for s in self.sinks:
            s.end(trace)


def _clear(trace_dir: str | None) -> None:
    """Remove the trace files this benchmark wrote (and nothing else)."""
    if not trace_dir:
        return
    for name in os.listdir(trace_dir):
        if (name.startswith("torch-") or name.startswith("spec-")) and name.endswith(".json"):
            os.unlink(os.path.join(trace_dir, name))
    _settle(trace_dir)


def _settle(trace_dir: str | None) -> None:
    """After trace files were written or removed, wait (untimed) until the kernel
    has written the file system's dirty pages back: the gigabytes a traced run
    at S = 8192 writes would otherwise be flushed during the next timed run,
    whichever side that is.  On this machine (S = 8192, both flags on, three
    rounds each, two runs at different times) the torch run without records
    that follows in the same child gave 94-109x the spec in a run before
    this wait, 109-112x in one with it."""
    if trace_dir:
        os.sync()


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def _num(x, width: int, digits: int = 0) -> str:
    return f"{x:>{width}.{digits}f}" if x is not None else f"{'-':>{width}}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="torch device (default cpu)")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="generator")
    ap.add_argument("--sizes", default="1,64,1024,8192")
    ap.add_argument("--spec-sample", type=int, default=1024,
                    help="largest S the spec runs in full; above it the spec rate is estimated from this many")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1, like the spec; 0 = torch's default). On a shared "
                         "machine more threads can be far slower: a parallel reduction waits for a "
                         "descheduled thread")
    ap.add_argument("--prefix-caching", action="store_true",
                    help="enable_prefix_caching on (decode) / drawn on and off (generator)")
    ap.add_argument("--async-scheduling", action="store_true",
                    help="async_scheduling on (decode) / drawn on and off (generator)")
    ap.add_argument("--shared-prefix", type=int, default=0, metavar="N",
                    help="decode: the requests of a scenario share their first N prompt tokens")
    ap.add_argument("--summaries-only", action="store_true",
                    help="time torch only without per-step records (record_steps=False)")
    ap.add_argument("--write-traces", metavar="DIR", default=None,
                    help="write every full trace to DIR (both sides, timed); the files are removed after each measurement")
    ap.add_argument("--repeat", type=_positive, default=1, metavar="N",
                    help="rounds per size (default 1): torch in a fresh child, then the spec, N times; "
                         "the table gives each side's best round, and each round's ratio is printed")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    opts = {"prefix_caching": args.prefix_caching, "shared_prefix": args.shared_prefix,
            "async_scheduling": args.async_scheduling}
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.write_traces:
        os.makedirs(args.write_traces, exist_ok=True)
    import torch

    threads = args.threads or torch.get_num_threads()
    print(f"# torch {torch.__version__}, device {args.device}, {threads} torch CPU thread(s) (spec: 1); "
          f"workload {args.workload}{' + prefix caching' if args.prefix_caching else ''}"
          f"{' + async scheduling' if args.async_scheduling else ''}"
          f"{f' + shared prefix {args.shared_prefix}' if args.shared_prefix else ''}; "
          f"python {sys.version.split()[0]}", flush=True)
    if not args.summaries_only:
        from schedspec.gpu import trace_native

        print("# trace text: " + ("native renderer (gpu/trace_render.c)" if trace_native.available()
                                  else f"numpy renderer ({trace_native.why_not()})"), flush=True)
    print(f"{'S':>6} {'scen-steps':>11} {'spec steps/s':>14} {'torch steps/s':>14} {'torch/spec':>11} "
          f"{'torch s':>8} {'no-rec steps/s':>15} {'no-rec/spec':>12} {'tensor B/scen':>14} {'RSS kB/scen':>12}",
          flush=True)
    rows = []
    # Every measurement of the spec, by sample size: (written, plain) per round.
    # Rounds of every size that uses a sample add to its list, and the best of
    # them all is the divisor, so more rounds can only make the spec look faster.
    spec_runs: dict[int, list[tuple[tuple[float, int], tuple[float, int]]]] = {}
    for n in sizes:
        sample = min(n, args.spec_sample)
        rounds = []
        for _ in range(args.repeat):
            # One round: torch in a fresh child (cold, as a user's single run),
            # then the spec right after it, so each round's ratio compares two
            # measurements of one moment of the machine.
            ts, tsteps, rss_kb, tbytes, errors, eng = measure_torch(
                args.workload, n, args.device, args.threads,
                {**opts, "summaries_only": args.summaries_only, "trace_dir": args.write_traces})
            _clear(args.write_traces)
            # The spec as the traced torch run is measured (traces to disk with
            # --write-traces), and plain (run_scenario's in-memory trace), which
            # the summaries-only torch run is compared with.
            plain = measure_spec(WORKLOADS[args.workload](sample, **opts))
            written = (measure_spec(WORKLOADS[args.workload](sample, **opts), args.write_traces)
                       if args.write_traces and not args.summaries_only else plain)
            _clear(args.write_traces)
            spec_runs.setdefault(sample, []).append((written, plain))
            if ts is None:  # --summaries-only
                ts, rss_kb = eng[0], 0
            rounds.append({"torch_seconds": ts, "steps": tsteps, "rss_kb": rss_kb, "no_records_seconds": eng[0],
                           "no_records_steps": eng[1], "spec_written": written, "spec_plain": plain,
                           "errors": errors, "tensor_bytes": tbytes})
        # Each side at its best round (the least disturbed by the rest of the machine).
        spec_rate = max(w[1] / w[0] for w, _ in spec_runs[sample])
        plain_rate = max(p[1] / p[0] for _, p in spec_runs[sample])
        best = min(rounds, key=lambda r: r["torch_seconds"])
        ts, tsteps, rss_kb, errors, tbytes = (best["torch_seconds"], best["steps"], max(r["rss_kb"] for r in rounds),
                                              best["errors"], best["tensor_bytes"])
        eng_rate = max(r["no_records_steps"] / r["no_records_seconds"] for r in rounds)
        torch_rate = tsteps / ts
        est = sample < n
        row = {"S": n, "scenario_steps": tsteps, "spec_steps_per_s": spec_rate, "spec_estimated_from": sample if est else None,
               "torch_steps_per_s": torch_rate, "ratio": torch_rate / spec_rate, "torch_seconds": ts,
               "tensor_bytes_per_scenario": tbytes / n if tbytes else None, "rss_kb_per_scenario": rss_kb / n,
               "rejected_scenarios": errors,
               "spec_plain_steps_per_s": plain_rate,
               "no_records_steps_per_s": eng_rate,
               "no_records_ratio": eng_rate / plain_rate,
               "rounds": [{"ratio": r["steps"] / r["torch_seconds"] / (r["spec_written"][1] / r["spec_written"][0]),
                           "no_records_ratio": (r["no_records_steps"] / r["no_records_seconds"]
                                                / (r["spec_plain"][1] / r["spec_plain"][0]))} for r in rounds]}
        rows.append(row)
        spec_txt = f"{spec_rate:>10.0f}" + (" est" if est else "    ")
        tb = f"{tbytes / n:>14.0f}" if tbytes else f"{'-':>14}"
        print(f"{n:>6} {tsteps:>11} {spec_txt:>14} {torch_rate:>14.0f} {torch_rate / spec_rate:>10.1f}x "
              f"{ts:>8.2f} {_num(row['no_records_steps_per_s'], 15)} {_num(row['no_records_ratio'], 11, 1)}x "
              f"{tb} {rss_kb / n:>12.1f}", flush=True)
        if args.repeat > 1:
            each = " ".join(f"{r['no_records_ratio']:.1f}x" for r in row["rounds"])
            traced = "" if args.summaries_only else (" | torch/spec " + " ".join(f"{r['ratio']:.1f}x"
                                                                            for r in row["rounds"]))
            print(f"#   S={n}, each round's own ratio: no-rec/spec {each}{traced}", flush=True)
    if any(r["spec_estimated_from"] for r in rows):
        print(f"# est: the spec's rate measured on the first {args.spec_sample} scenarios of the same workload "
              "(the spec runs scenarios one by one, so its rate does not depend on S)")
    if args.write_traces:
        print(f"# full traces written to {args.write_traces} on both sides, inside the timed runs "
              "(spec: TraceWriter as it steps; torch: write_batch_traces, each chunk of steps as rendered)")
    if args.write_traces and not args.summaries_only:
        print("# spec steps/s with traces to disk; no-rec/spec divides by the spec without writing: "
              + ", ".join(f"S={r['S']}: {r['spec_plain_steps_per_s']:.0f}" for r in rows))
    print("# torch steps/s: run_batch with full traces; no-rec: run_batch(record_steps=False), the batched "
          "stepping with summaries only (no per-step records); spec: run_scenario, the whole engine loop")
    print("# RSS kB/scen: peak RSS growth of the torch child during run_batch, traces included, per scenario"
          + (" (the largest of the rounds)" if args.repeat > 1 else ""))
    if args.repeat > 1:
        print(f"# {args.repeat} rounds per size; every rate is the side's best round (a fresh torch child each "
              "round; the spec's best over all rounds with its sample); each round's own ratio is listed under its row")
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
