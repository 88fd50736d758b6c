"""`schedspec peer-tests`: vLLM's own scheduler tests (tests/v1/core) on this
machine, plain and under the spec's shadow monitor; the newest modelled release's
(spec/versions.py DEFAULT_RELEASE), or with `--version X` release X's (its sdist, its
tests, its interpreter from `schedspec install-vllm --version X`, the spec modelling X).

    schedspec peer-tests                       # the five scheduler test files, plain and shadowed
    schedspec peer-tests --version 0.30.0      # vLLM 0.30.0's own tests against the spec gated to 0.30.0
    schedspec peer-tests --plain               # vLLM alone, no monitor
    schedspec peer-tests --plain-for failures  # shadowed, then plain only what failed or diverged (CI)
    schedspec peer-tests --all                 # all of tests/v1/core
    schedspec peer-tests --files test_scheduler.py -k "test_add_requests or test_schedule"
    schedspec peer-tests --sdist vllm-0.34.0.tar.gz --json-out peer.json

The source distribution is downloaded by `pip download` (this interpreter's pip,
so your pip configuration applies) and is kept in the cache (SCHEDSPEC_CACHE or
--cache).
Exit status: 0 no divergence and every test that passes plain passes under the
monitor; 1 otherwise; 2 user error.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from .args import int_arg
from schedspec.reference.errors import UsageError, shown, status
from schedspec.reference.workers import default_workers
from schedspec.reference.outputs import check_output_dir, check_output_path
from schedspec.monitor.peer_extract import DEFAULT_FILES, TEST_ROOT
from schedspec.monitor.peer_fetch import VLLM_VERSION, check_version
from schedspec.monitor.peer_report import format_table
from schedspec.monitor.peer_tests import PeerTestOptions, run_peer_tests
from schedspec.spec.versions import RELEASES

from .common import standalone_main


def _replaceable(path: Path) -> bool:
    return True


def check_json_out(path: str, force: bool) -> Path:
    """--json-out: an existing file is replaced only with --force (never a
    folder or a device, with or without it)."""
    out = check_output_path(path, "--json-out", ours=_replaceable)
    if out.exists() and not force:
        raise UsageError(f"--json-out {shown(path)} exists; not overwriting it (--force replaces it)")
    return out


def write_json(path: Path, data) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as e:
        raise UsageError(f"--json-out {shown(str(path))}: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def cmd_peer_tests(args) -> int:
    if args.all and args.files:
        raise UsageError("give --all or --files, not both")
    if args.plain and args.vectors_out is not None:
        raise UsageError("--vectors-out needs the shadowed run; drop --plain")
    if args.plain and args.plain_for != "all":
        raise UsageError("--plain-for needs the shadowed run; drop --plain")
    # Outputs are checked before anything is fetched or run.
    json_out = check_json_out(args.json_out, args.force) if args.json_out is not None else None
    vectors = check_output_dir(args.vectors_out, "--vectors-out") if args.vectors_out is not None else None
    if args.keyword is not None and not args.keyword.strip():
        raise UsageError("-k: empty expression")
    version = check_version(args.version)
    options = PeerTestOptions(files=args.files or None, all_files=args.all, keyword=args.keyword,
                              plain_only=args.plain, plain_for=args.plain_for, sdist=args.sdist, cache=args.cache,
                              vectors_dir=str(vectors) if vectors is not None else None,
                              workers=args.workers or default_workers(), version=version)
    table = run_peer_tests(options, status=status)
    print(format_table(table))
    run = table.get("run", {})
    times = ", ".join(f"{m} {run[f'{m}_seconds']:.0f} s" for m in table["modes"] if f"{m}_seconds" in run)
    if run.get("default_files_absent"):
        print(f"default files vLLM {version} does not have: {', '.join(run['default_files_absent'])}")
    if run.get("plain_for") == "failures" and not args.plain:
        print(f"plain run: only the tests that failed or diverged under the monitor (not those that failed on "
              f"a missing package before any scheduler call); the plain outcome of "
              f"{run.get('plain_inferred', 0)} others is their shadowed one (--plain-for failures)")
    print(f"pytest: {times}; output in {shown(run.get('run_dir', '?'), 300)}")
    if json_out is not None:
        write_json(json_out, table)
        print(f"table written to {shown(str(json_out), 300)}")
    return table["exit_status"]


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "peer-tests", help=f"run vLLM's own scheduler tests ({VLLM_VERSION}'s, or --version X's), plain and "
                           "under the shadow monitor",
        description=f"Fetch vLLM's source distribution ({VLLM_VERSION}, or --version X) from the package index pip "
                    f"is configured with, extract {TEST_ROOT} (and only the helpers it imports), and run its "
                    "tests with pytest, offline on the CPU, under that release's interpreter: once plain and "
                    "once with every scheduler call checked against the spec modelling that release. "
                    "Prints per file: tests, passed plain, passed shadowed, calls checked, "
                    "calls outside the spec's scope, divergences, monitor errors. A test that fails plain "
                    "is not counted against the spec. Exit 1 on a divergence or on a test that passes "
                    "plain and fails shadowed.")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help=f"run all of {TEST_ROOT}")
    which.add_argument("--files", nargs="+", metavar="FILE",
                       help=f"test files of {TEST_ROOT} (or node ids FILE::TEST); default: "
                            f"{', '.join(DEFAULT_FILES)} (those the release has)")
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="only tests matching EXPR (pytest's -k)")
    p.add_argument("--plain", action="store_true", help="run vLLM's tests without the monitor only")
    p.add_argument("--plain-for", choices=("all", "failures"), default="all",
                   help="all (default): every test also runs plain; failures: only the tests that fail or "
                        "diverge under the monitor run plain again (the same verdict, about half the time: a "
                        "monitor that only observes cannot make a failing test pass, so the plain outcome of "
                        "the others is taken from the shadowed run; nor make one fail on a package this "
                        "machine lacks before any scheduler call, so such a failure is taken too)")
    p.add_argument("--version", default=VLLM_VERSION, metavar="X",
                   help=f"the vLLM release whose tests run, on its own interpreter (`schedspec install-vllm "
                        f"--version X`), against the spec gated to X: {', '.join(RELEASES)} "
                        f"(default {VLLM_VERSION})")
    p.add_argument("--sdist", metavar="PATH", help="use this vllm-X.tar.gz (of --version X) instead of "
                                                    "downloading it")
    p.add_argument("--cache", metavar="DIR",
                   help="folder for the download and the extracted tests (default $SCHEDSPEC_CACHE/peer-tests, "
                        "else $XDG_CACHE_HOME/schedspec/peer-tests or ~/.cache/schedspec/peer-tests)")
    p.add_argument("--vectors-out", metavar="DIR",
                   help="folder for the state vector of each divergence (default: the run's folder in the cache)")
    p.add_argument("--workers", type=int_arg(1, 4096), metavar="N",
                   help="pytest sessions at once (default: the cores): plain beside shadowed, and from 4 on "
                        "the files split between sessions; the table is the same whatever N is")
    p.add_argument("--json-out", metavar="PATH", help="also write the table as JSON to PATH")
    p.add_argument("--force", action="store_true", help="let --json-out replace an existing file")
    p.set_defaults(func=cmd_peer_tests)


def main(argv: list[str] | None = None) -> int:
    """`schedspec peer-tests ...` without the `schedspec` front: python -m schedspec.cli.peer_tests."""
    return standalone_main("peer-tests", register, argv)


if __name__ == "__main__":
    sys.exit(main())
