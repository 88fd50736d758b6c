"""Big input: wall time and peak memory of `schedspec run` on large scenarios.

    python benchmarks/big_input.py [--requests 20000] [--plot-requests 2000] [--keep DIR]

Cases, each a fresh `python -m schedspec run ... --timeline none` process:
  * --trace-out with N requests (default 20 000), FCFS and priority policy,
    plain .json and compressed .json.gz;
  * --plot with M requests (default 2 000), FCFS;
  * the same runs without outputs, for comparison.

Prints one line per case: wall seconds, the process's peak resident memory
(ru_maxrss of that child alone), and the output's size.  The scenarios are
fixed by a seed: decodes and prompts of mixed lengths arriving a few per step,
so the waiting queue grows to thousands and every step's record is long (the
case that took 119 s and 7.5 GB before traces were streamed).  A figure, not
a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def big_scenario(n: int, policy: str, seed: int = 8) -> dict:
    rng = random.Random(f"big-input/{seed}/{n}")
    requests = []
    for i in range(n):
        r = {"id": f"r{i}", "arrival_step": i // 4, "prompt_len": rng.randint(16, 1024),
             "max_tokens": 256, "output_len": rng.randint(8, 256)}
        if policy == "priority":
            r["priority"] = rng.randint(0, 9)
        requests.append(r)
    return {"format": "schedspec.scenario/1", "name": f"big-{n}-{policy}",
            "description": f"{n} requests arriving 4 per step (benchmarks/big_input.py)",
            "config": {"max_num_batched_tokens": 8192, "max_num_seqs": 256, "policy": policy,
                       "block_size": 16, "num_gpu_blocks": 40000},
            "requests": requests, "max_steps": 1_000_000}


def measure(args: list[str]) -> tuple[float, float, int]:
    """(wall s, peak RSS MiB, exit status) of `python -m schedspec *args`."""
    env = dict(os.environ, SCHEDSPEC_PROGRESS="0")
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "schedspec", *args], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace").strip()
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        print(f"    failed ({p.returncode}): {err[-300:]}")
    return wall, usage.ru_maxrss / 1024.0, p.returncode  # ru_maxrss is in KiB on Linux


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--plot-requests", type=int, default=2000)
    ap.add_argument("--policies", default="fcfs,priority")
    ap.add_argument("--keep", metavar="DIR", help="write scenarios and outputs here instead of a temp folder")
    a = ap.parse_args()
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="schedspec-big-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"python {sys.version.split()[0]}, outputs in {work}")
    print(f"{'case':<44} {'wall s':>8} {'peak MiB':>9} {'output MiB':>11}")
    for policy in a.policies.split(","):
        sc = work / f"big-{a.requests}-{policy}.json"
        sc.write_text(json.dumps(big_scenario(a.requests, policy)))
        if policy == "fcfs":  # the run alone, to see what writing the trace adds
            wall, rss, _ = measure(["run", str(sc), "--timeline", "none"])
            print(f"{f'run (no outputs), {a.requests} req, {policy}':<44} {wall:>8.1f} {rss:>9.0f} {'-':>11}",
                  flush=True)
        for suffix in (".json", ".json.gz"):
            out = work / f"big-{a.requests}-{policy}.trace{suffix}"
            wall, rss, rc = measure(["run", str(sc), "--timeline", "none", "--trace-out", str(out)])
            size = out.stat().st_size / 2**20 if out.exists() and rc == 0 else float("nan")
            print(f"{f'run --trace-out *{suffix}, {a.requests} req, {policy}':<44} {wall:>8.1f} {rss:>9.0f} {size:>11.1f}",
                  flush=True)
        if not a.keep:
            for f in work.glob(f"big-{a.requests}-{policy}.trace*"):
                f.unlink()
    sc = work / f"big-{a.plot_requests}-fcfs.json"
    sc.write_text(json.dumps(big_scenario(a.plot_requests, "fcfs")))
    wall0, rss0, _ = measure(["run", str(sc), "--timeline", "none"])
    print(f"{f'run (no outputs), {a.plot_requests} req, fcfs':<44} {wall0:>8.1f} {rss0:>9.0f} {'-':>11}", flush=True)
    out = work / f"big-{a.plot_requests}.png"
    wall, rss, rc = measure(["run", str(sc), "--timeline", "none", "--plot", str(out)])
    size = out.stat().st_size / 2**20 if out.exists() and rc == 0 else float("nan")
    print(f"{f'run --plot .png, {a.plot_requests} req, fcfs':<44} {wall:>8.1f} {rss:>9.0f} {size:>11.2f}")
    print(f"  drawing the plot: about {wall - wall0:.1f} s of that")
    return 0


if __name__ == "__main__":
    sys.exit(main())
