"""Time the whole `schedspec prove` run and print each obligation's seconds.

    .venv/bin/python benchmarks/prove_time.py [--bound N] [--timeout S]

Prints each obligation's bound, result, seconds and z3 retries (tries after a
call's first, proofs/solving.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bound", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("--jobs", type=int, default=None, help="obligations in parallel (default: one per core)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "schedspec", "prove", "--json", "-o", out]
        if args.bound:
            cmd += ["--bound", str(args.bound)]
        if args.jobs:
            cmd += ["--jobs", str(args.jobs)]
        if args.timeout:
            cmd += ["--timeout", str(args.timeout)]
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t
    rep = json.loads(r.stdout)
    print(f"{'obligation':44} {'bound':28} {'result':8} {'proof s':>8} {'total s':>8} {'retries':>7}")
    for o in rep["obligations"]:
        print(f"{o['name']:44} {o['bound'][:28]:28} {o['result']:8} {o.get('proof_seconds', 0):8.2f} "
              f"{o['seconds']:8.2f} {o.get('retries', 0):7}")
    print(f"\nwhole run: {wall:.1f} s wall (exit {r.returncode}, all ok: {rep['ok']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
