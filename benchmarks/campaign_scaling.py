"""How campaigns scale with workers: `schedspec diff` at --workers 1 and 2 (and
more where the machine has the cores), for vLLM against the spec and the spec
against itself, end to end as a user runs them.

Each run is the real command in a subprocess (`--json`), on the same seeded
scenarios; the figures:

  - scenarios/s: scenarios / the campaign's own seconds, which include starting
    the workers and each worker's load of its implementations;
  - steady scenarios/s: the same with the slowest worker's load taken out, what
    a long campaign approaches;
  - speedup: against --workers 1 of the same implementation;
  - load per worker: what each worker spent loading (vLLM: about 12 s);
  - peak RSS: the largest process so far (a worker holding vLLM, or the
    parent), from the kernel's accounting of children: a running maximum over
    the runs, not each run's own.

The runs must agree: the deterministic part of the report (scenarios, steps,
divergences, coverage) of every worker count is compared with --workers 1, and
the script stops on a difference.  Then a projection to a bigger machine, with
its assumptions printed beside it.

    python benchmarks/campaign_scaling.py                     # vLLM 3000 and spec 3000 scenarios, workers 1,2
    python benchmarks/campaign_scaling.py --vllm 1000 --spec 5000 --workers 1,2 --json out.json

A script, not a test: it prints a markdown table on stdout, progress on stderr.
Run it on a quiet machine; other work on the cores shows up as lost speedup.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPLS = {"vllm": ["--impl", "vllm", "--against", "spec"],
         "spec": ["--impl", "spec", "--against", "schedspec.reference.impl:SpecScheduler"]}
DETERMINISTIC = ("scenarios", "steps_compared", "divergences", "failures", "coverage")


def log(msg: str) -> None:
    print(f"[campaign_scaling] {msg}", file=sys.stderr, flush=True)


def run(impl: str, n: int, seed: int, workers: int, work: Path) -> dict:
    out = work / f"{impl}-w{workers}"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "schedspec", "diff", *IMPLS[impl], "--scenarios", str(n), "--seed", str(seed),
           "--workers", str(workers), "--json", "-o", str(out / "div")]
    env = dict(os.environ, SCHEDSPEC_PROGRESS="0")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode not in (0, 1):
        sys.exit(f"campaign_scaling: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout)
    loads = report["load_seconds"]
    slowest_load = max((sum(v[k] for v in loads.values() if len(v) > k) for k in range(report["workers"])),
                       default=0.0)
    secs = report["seconds"]
    return {"impl": impl, "workers": workers, "scenarios": n, "wall_s": round(wall, 1), "campaign_s": secs,
            "scen_per_s": round(n / secs, 1) if secs else None,
            "steady_scen_per_s": round(n / (secs - slowest_load), 1) if secs > slowest_load else None,
            "load_per_worker_s": loads, "peak_rss_mb": round(max(peak_kb, before) / 1024),
            "divergences": len(report["divergences"]),
            "deterministic": {k: report.get(k) for k in DETERMINISTIC}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", type=int, default=3000, help="scenarios of the vLLM campaign (0: skip)")
    ap.add_argument("--spec", type=int, default=3000, help="scenarios of the spec campaign (0: skip)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--work", default="/tmp/schedspec-campaign-scaling", help="scratch folder for divergence files")
    a = ap.parse_args()
    counts = [int(x) for x in a.workers.split(",")]
    work = Path(a.work)
    rows = []
    for impl, n in (("vllm", a.vllm), ("spec", a.spec)):
        if not n:
            continue
        base = None
        for w in counts:
            log(f"{impl}: {n} scenarios, --workers {w} ...")
            r = run(impl, n, a.seed, w, work / str(time.time_ns()))
            if base is None:
                base = r
            elif r["deterministic"] != base["deterministic"]:
                sys.exit(f"campaign_scaling: --workers {w} and --workers {base['workers']} disagree on {impl}")
            r["speedup"] = round(r["scen_per_s"] / base["scen_per_s"], 2) if base["scen_per_s"] else None
            r["steady_speedup"] = (round(r["steady_scen_per_s"] / base["steady_scen_per_s"], 2)
                                   if base["steady_scen_per_s"] and r["steady_scen_per_s"] else None)
            log(f"  {r['campaign_s']} s, {r['scen_per_s']} scenarios/s, speedup {r['speedup']}")
            rows.append(r)
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}\n")
    print("| campaign | workers | scenarios | campaign s | scenarios/s | speedup | steady scenarios/s | steady speedup "
          "| load per worker (s) | peak RSS (MB) | divergences |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        loads = "; ".join(f"{k} " + ", ".join(f"{x:.1f}" for x in v) for k, v in r["load_per_worker_s"].items() if v)
        print(f"| {r['impl']} | {r['workers']} | {r['scenarios']} | {r['campaign_s']} | {r['scen_per_s']} | "
              f"{r['speedup']}x | {r['steady_scen_per_s']} | {r['steady_speedup']}x | {loads} | {r['peak_rss_mb']} | "
              f"{r['divergences']} |")
    for impl in ("vllm", "spec"):
        one = next((r for r in rows if r["impl"] == impl and r["workers"] == 1), None)
        top = max((r for r in rows if r["impl"] == impl), key=lambda r: r["workers"], default=None)
        if not one or not top or top["workers"] == 1 or not one["steady_scen_per_s"]:
            continue
        eff = top["steady_scen_per_s"] / (one["steady_scen_per_s"] * top["workers"])
        load = max((max(v) for v in top["load_per_worker_s"].values() if v), default=0.0)
        for cores in (16, 64):
            rate = one["steady_scen_per_s"] * cores * eff
            hours = (load + 1_000_000 / rate) / 3600
            print(f"\nprojection ({impl}, 1,000,000 scenarios, {cores} cores): {hours:.1f} h at {rate:.0f} scenarios/s; "
                  f"assumes the parallel efficiency measured at {top['workers']} workers ({eff:.2f}) holds at "
                  f"{cores}, one worker per core with memory for each (peak RSS above), and a load of {load:.0f} s "
                  "paid once, in parallel")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
