"""`schedspec changes A B`: what changed in the scheduler's behaviour between vLLM
releases A and B, found on the spec's version gates (reference/changes.py).

    schedspec changes 0.32.0 0.33.0 --scenarios 300 --seed 1 -o changes/
    schedspec changes 0.20.0 0.33.0 --confirm        # replay each on both real releases

Each distinct rule change is one replayable scenario file `-o DIR/<gate>.json`;
with `--confirm` each is run with `schedspec diff --impl vllm==A` and
`--impl vllm==B` (each release's own environment): both must agree with the
spec, so the real releases differ as the spec's gates say.  Exit 0 when every
change found is confirmed (or --confirm is not given), 1 otherwise, 2 on a user
error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .args import float_arg, int_arg
from schedspec.reference.errors import UsageError, shown, status

from .common import standalone_main
from .vllm_version import check_release, env_python, installed_vllm


def confirm(path: Path, release: str) -> tuple[bool, str]:
    """Replay `path` on real vLLM `release` against the spec (schedspec diff)."""
    py = env_python(release) if installed_vllm() != release else Path(sys.executable)
    if not py.exists():
        return False, f"vLLM {release} not installed (schedspec install-vllm --version {release})"
    proc = subprocess.run([str(py), "-m", "schedspec", "diff", "--impl", f"vllm=={release}", str(path),
                           "--no-shrink", "-o", str(path.parent / "divergences")],
                          capture_output=True, text=True, timeout=600)
    last = (proc.stdout.strip().splitlines() or [""])[0] if proc.returncode else "agrees with the spec"
    return proc.returncode == 0, last if proc.returncode != 1 else f"diverges: {last}"


def pairs_of(args) -> list[tuple[str, str]]:
    from schedspec.spec.versions import RELEASES

    if args.adjacent:
        if args.a is not None:
            raise UsageError("give releases A B or --adjacent, not both")
        return list(zip(RELEASES, RELEASES[1:]))
    if args.a is None or args.b is None:
        raise UsageError("name two releases A B (or --adjacent for every pair of adjacent releases)")
    a, b = check_release(args.a, "A"), check_release(args.b, "B")
    if a == b:
        raise UsageError(f"A and B are both {a}; name two releases")
    return [(a, b)]


def cmd_changes(args) -> int:
    import dataclasses

    from schedspec.reference.outputs import check_output_dir
    from schedspec.reference.changes import describe, find_changes, render_markdown
    from schedspec.reference.scenario import save_scenario

    pairs = pairs_of(args)
    outdir = check_output_dir(args.out, "-o")
    report, ok = [], True
    for a, b in pairs:
        status(f"changes {a} -> {b}: {args.num_scenarios} random scenarios of seed {args.seed} on the spec")
        changes = find_changes(a, b, scenarios=args.num_scenarios, seed=args.seed,
                               shrink_seconds=args.shrink_seconds)
        for ch in changes:
            text = describe(ch, a, b)
            path = outdir / f"{'+'.join(ch.gates)}.json"
            scenario = dataclasses.replace(ch.scenario, name="+".join(ch.gates), description=text)
            save_scenario(scenario, path, overwrite=True)
            entry = {"a": a, "b": b, "gates": list(ch.gates), "file": str(path), "step": ch.step,
                     "field": ch.field, "values": {a: ch.values[0], b: ch.values[1]}, "description": text}
            print(f"CHANGE {text}\n  scenario: {shown(str(path), 300)}")
            if args.confirm:
                for release in (a, b):
                    good, why = confirm(path, release)
                    entry[f"confirmed_{release}"] = good
                    ok &= good
                    print(f"  vLLM {release}: {'confirmed' if good else 'NOT CONFIRMED'} ({shown(why, 300)})")
            report.append(entry)
        print(f"{len(changes)} rule change(s) between vLLM {a} and {b} in {args.num_scenarios} scenarios")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"changes": report}, indent=1) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(render_markdown(outdir))
        print(f"changelog written to {shown(args.markdown, 300)}")
    return 0 if ok else 1


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "changes", help="scenarios on which two vLLM releases schedule differently (the spec's version gates)",
        description="Search random scenarios for those on which vLLM releases A and B schedule differently, "
                    "on the spec with its version gates; shrink one per rule change and write it to -o DIR. "
                    "--confirm replays each on both real releases.")
    p.add_argument("a", metavar="A", nargs="?", help="a vLLM release, e.g. 0.32.0")
    p.add_argument("b", metavar="B", nargs="?", help="another release, e.g. 0.33.0")
    p.add_argument("--adjacent", action="store_true", help="every pair of adjacent releases schedspec models")
    p.add_argument("--markdown", metavar="FILE",
                   help="write the changelog (docs/changes.md) from the gates and the scenarios in -o DIR")
    p.add_argument("--scenarios", dest="num_scenarios", type=int_arg(1, 10_000_000), default=300, metavar="N",
                   help="random scenarios to search (default 300)")
    p.add_argument("--seed", type=int_arg(0, 2**63 - 1), default=1, metavar="N", help="their seed (default 1)")
    p.add_argument("-o", "--out", default="changes", metavar="DIR",
                   help="where each change's scenario is written, as <gate>.json (default ./changes)")
    p.add_argument("--shrink-seconds", type=float_arg(0.0, 86400.0, lo_open=True), default=60.0, metavar="S",
                   help="time budget for shrinking one change (default 60)")
    p.add_argument("--confirm", action="store_true",
                   help="replay each change on both real releases (schedspec diff --impl vllm==X)")
    p.add_argument("--json-out", metavar="FILE", help="also write the report as JSON")
    p.set_defaults(func=cmd_changes)


def main(argv: list[str] | None = None) -> int:
    return standalone_main("changes", register, argv)


if __name__ == "__main__":
    sys.exit(main())
