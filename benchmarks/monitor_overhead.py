"""The runtime monitor's cost: a shadowed vLLM scheduler's step time against plain vLLM's.

Two schedulers of the installed vLLM in one process, built the same way
(benchmarks/spec_vs_vllm.py `VllmSide`), get the same N requests; one is made a
`ShadowScheduler` / `ShadowAsyncScheduler` (monitor/shadow.py), so each of its
calls is checked against the spec.  Both are stepped until every request is a
running decode, then K steps are timed on each, alternating step by step (and
which goes first) to spread machine noise over both.  Each point is measured
once per check (`--checks`): incremental (a live engine's default: the spec's
state carried, what each call changed read from vLLM, a full check every
`--full-every` calls, whose own cost is timed apart and reported beside), full
(the whole post-state lifted after every call) and relift (every pre-state
lifted afresh too, as `peer-tests` runs it).  One step = schedule() +
update_from_output(); under async scheduling EngineCore's loop with two batches
in flight, as in spec_vs_vllm.py.

The comparison is void unless the monitor checked every timed call of the
shadowed side with no divergence, no monitor error and no unconfirmed incremental
difference: the script stops otherwise.

Steps are timed by the wall clock; on a loaded machine (more runnable processes
than cores) a long step is more often descheduled part-way than a short one,
which inflates the ratio, sometimes by 2x: `--clock cpu` times each step by the
thread's CPU time instead (time.thread_time), which a descheduled step does not
accrue.

    python benchmarks/monitor_overhead.py                  # N = 10,100,1000; modes off, async (both flags on)
    python benchmarks/monitor_overhead.py --n 100 --modes off,prefix,async --steps 100 --json out.json
    python benchmarks/monitor_overhead.py --n 1000 --steps 20 --clock cpu
    python benchmarks/monitor_overhead.py --n 10 --blocks 100000 --clock cpu   # a GPU-sized pool
    python benchmarks/monitor_overhead.py --modes async --checks incremental --full-every 1024

Progress goes to stderr, the markdown table to stdout.  A script, not a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from schedspec.monitor.monitor import FULL_EVERY  # noqa: E402
from spec_vs_vllm import MODES, Mismatch, VllmSide, auto_steps, log, machine, make_config, make_requests  # noqa: E402

perf = time.perf_counter
DEFAULT_NS = (10, 100, 1000)
DEFAULT_MODES = ("off", "async")
CHECKS = ("incremental", "full", "relift")
FULL_STEPS = 5  # steps timed with a full check, for its cost


def measure(mode: str, n: int, steps: int, repeat: int, check: str, blocks: int = 0,
            full_every: int = FULL_EVERY) -> dict:
    caching, async_ = MODES[mode]
    warmup = max(3, steps // 10)
    config = make_config(n, caching, async_, 8 + warmup + steps * repeat)
    if blocks > config.num_gpu_blocks:  # a GPU-sized pool: under prefix caching every call reads its free queue
        config = dataclasses.replace(config, num_gpu_blocks=blocks)
    requests = make_requests(config, n)
    plain, shadowed = VllmSide(config, requests), VllmSide(config, requests)
    # After the adapter's first import of vLLM, which sets up the CPU platform.
    from schedspec.monitor import shadow
    from schedspec.monitor.monitor import Monitor

    # A subclass that only overrides the five methods: the object is unchanged.
    shadowed.sched.__class__ = shadow.ShadowAsyncScheduler if async_ else shadow.ShadowScheduler
    relift = check == "relift"
    monitor = Monitor("count", relift=relift, check="incremental" if check == "incremental" else "full",
                      full_every=full_every)
    shadow.set_default_monitor(monitor)
    t_setup = perf()
    try:
        for _ in range(8 + warmup):
            plain.step(), shadowed.step()
        if plain.running() != n or shadowed.running() != n:
            raise Mismatch(f"[{mode} N={n}] {plain.running()} / {shadowed.running()} running, expected {n}")
        monitor.begin("timed")
        samples = {"plain": [], "shadowed": []}
        for _ in range(repeat):
            gc.collect()
            gc.freeze()  # as vLLM's engine does after start-up (vllm/utils/gc_utils.py)
            a, b = [], []
            try:
                for i in range(steps):
                    if i % 2:
                        b.append(shadowed.step(n)), a.append(plain.step(n))
                    else:
                        a.append(plain.step(n)), b.append(shadowed.step(n))
            finally:
                gc.unfreeze()
            samples["plain"].append(a)
            samples["shadowed"].append(b)
        full_ms = None
        if check == "incremental":
            # The full check every `full_every` calls, timed on its own: steps whose
            # two calls are both compared in full, against the incremental steps.
            monitor.full_every = 1
            forced = [sum(shadowed.step(n)) for _ in range(FULL_STEPS)]
            monitor.full_every = full_every
            full_ms = statistics.median(forced) * 1e3 / 2
        stats = monitor.end()
    finally:
        plain.close()
        shadowed.close()
        shadow.set_default_monitor(None)
    calls = stats["calls"]
    timed_calls = calls["schedule"]["total"] + calls["update_from_output"]["total"]
    unconfirmed = stats.get("incremental", {}).get("unconfirmed", [])
    checked = calls["schedule"]["checked"] + calls["update_from_output"]["checked"]
    if checked != timed_calls or checked < steps * repeat or stats["divergences"] or stats["monitor_errors"] \
            or unconfirmed:
        raise Mismatch(f"[{mode} N={n}] the monitor checked {checked} of {timed_calls} calls, "
                       f"{len(stats['divergences'])} divergences, {len(stats['monitor_errors'])} monitor errors, "
                       f"{len(unconfirmed)} unconfirmed incremental differences")

    def ms(reps):
        return statistics.median(statistics.median((x + y) * 1e3 for x, y in rep) for rep in reps)

    p, s = ms(samples["plain"]), ms(samples["shadowed"])
    # A full check's cost beyond an incremental call's, spread over the calls between two.
    full_extra = None if full_ms is None else max(0.0, full_ms - s / 2)
    log(f"[{mode} N={n} check={check}] plain {p:.3f} ms/step, shadowed {s:.3f} ms/step, ratio {s / p:.2f}"
        + (f", full check {full_ms:.3f} ms a call" if full_ms is not None else "") + f" ({perf() - t_setup:.1f}s)")
    return {"mode": mode, "n": n, "check": check, "relift": relift, "full_every": full_every,
            "full_check_ms": full_ms, "full_check_ms_per_step_amortized": None if full_extra is None
            else full_extra * 2 / full_every, "enable_prefix_caching": caching, "async_scheduling": async_,
            "steps": steps, "repeat": repeat, "clock": "cpu" if sys.modules["spec_vs_vllm"].perf is time.thread_time
            else "wall", "num_gpu_blocks": config.num_gpu_blocks, "plain_ms_per_step": p, "shadowed_ms_per_step": s,
            "ratio": s / p, "calls_checked": checked}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default=",".join(map(str, DEFAULT_NS)))
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES))
    ap.add_argument("--steps", type=int, default=None, help="timed steps per repeat (default: by N)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the results here (refuses an existing file)")
    ap.add_argument("--blocks", type=int, default=0,
                    help="a KV pool of at least this many blocks (default: sized to N, a few hundred at N = 10)")
    ap.add_argument("--checks", default=",".join(CHECKS),
                    help="how the shadowed side checks: incremental (an engine's default: the spec's state carried, "
                         "what each call changed read), full (the whole post-state lifted each call), relift "
                         "(pre-states lifted too, as peer-tests runs)")
    ap.add_argument("--full-every", type=int, default=FULL_EVERY,
                    help=f"incremental: a full check every this many calls (default {FULL_EVERY})")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time steps by the wall clock (default) or by the thread's CPU time")
    a = ap.parse_args()
    if a.clock == "cpu":
        import spec_vs_vllm

        spec_vs_vllm.perf = time.thread_time  # what VllmSide.step times its calls with
    ns = [int(x) for x in a.n.split(",")]
    modes = a.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        print(f"--modes: unknown mode {unknown[0]!r}; known: {', '.join(MODES)}", file=sys.stderr)
        return 2
    checks = a.checks.split(",")
    if any(c not in CHECKS for c in checks):
        print(f"--checks: unknown check {next(c for c in checks if c not in CHECKS)!r}; known: {', '.join(CHECKS)}",
              file=sys.stderr)
        return 2
    if a.full_every < 1:
        print(f"--full-every: {a.full_every} is not a number of calls >= 1", file=sys.stderr)
        return 2
    if a.json and Path(a.json).exists():
        print(f"--json: {a.json} exists; not overwriting it", file=sys.stderr)
        return 2
    results = []
    try:
        for mode in modes:
            for n in ns:
                for check in checks:
                    results.append(measure(mode, n, a.steps or auto_steps(n), a.repeat, check, a.blocks,
                                           a.full_every))
    except Mismatch as e:
        print(f"monitor_overhead: {e}", file=sys.stderr)
        return 1
    print("| mode | N | KV blocks | check | plain vLLM ms/step | shadowed ms/step | shadowed / plain "
          "| full check ms (every K calls) |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for r in results:
        full = f"{r['full_check_ms']:.3f} (K = {r['full_every']})" if r["full_check_ms"] is not None else ""
        print(f"| {r['mode']} | {r['n']} | {r['num_gpu_blocks']} | {r['check']} | {r['plain_ms_per_step']:.3f} "
              f"| {r['shadowed_ms_per_step']:.3f} | {r['ratio']:.2f} | {full} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": machine(), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
