"""`schedspec vectors`: write and replay state vectors (docs/formats.md, "State vectors").

    schedspec vectors export --scenarios 50 --seed 7 --out vectors/
    schedspec vectors export table3-b16 my-scenario.json --out vectors/
    schedspec vectors check --impl mypkg.sched:MyScheduler vectors/

`export` runs scenarios on the engine and writes one vector per scheduler call
(pre-state, call, the spec's result and post-state) to OUT/<scenario>/<NNNNN>-<call>.json.
It refuses a non-empty OUT unless --force, and never replaces a file.
`check` sets the implementation to each vector's pre-state (its load_state()),
makes the call and compares.  Exit status: 0 all agree, 1 some difference,
2 user error (a bad file: one line naming the file and the field).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .args import int_arg
from schedspec.reference.errors import UsageError, shown
from schedspec.reference.progress import Progress
from schedspec.reference.vectors import (ExportError, VectorError, can_load_state, check_vector, export_campaign,
                                         implementation_name, read_vector, vector_files)

from .common import load_impl_or_fail, standalone_main
from .diff import flags_arg
from .vllm_version import add_vllm_version_argument

# Differing vectors whose differences `check` prints; the rest are counted.
SHOWN_VECTORS = 5
SHOWN_DIFFERENCES = 8


def _refuse_non_empty(out: Path, force: bool) -> None:
    if out.is_dir() and not force and any(out.iterdir()):
        raise UsageError(f"--out {shown(str(out))} is not empty; give an empty or new folder, or --force to add "
                         "the vectors beside what is there (no file is replaced or deleted)")


def cmd_export(args) -> int:
    from schedspec.reference.outputs import check_output_dir
    from schedspec.reference.campaign import close_impl, load_scenario_files, random_scenarios
    from schedspec.reference.generator import flags_for, unmodelled_flags

    if args.files and args.num_scenarios:
        raise UsageError("give scenario files or --scenarios N, not both")
    if not args.files and not args.num_scenarios:
        raise UsageError("nothing to export: give scenario files (or shipped example names) or --scenarios N")
    out = check_output_dir(args.out, "--out")
    _refuse_non_empty(out, args.force)
    flags = args.flags or flags_for("spec", args.impl)
    reason = unmodelled_flags(flags, args.impl)
    if reason:
        raise UsageError(reason)
    # Scenario files are read first, so a bad one fails before anything is written.
    files = [s for s, _ in load_scenario_files(args.files, args.modelled_release)]
    total = len(files) or args.num_scenarios
    scenarios = files or (s for s, _ in random_scenarios(args.num_scenarios, args.seed, flags, args.modelled_release))
    impl = load_impl_or_fail(args.impl) if args.impl != "spec" else None
    progress = Progress("export", total, min_total=20)
    try:
        count = export_campaign(out, scenarios, args.impl, impl=impl,
                                on_scenario=lambda done, _: progress(done))
    except (ExportError, VectorError) as e:
        raise UsageError(str(e)) from None
    finally:
        progress.close()
        if impl is not None:
            close_impl(impl)
    print(f"{count} vectors from {total} scenarios written to {shown(str(out), 300)}")
    return 0


def cmd_check(args) -> int:
    out = sys.stdout
    try:
        files = vector_files(args.paths)
    except VectorError as e:
        raise UsageError(str(e)) from None
    if not files:
        raise UsageError(f"no vector files (*.json) in {', '.join(shown(p) for p in args.paths)}")
    impl = load_impl_or_fail(args.impl)
    if not can_load_state(impl):
        raise UsageError(f"implementation {shown(args.impl)} cannot be set to a given state: it has no "
                         "load_state() (reference/impl.py, StateLoadable)")
    name = implementation_name(impl)
    agreed, differed = 0, []
    progress = Progress("check", len(files), min_total=200)
    try:
        for k, path in enumerate(files, 1):
            try:
                vector = read_vector(path)
                found = check_vector(vector, impl)
            except VectorError as e:
                raise UsageError(f"{e}" if str(e).startswith(str(path)) else f"{path}: {e}") from None
            if found:
                differed.append((path, vector["call"]["name"], found))
            else:
                agreed += 1
            progress(k)
    finally:
        progress.close()
        close = getattr(impl, "close", None)
        if close:
            close()
    print(f"vectors: {len(files)} checked on {shown(name)}, {agreed} agreed, {len(differed)} differed", file=out)
    for path, call, found in differed[:SHOWN_VECTORS]:
        print(f"DIFFERS {shown(str(path), 300)} ({call}):", file=out)
        for line in found[:SHOWN_DIFFERENCES]:
            print(f"  {shown(line, 400)}", file=out)
        if len(found) > SHOWN_DIFFERENCES:
            print(f"  ... {len(found) - SHOWN_DIFFERENCES} more", file=out)
    if len(differed) > SHOWN_VECTORS:
        print(f"... and {len(differed) - SHOWN_VECTORS} more differing vectors", file=out)
    return 1 if differed else 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "vectors", help="state vectors: export checked scheduler transitions as JSON, replay them",
        description="State vectors (docs/formats.md): one JSON file per scheduler call, with the state "
                    "before, the call, the specification's result and the state after.")
    sub = p.add_subparsers(dest="vectors_command", required=True, metavar="ACTION")

    e = sub.add_parser("export", help="run scenarios and write one vector per scheduler call",
                       description="Run scenarios (files, shipped examples or seeded random ones) on the engine "
                                   "and write one vector per scheduler call to OUT/<scenario>/<NNNNN>-<call>.json.")
    e.add_argument("files", nargs="*", metavar="SCENARIO",
                   help="scenario files or names of shipped examples (`schedspec examples` lists them)")
    e.add_argument("--scenarios", dest="num_scenarios", type=int_arg(1, 10_000_000), metavar="N",
                   help="N random scenarios (reproducible with --seed)")
    e.add_argument("--seed", type=int_arg(0, 2**63 - 1), default=0, metavar="N",
                   help="seed of the random scenarios (default 0)")
    e.add_argument("--flags", type=flags_arg, metavar="LIST",
                   help="the engine-flag combinations random scenarios draw: all (default), or a comma-separated "
                        "list of sync, sync+prefix, async, async+prefix")
    e.add_argument("--out", required=True, metavar="DIR", help="the folder to write to (new or empty)")
    e.add_argument("--force", action="store_true",
                   help="write into a non-empty --out folder; existing files are kept, never replaced")
    e.add_argument("--impl", default="spec",
                   help="the implementation run (default spec); with another, the spec still gives each "
                        "vector's expected result and `observed` records where they differ")
    add_vllm_version_argument(e)  # each vector names its release (pre_state.config.vllm_version)
    e.set_defaults(func=cmd_export)

    c = sub.add_parser("check", help="replay vectors on an implementation; exit 1 on any difference",
                       description="Set the implementation to each vector's pre-state (load_state()), make the "
                                   "call, and compare its result and state with the vector's. Exit 1 on any "
                                   "difference, 2 on a bad file.")
    c.add_argument("paths", nargs="+", metavar="PATH", help="vector files or folders (searched for *.json)")
    c.add_argument("--impl", default="spec",
                   help="the implementation to check: spec (default) or module:Class; it needs load_state()")
    c.set_defaults(func=cmd_check)


def main(argv: list[str] | None = None) -> int:
    """`schedspec vectors ...` without the `schedspec` front: python -m schedspec.cli.vectors."""
    return standalone_main("vectors", register, argv)


if __name__ == "__main__":
    sys.exit(main())
