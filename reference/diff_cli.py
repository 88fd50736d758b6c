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
from typing import Any

from ..errors import UsageError, float_arg, int_arg, shown
from .campaign import _run_scenarios, _scenarios, _Timed, campaign_flags, flags_arg, run_config_agreement


def _load_impl(name: str, device: str | None):
    from ..cli import load_impl_or_fail  # one loader for every command: errors, the vLLM status line

    return load_impl_or_fail(name, device)


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
    from ..outputs import check_output_dir

    outdir = check_output_dir(args.out, "-o")
    from ..gpu.campaign import is_batched_pair, run_batched_campaign
    from ..gpu.device_flag import device_for, impl_device

    device = device_for(args.device, (args.impl, args.against))
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    campaign_flags(args)  # --flags that torch cannot honour fail before any loading
    # Load the scenario files first, so a bad file fails before the slow imports.
    scenarios = list(_scenarios(argparse.Namespace(files=args.files, num_scenarios=None, seed=args.seed)))
    impl_a = _load_impl(args.impl, impl_device(args.impl, device))
    impl_b = _load_impl(args.against, impl_device(args.against, device))
    a, b = _Timed(impl_a), _Timed(impl_b)
    load_seconds = {args.impl: round(getattr(impl_a, "load_seconds", 0.0), 2),
                    args.against: round(getattr(impl_b, "load_seconds", 0.0), 2)}
    report: dict[str, Any] = {"implementations": [args.impl, args.against], "load_seconds": load_seconds}
    status = 0
    try:
        if args.configs:
            res = run_config_agreement(args, impl_a, impl_b, out)
            report["config_agreement"] = res
            if res["disagreements"]:
                status = 1
            if not args.json:
                print(f"configs: {res['configs']}  both accept: {res['both_accept']}  both reject: "
                      f"{res['both_reject']}  disagreements: {len(res['disagreements'])}", file=out)
        if (args.files or args.num_scenarios) and is_batched_pair(args.impl, args.against):
            res = run_batched_campaign(args, scenarios, outdir, out, device)  # torch steps whole batches
            report.update(res)
            if res["divergences"]:
                status = 1
        elif args.files or args.num_scenarios:
            res = _run_scenarios(args, scenarios, a, b, outdir, out)
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
    from ..gpu.device_flag import add_device_argument

    add_device_argument(p)
    p.add_argument("--batch-size", type=int_arg(1, 1_000_000), metavar="N",
                   help="torch against the spec: scenarios stepped at once by torch (default 1024)")
    p.add_argument("--flags", type=flags_arg, metavar="LIST",
                   help="the engine-flag combinations random scenarios draw (prefix caching, async scheduling): all, or "
                        "a comma-separated list of sync, sync+prefix, async, async+prefix; default all, or sync "
                        "when torch takes part")
    p.set_defaults(func=cmd_diff)


def main(argv: list[str] | None = None) -> int:
    """`schedspec diff ...` without the `schedspec` front: python -m schedspec.reference.diff_cli."""
    from ..cli import main as cli_main

    return cli_main(["diff", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
