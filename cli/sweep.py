"""`schedspec sweep`: a workload under a grid of configs, in one torch batch.

    schedspec sweep table3-b16 --set max_num_scheduled_tokens=8,16,32 --set max_num_seqs=4,16
    schedspec sweep --seed 7 --scenarios 20 --set policy=fcfs,priority --plot sweep.png
    schedspec sweep my.json --set long_prefill_token_threshold=0,64,256 --json
    schedspec sweep --seed 7 --scenarios 20 --shared-prefix 32 --set enable_prefix_caching=true,false

Exit status: 0 (rejected grid points are rows of the table, not errors), 2 user error.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from .args import int_arg
from schedspec.reference.errors import UsageError, shown

from .common import add_time_model_arguments, load_scenario_or_fail, standalone_main
from .device_flag import add_device_argument, device_for


def _workloads(args):
    if args.scenario and args.seed is not None:
        raise UsageError("give a workload SCENARIO or --seed N, not both")
    if args.scenario:
        if args.num_scenarios is not None:
            raise UsageError("--scenarios N goes with --seed (a random workload), not with a scenario file")
        from schedspec.reference.example_files import resolve_scenario_path

        return [load_scenario_or_fail(args.scenario, args.modelled_release)], [Path(resolve_scenario_path(args.scenario))]
    if args.seed is None:
        raise UsageError("no workload: give a scenario file or example name, or --seed N [--scenarios K]")
    k = 1 if args.num_scenarios is None else args.num_scenarios
    if k < 1:
        raise UsageError(f"--scenarios must be at least 1, got {k}")
    from schedspec.reference.generator import generate_scenario, scenario_rng

    return [dataclasses.replace(generate_scenario(scenario_rng(args.seed, i), i), name=f"random-s{args.seed}-{i}")
            for i in range(k)], []


def cmd_sweep(args) -> int:
    from schedspec.gpu.sweep import format_table, parse_set, plot_sweep, run_sweep

    axes = parse_set(args.set or [])
    if args.impl == "torch":
        for flag, given in (("--workers", args.workers), ("--ray", args.ray)):
            if given:
                raise UsageError(f"{flag}: torch steps the whole grid in one batch; {flag} is for --impl spec")
    elif args.device is not None:
        raise UsageError("--device is for --impl torch; the spec runs on the CPU")
    device = device_for(args.device, ["torch"])
    workloads, inputs = _workloads(args)
    if args.shared_prefix is not None:
        from schedspec.gpu.sweep import with_shared_prefix

        workloads = with_shared_prefix(workloads, args.shared_prefix)
    plot_path = None
    if args.plot is not None:
        from schedspec.reference.outputs import check_plot_path, plot_format

        if plot_format(args.plot) != "png":
            raise UsageError(f"--plot {shown(args.plot)}: sweep draws PNG only; end the name in .png")
        plot_path = check_plot_path(args.plot, "--plot", inputs)
    from schedspec.reference.progress import Progress

    workers = 1
    if args.impl == "spec":
        from schedspec.reference.workers import default_workers

        workers = args.workers or default_workers()
        if args.ray is not None and args.workers is None:
            from schedspec.reference.ray_workers import RayUnavailable, cluster_cpus

            try:
                workers = cluster_cpus(args.ray)
            except RayUnavailable as e:
                raise UsageError(str(e)) from None
    bar = Progress("sweep: torch batch, step" if args.impl == "torch" else "sweep: spec, scenario", 1, min_total=1)
    try:
        result = run_sweep(workloads, axes, device=device, step_ms=args.step_ms, token_ms=args.token_ms,
                           progress=bar if bar.enabled else None, impl=args.impl, workers=workers,
                           ray_address=args.ray)
    finally:
        bar.close()
    if plot_path is not None:
        plot_sweep(result, plot_path)
        result["plot"] = str(plot_path)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(format_table(result))
        if plot_path is not None:
            print(f"plot written to {plot_path}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", help="what-if: a workload under a grid of config values, in one torch batch",
        description="Run one workload (a scenario, or --seed N random ones) under every combination of the "
                    "--set values, all scenarios stepped at once by the torch implementation; print "
                    "throughput, TTFT and latency percentiles and preemptions per grid point.")
    p.add_argument("scenario", nargs="?", metavar="SCENARIO",
                   help="a scenario file or the name of a shipped example (`schedspec examples` lists them)")
    p.add_argument("--seed", type=int_arg(0, 2**63 - 1), metavar="N", help="a random workload: generator scenarios of this seed")
    p.add_argument("--scenarios", dest="num_scenarios", type=int_arg(1, 100_000), metavar="K",
                   help="with --seed: K random scenarios pooled per grid point (default 1)")
    p.add_argument("--set", action="append", metavar="FIELD=V1,V2,...",
                   help="a config field and its values (JSON scalars); repeat for more axes; the grid is the product")
    p.add_argument("--plot", metavar="FILE.png",
                   help="write the four-panel chart here (PNG; an existing file is replaced only if schedspec drew it)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--shared-prefix", type=int_arg(0, 2**30), metavar="N",
                   help="give every request of the workload a shared system prompt of its first N tokens (one "
                        "prefix group per workload), for --set enable_prefix_caching=true,false")
    p.add_argument("--impl", choices=("torch", "spec"), default="torch",
                   help="torch (default: the whole grid in one batch) or spec (the executable specification, one "
                        "scenario at a time on --workers processes); the table is the same")
    p.add_argument("--workers", type=int_arg(1, 4096), metavar="N",
                   help="with --impl spec: worker processes (default: the cores)")
    p.add_argument("--ray", metavar="ADDRESS", help="with --impl spec: run the workers on a Ray cluster (auto or HOST:PORT)")
    add_time_model_arguments(p)
    add_device_argument(p)
    p.set_defaults(func=cmd_sweep)


def main(argv: list[str] | None = None) -> int:
    """`schedspec sweep ...` without the `schedspec` front: python -m schedspec.cli.sweep."""
    return standalone_main("sweep", register, argv)


if __name__ == "__main__":
    sys.exit(main())
