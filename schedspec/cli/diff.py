"""`schedspec diff`: differential testing from the command line.

    schedspec diff --impl vllm [--against spec] SCENARIO...
    schedspec diff --impl vllm --scenarios 2000 --seed 7 [-o DIR] [--json]
    schedspec diff --impl vllm --configs 500 --seed 7

On a divergence the scenario is written to `-o DIR` (default ./divergences,
never overwriting a file); a random scenario is also shrunk to a small one that
still diverges, whose `description` is the command that reproduces it.
Exit status: 0 all agree, 1 some divergence, 2 user error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from schedspec.base.args import float_arg, int_arg
from schedspec.base.errors import UsageError, shown
from schedspec.reference.campaign import (
    CampaignOptions,
    TimedImpl,
    campaign_flags,
    load_scenario_files,
    run_campaign,
    run_config_agreement,
)

from .common import load_impl_or_fail, standalone_main
from .device_flag import add_device_argument, device_for, impl_device


def flags_arg(text: str):
    """argparse type of `--flags`: reference/generator.py `parse_flags`."""
    from schedspec.reference.generator import parse_flags

    try:
        return parse_flags(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def campaign_options(args: argparse.Namespace, device: str | None, outdir: Path) -> CampaignOptions:
    """The campaign the flags describe; `device` and `outdir` as checked."""
    return CampaignOptions(
        impl=args.impl, against=args.against, seed=args.seed, num_scenarios=args.num_scenarios,
        configs=args.configs, flags=args.flags, device=device, batch_size=args.batch_size, out_dir=outdir,
        shrink=not args.no_shrink, shrink_seconds=args.shrink_seconds, quiet=args.json)


def cmd_diff(args) -> int:
    out = sys.stdout
    if args.files and args.num_scenarios:
        raise UsageError("give scenario files or --scenarios N, not both")
    if not args.files and not args.num_scenarios and not args.configs:
        raise UsageError("nothing to compare: give scenario files, --scenarios N or --configs N")
    for flag, v in (("--scenarios", args.num_scenarios), ("--configs", args.configs)):
        if v is not None and v < 1:
            raise UsageError(f"{flag} must be at least 1, got {v}")
    if args.impl == args.against:
        raise UsageError(f"--impl and --against are both {shown(args.impl)}; compare two implementations")
    from schedspec.base.outputs import check_output_dir

    outdir = check_output_dir(args.out, "-o")
    from schedspec.gpu.campaign import is_batched_pair, run_batched_campaign

    device = device_for(args.device, (args.impl, args.against))
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    options = campaign_options(args, device, outdir)
    campaign_flags(options)  # --flags that torch cannot honour fail before any loading
    # Load the scenario files first, so a bad file fails before the slow imports.
    scenarios = load_scenario_files(args.files)
    impl_a = load_impl_or_fail(args.impl, impl_device(args.impl, device))
    impl_b = load_impl_or_fail(args.against, impl_device(args.against, device))
    a, b = TimedImpl(impl_a), TimedImpl(impl_b)
    load_seconds = {args.impl: round(getattr(impl_a, "load_seconds", 0.0), 2),
                    args.against: round(getattr(impl_b, "load_seconds", 0.0), 2)}
    report: dict[str, Any] = {"implementations": [args.impl, args.against], "load_seconds": load_seconds}
    status = 0
    try:
        if args.configs:
            res = run_config_agreement(options, impl_a, impl_b, out)
            report["config_agreement"] = res
            if res["disagreements"]:
                status = 1
            if not args.json:
                print(f"configs: {res['configs']}  both accept: {res['both_accept']}  both reject: "
                      f"{res['both_reject']}  disagreements: {len(res['disagreements'])}", file=out)
        if args.files or args.num_scenarios:
            if is_batched_pair(args.impl, args.against):
                res = run_batched_campaign(options, scenarios, out)  # torch steps whole batches
            else:
                res = run_campaign(options, scenarios, a, b, out)
            report.update(res)
            if res["divergences"]:
                status = 1
    finally:
        a.close()
        b.close()
    if args.json:
        print(json.dumps(report, indent=1), file=out)
    else:
        # Loading vLLM takes about 20 s; the campaign's time above leaves it out.
        print("load time (not in the figures above): "
              + ", ".join(f"{shown(k)} {v:.1f} s" for k, v in load_seconds.items()), file=out)
    return status


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "diff", help="differential test: two implementations on the same scenarios",
        description="Run two implementations (default: vllm against the spec) on the same scenarios "
                    "and compare their traces step by step. Exit 1 on any divergence.")
    p.add_argument("files", nargs="*", metavar="SCENARIO",
                   help="scenario files or names of shipped examples (`schedspec examples` lists them)")
    p.add_argument("--impl", default="vllm",
                   help="the implementation under test: vllm (default; loading takes about 20 s), spec, torch "
                        "or module:Class")
    p.add_argument("--against", default="spec", help="the reference implementation (default spec, the "
                   "executable specification); same choices as --impl")
    p.add_argument("--scenarios", dest="num_scenarios", type=int_arg(1, 10_000_000), metavar="N",
                   help="N random scenarios (reproducible with --seed)")
    p.add_argument("--seed", type=int_arg(0, 2**63 - 1), default=0, metavar="N",
                   help="seed of the random scenarios and configs (default 0)")
    p.add_argument("--configs", type=int_arg(1, 10_000_000), metavar="N",
                   help="config agreement: N random configs near the acceptance boundaries")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-o", "--out", default="divergences", metavar="DIR",
                   help="where diverging scenarios are written (default ./divergences)")
    p.add_argument("--no-shrink", action="store_true", help="do not shrink diverging random scenarios")
    p.add_argument("--shrink-seconds", type=float_arg(0.0, 86400.0, lo_open=True), default=120.0, metavar="S",
                   help="time budget for shrinking one divergence (default 120)")
    add_device_argument(p)
    p.add_argument("--batch-size", type=int_arg(1, 1_000_000), metavar="N",
                   help="torch against the spec: scenarios stepped at once by torch (default 1024)")
    p.add_argument("--flags", type=flags_arg, metavar="LIST",
                   help="the engine-flag combinations random scenarios draw (prefix caching, async scheduling): all, or "
                        "a comma-separated list of sync, sync+prefix, async, async+prefix; default all, or sync "
                        "when torch takes part")
    p.set_defaults(func=cmd_diff)


def main(argv: list[str] | None = None) -> int:
    """`schedspec diff ...` without the `schedspec` front: python -m schedspec.cli.diff."""
    return standalone_main("diff", register, argv)


if __name__ == "__main__":
    sys.exit(main())
