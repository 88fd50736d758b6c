"""`schedspec diff`: differential testing from the command line.

    schedspec diff --impl vllm [--against spec] SCENARIO...
    schedspec diff --impl vllm --scenarios 2000 --seed 7 [-o DIR] [--json]
    schedspec diff --impl vllm --configs 500 --seed 7

On a divergence the scenario is written to `-o DIR` (default ./divergences,
never overwriting a file); a random scenario is also shrunk to a small one that
still diverges, whose `description` is the command that reproduces it.
Exit status: 0 all agree, 1 some divergence, 2 user error (every scenario file
given refused by both implementations included: each is named with the reason).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .args import float_arg, int_arg
from schedspec.reference.errors import UsageError, fail, shown
from schedspec.reference.errors import status as status_line
from schedspec.reference.campaign import (
    CampaignOptions,
    Execution,
    campaign_flags,
    close_impl,
    deterministic_report,
    load_scenario_files,
    run_campaign,
    run_config_agreement,
)

from .common import load_impl_or_fail, standalone_main
from .device_flag import add_device_argument, device_for, impl_device
from .vllm_version import add_vllm_version_argument


def flags_arg(text: str):
    """argparse type of `--flags`: reference/generator.py `parse_flags`."""
    from schedspec.reference.generator import parse_flags

    try:
        return parse_flags(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: The defaults of the flags that define a campaign; None in the parser, so that
#: `--resume DIR` can tell a flag given from one left alone.
DEFAULTS = {"impl": "vllm", "against": "spec", "seed": 0, "out": "divergences", "shrink_seconds": 120.0}
#: Flags `--resume DIR` takes from DIR/campaign.json instead.
RESUME_TAKES = {"files": "SCENARIO", "num_scenarios": "--scenarios", "configs": "--configs", "seed": "--seed",
                "impl": "--impl", "against": "--against", "flags": "--flags", "out": "-o",
                "no_shrink": "--no-shrink", "shrink_seconds": "--shrink-seconds", "device": "--device",
                "batch_size": "--batch-size", "results": "--results"}
#: With the default --workers, a worker is started per this many scenarios at most:
#: each loads its implementations (vLLM: about 12 s), which a short campaign does not repay.
SCENARIOS_PER_WORKER = 25


def campaign_options(args: argparse.Namespace, device: str | None, outdir: Path) -> CampaignOptions:
    """The campaign the flags describe; `device` and `outdir` as checked."""
    return CampaignOptions(
        impl=args.impl, against=args.against, seed=args.seed, num_scenarios=args.num_scenarios,
        configs=args.configs, flags=args.flags, device=device, batch_size=args.batch_size, out_dir=outdir,
        shrink=not args.no_shrink, shrink_seconds=args.shrink_seconds, quiet=args.json,
        scenario_timeout=args.scenario_timeout, release=args.modelled_release)


def execution_for(args: argparse.Namespace, pending: int, batched: bool, store, done, devices) -> Execution:
    """Where the campaign runs: --workers (default: the cores, at most one per
    SCENARIOS_PER_WORKER scenarios) processes, or Ray actors with --ray."""
    from schedspec.reference.workers import default_workers

    if batched:
        for flag, given in (("--workers", args.workers is not None and args.workers > 1), ("--ray", args.ray),
                            ("--results", args.results), ("--resume", args.resume)):
            if given:
                raise UsageError(f"{flag}: torch against the spec steps whole batches in this process; drop {flag}")
        return Execution()
    if args.ray is not None:
        from schedspec.reference.ray_workers import RayUnavailable, cluster_cpus

        try:
            workers = args.workers or cluster_cpus(args.ray)
        except RayUnavailable as e:
            raise UsageError(str(e)) from None
        return Execution(workers=workers, ray_address=args.ray, store=store, done=done, devices=devices)
    workers = args.workers or max(1, min(default_workers(), -(-pending // SCENARIOS_PER_WORKER)))
    return Execution(workers=workers, store=store, done=done, devices=devices)


def resumed_campaign(args: argparse.Namespace):
    """`--resume DIR`: the store, the campaign's options, its files and the results it holds."""
    from schedspec.reference.campaign_store import ResultStore, options_from_campaign

    given = [flag for key, flag in RESUME_TAKES.items() if getattr(args, key) not in (None, False, [])]
    if given:
        raise UsageError(f"--resume takes the campaign from {shown(args.resume)}/campaign.json; drop {given[0]}")
    store = ResultStore(Path(args.resume))
    data = store.read_campaign()
    base = CampaignOptions(impl=DEFAULTS["impl"], quiet=args.json, scenario_timeout=args.scenario_timeout,
                           release=args.modelled_release)
    options = options_from_campaign(data, base)
    files = load_scenario_files([f["path"] for f in data["files"]], options.release)
    return store, options, files, store.resume()


def _new_campaign(args: argparse.Namespace):
    """A campaign the flags describe (no --resume): its store (--results) or None, its
    options, its scenario files and its device.  Defaults fill the flags not given."""
    for key, value in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    store = None
    if args.files and args.num_scenarios:
        raise UsageError("give scenario files or --scenarios N, not both")
    if not args.files and not args.num_scenarios and not args.configs:
        raise UsageError("nothing to compare: give scenario files, --scenarios N or --configs N")
    if args.impl == args.against:
        raise UsageError(f"--impl and --against are both {shown(args.impl)}; compare two implementations")
    from schedspec.reference.outputs import check_output_dir

    outdir = check_output_dir(args.out, "-o")
    device = device_for(args.device, (args.impl, args.against))
    options = campaign_options(args, device, outdir)
    campaign_flags(options)  # --flags that torch cannot honour fail before any loading
    # Load the scenario files first, so a bad file fails before the slow imports.
    scenarios = load_scenario_files(args.files, options.release)
    if args.results and (args.files or args.num_scenarios):
        from schedspec.reference.campaign_store import ResultStore, describe_campaign
        from schedspec.reference.example_files import resolve_scenario_path

        store = ResultStore(Path(args.results))
        store.start(describe_campaign(options, [resolve_scenario_path(f) for f in args.files]))
    return store, options, scenarios, device


def _config_agreement(args: argparse.Namespace, options: CampaignOptions, devices, out) -> dict[str, Any]:
    """`--configs N`: both implementations judge the same random configs; the result, printed
    unless --json."""
    impl_a = load_impl_or_fail(args.impl, devices[0])
    impl_b = load_impl_or_fail(args.against, devices[1])
    try:
        res = run_config_agreement(options, impl_a, impl_b, out)
    finally:
        close_impl(impl_a)
        close_impl(impl_b)
    if not args.json:
        print(f"configs: {res['configs']}  both accept: {res['both_accept']}  both reject: "
              f"{res['both_reject']}  disagreements: {len(res['disagreements'])}", file=out)
    return res


def _scenario_campaign(args: argparse.Namespace, options: CampaignOptions, scenarios, store, done, devices,
                      out) -> dict[str, Any]:
    """The scenarios compared, where --workers, --ray or a torch batch says; the store
    (--results) gets the report."""
    from schedspec.gpu.campaign import is_batched_pair, run_batched_campaign

    if is_batched_pair(args.impl, args.against):
        execution_for(args, 0, True, None, {}, devices)  # refuses what a batch cannot do
        return run_batched_campaign(options, scenarios, out)  # torch steps whole batches
    pending = len(scenarios) + (options.num_scenarios or 0) - len(done)
    execution = execution_for(args, pending, False, store, done, devices)
    if not args.json and execution.workers > 1:
        where = f"Ray at {args.ray}" if execution.ray_address else "processes"
        status_line(f"{execution.workers} workers ({where}); each loads {shown(args.impl)} and "
                    f"{shown(args.against)} once")
    res = run_campaign(options, scenarios, out, execution)
    if store is not None:
        path = store.finish(deterministic_report(res))
        if not args.json:
            print(f"results: {store.dir} (report: {path})", file=out)
    return res


def _print_load_times(report: dict[str, Any], out) -> None:
    # Loading vLLM takes about 20 s; the campaign's time above leaves it out.
    print("load time per worker (not in the figures above): "
          + ", ".join(f"{shown(k)} " + " ".join(f"{v:.1f}" for v in vs) + " s"
                      for k, vs in report["load_seconds"].items() if vs), file=out)


def cmd_diff(args) -> int:
    out = sys.stdout
    if args.resume:
        store, options, scenarios, done = resumed_campaign(args)
        device = options.device
        args.impl, args.against = options.impl, options.against
    else:
        store, options, scenarios, device = _new_campaign(args)
        done = {}
    from schedspec.reference.loader import ImplementationError, check_impl_name

    for name in (args.impl, args.against):  # before any worker starts to load it
        try:
            check_impl_name(name)
        except ImplementationError as e:
            raise UsageError(str(e)) from None
    devices = (impl_device(args.impl, device), impl_device(args.against, device))
    report: dict[str, Any] = {"implementations": [args.impl, args.against]}
    status = 0
    try:
        if options.configs:
            res = _config_agreement(args, options, devices, out)
            report["config_agreement"] = res
            if res["disagreements"]:
                status = 1
        if scenarios or options.num_scenarios:
            res = _scenario_campaign(args, options, scenarios, store, done, devices, out)
            report.update(res)
            if res["divergences"] or res.get("failures"):
                status = 1
            elif scenarios and not options.num_scenarios and len(res.get("rejected", ())) == len(scenarios):
                status = 2  # every file given was refused by both: nothing compared, a bad input
    except KeyboardInterrupt:
        if store is not None:
            store.close()
            fail(f"interrupted; the finished scenarios are in {store.dir}: continue with "
                 f"schedspec diff --resume {store.dir}", 130)
        raise
    finally:
        if store is not None:
            store.close()
    if args.json:
        print(json.dumps(report, indent=1), file=out)
    elif "load_seconds" in report:
        _print_load_times(report, out)
    return status


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "diff", help="differential test: two implementations on the same scenarios",
        description="Run two implementations (default: vllm against the spec) on the same scenarios "
                    "and compare their traces step by step. Exit 1 on any divergence.")
    p.add_argument("files", nargs="*", metavar="SCENARIO",
                   help="scenario files or names of shipped examples (`schedspec examples` lists them)")
    p.add_argument("--impl",
                   help="the implementation under test: vllm (default; loading takes about 20 s), spec, torch "
                        "or module:Class")
    p.add_argument("--against", help="the reference implementation (default spec, the "
                   "executable specification); same choices as --impl")
    p.add_argument("--scenarios", dest="num_scenarios", type=int_arg(1, 10_000_000), metavar="N",
                   help="N random scenarios (reproducible with --seed)")
    p.add_argument("--seed", type=int_arg(0, 2**63 - 1), metavar="N",
                   help="seed of the random scenarios and configs (default 0)")
    p.add_argument("--configs", type=int_arg(1, 10_000_000), metavar="N",
                   help="config agreement: N random configs near the acceptance boundaries")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-o", "--out", metavar="DIR",
                   help="where diverging scenarios are written (default ./divergences)")
    p.add_argument("--no-shrink", action="store_true", help="do not shrink diverging random scenarios")
    p.add_argument("--shrink-seconds", type=float_arg(0.0, 86400.0, lo_open=True), metavar="S",
                   help="time budget for shrinking one divergence (default 120)")
    add_device_argument(p)
    add_vllm_version_argument(p)  # and --impl vllm==X: cli/vllm_version.py
    p.add_argument("--batch-size", type=int_arg(1, 1_000_000), metavar="N",
                   help="torch against the spec: scenarios stepped at once by torch (default 1024)")
    p.add_argument("--flags", type=flags_arg, metavar="LIST",
                   help="the engine-flag combinations random scenarios draw (prefix caching, async scheduling): all, or "
                        "a comma-separated list of sync, sync+prefix, async, async+prefix; default all, or sync "
                        "when torch takes part")
    g = p.add_argument_group("where the campaign runs (docs/campaigns.md)")
    g.add_argument("--workers", type=int_arg(1, 4096), metavar="N",
                   help="worker processes, each loading both implementations once (default: the cores, at most one "
                        f"per {SCENARIOS_PER_WORKER} scenarios); the report is the same whatever N is")
    g.add_argument("--ray", metavar="ADDRESS",
                   help="run the workers on a Ray cluster: auto, or HOST:PORT of its head (pip install "
                        "'schedspec[ray]'); --workers then defaults to the cluster's CPUs")
    g.add_argument("--results", metavar="DIR",
                   help="stream each scenario's result to DIR (a new folder) as it arrives, and the report to "
                        "DIR/report.json at the end, so that an interrupted campaign can be resumed")
    g.add_argument("--resume", metavar="DIR",
                   help="continue the campaign whose results are in DIR, running only the scenarios it lacks")
    g.add_argument("--scenario-timeout", type=float_arg(0.0, 86400.0, lo_open=True), default=300.0, metavar="S",
                   help="seconds a worker may spend on one scenario (its shrink aside) before it is stopped and "
                        "the scenario reported as hung (default 300)")
    p.set_defaults(func=cmd_diff)


def main(argv: list[str] | None = None) -> int:
    """`schedspec diff ...` without the `schedspec` front: python -m schedspec.cli.diff."""
    return standalone_main("diff", register, argv)


if __name__ == "__main__":
    sys.exit(main())
