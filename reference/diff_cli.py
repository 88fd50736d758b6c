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

from ..errors import UsageError
from .campaign import _load_impl, _run_scenarios, _scenarios, _Timed, run_config_agreement


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
        raise UsageError(f"--impl and --against are both {args.impl!r}; compare two implementations")
    outdir = Path(args.out)
    if outdir.exists() and not outdir.is_dir():
        raise UsageError(f"-o {args.out} exists and is not a folder")
    from ..gpu.campaign import is_batched_pair, run_batched_campaign
    from ..gpu.device_flag import device_for, impl_device

    device = device_for(args.device, (args.impl, args.against))
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    # Load the scenario files first, so a bad file fails before the slow imports.
    scenarios = list(_scenarios(argparse.Namespace(files=args.files, num_scenarios=None, seed=args.seed)))
    impl_a = _load_impl(args.impl, impl_device(args.impl, device))
    impl_b = _load_impl(args.against, impl_device(args.against, device))
    a, b = _Timed(impl_a), _Timed(impl_b)
    report: dict[str, Any] = {"implementations": [args.impl, args.against]}
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
    return status


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "diff", help="differential test: two implementations on the same scenarios",
        description="Run two implementations (default: vllm against the spec) on the same scenarios "
                    "and compare their traces step by step. Exit 1 on any divergence.")
    p.add_argument("files", nargs="*", metavar="SCENARIO", help="scenario files or example names")
    p.add_argument("--impl", default="vllm", help="the implementation under test (default vllm)")
    p.add_argument("--against", default="spec", help="the reference implementation (default spec)")
    p.add_argument("--scenarios", dest="num_scenarios", type=int, metavar="N",
                   help="N random scenarios (reproducible with --seed)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random scenarios and configs (default 0)")
    p.add_argument("--configs", type=int, metavar="N",
                   help="config agreement: N random configs near the acceptance boundaries")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-o", "--out", default="divergences", metavar="DIR",
                   help="where diverging scenarios are written (default ./divergences)")
    p.add_argument("--no-shrink", action="store_true", help="do not shrink diverging random scenarios")
    p.add_argument("--shrink-seconds", type=float, default=120.0, metavar="S",
                   help="time budget for shrinking one divergence (default 120)")
    from ..gpu.device_flag import add_device_argument

    add_device_argument(p)
    p.add_argument("--batch-size", type=int, metavar="N",
                   help="torch against the spec: scenarios stepped at once by torch (default 1024)")
    p.set_defaults(func=cmd_diff)


def main(argv: list[str] | None = None) -> int:
    """`schedspec diff ...` without the `schedspec` front: python -m schedspec.reference.diff_cli."""
    from ..cli import main as cli_main

    return cli_main(["diff", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
