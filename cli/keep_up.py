"""`schedspec keep-up X`: what the spec must learn to model vLLM release X.

    schedspec keep-up 0.35.0                      # install, peer tests, campaign, report
    schedspec keep-up 0.34.0 --against 0.33.0     # as if 0.34.0 were not modelled yet
    schedspec keep-up 0.35.0 --tests none --scenarios 100 -o keep-up-0.35.0

Steps, each printed as it starts:
1. install vLLM X in its own environment (`schedspec install-vllm --version X`), unless
   it is there already (or `--no-install`);
2. run X's own tests/v1/core under the monitor, against the spec at release Y
   (`schedspec peer-tests --version X`; `--tests all` for all of tests/v1/core,
   `none` to skip);
3. in X's environment, a differential campaign of vLLM X against the spec at Y with
   every engine flag and every feature the spec models at Y drawn; each diverging
   scenario is shrunk;
4. the divergences grouped by rule: first differing field and the config features the
   divergence needs (reference/keep_up.py), one smallest scenario per group;
5. `-o DIR/report.md` (and report.json): one section per group, saying which gate to add.

Y is `--against`, else the newest modelled release at or below X.  The output folder
must be new or empty: nothing is overwritten.  Exit 0 when the report is written (the
divergences are its content, not a failure), 2 on a user error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from .args import float_arg, int_arg
from schedspec.reference.errors import UsageError, shown, status

from schedspec.reference.vllm_lift import COMPARE_WITH_ENV

from .common import standalone_main
from .vllm_version import REEXEC_ENV, check_release, check_vllm, env_python, installed_vllm

STAGE_FLAG = "--in-release-env"  # set on the re-executed run inside X's environment


def spec_release(version: str, against: str | None) -> str:
    from schedspec.spec.versions import spec_release_for

    if against is not None:
        return check_release(against, "--against")
    found = spec_release_for(version)
    assert found is not None  # check_vllm refused it otherwise
    return found


def run_step(what: str, command: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    """A stage as a subprocess, its output to `log`; its exit status."""
    status(f"keep-up: {what} (log: {log})")
    with log.open("w") as f:
        try:
            return subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, check=False,
                                  env={**os.environ, **(env or {})}).returncode
        except OSError as e:
            raise UsageError(f"cannot run {shown(command[0])}: {e.strerror or e}") from None


def install(version: str, out: Path, allowed: bool) -> None:
    if env_python(version).exists():
        return
    if not allowed:
        raise UsageError(f"vLLM {version} is not installed for schedspec (no {env_python(version)}); drop "
                         f"--no-install or run `schedspec install-vllm --version {version}`")
    rc = run_step(f"installing vLLM {version}", [sys.executable, "-m", "schedspec", "install-vllm",
                                                  "--version", version], out / "install.log")
    if rc != 0 or not env_python(version).exists():
        raise UsageError(f"installing vLLM {version} failed (exit {rc}); see {out / 'install.log'}")


def peer_tests(version: str, against: str, tests: str, out: Path) -> dict:
    if tests == "none":
        return {"error": "skipped (--tests none)"}
    report = out / "peer-tests.json"
    command = [sys.executable, "-m", "schedspec", "peer-tests", "--version", version, "--json-out", str(report)]
    if tests == "all":
        command.append("--all")
    rc = run_step(f"vLLM {version}'s own scheduler tests under the monitor, against the spec at {against}",
                  command, out / "peer-tests.log", {COMPARE_WITH_ENV: against})
    if report.is_file():
        try:
            return json.loads(report.read_text())
        except json.JSONDecodeError:
            pass
    return {"error": f"peer-tests exited {rc} without a report; see {out / 'peer-tests.log'}"}


def campaign_and_report(args, version: str, against: str, out: Path) -> int:
    """In vLLM X's own interpreter: the campaign, the grouping, the report."""
    from schedspec.reference.campaign import CampaignOptions, run_campaign
    from schedspec.reference.compare import compare_traces
    from schedspec.reference.engine import run_scenario
    from schedspec.reference.generator import FLAGS_ALL
    from schedspec.reference.impl import SpecScheduler
    from schedspec.reference.keep_up import group_divergences, render_report
    from schedspec.reference.scenario import load_scenario

    from .common import load_impl_or_fail

    options = CampaignOptions(impl="vllm", against="spec", seed=args.seed, num_scenarios=args.scenarios,
                              flags=FLAGS_ALL, out_dir=out / "divergences", shrink=True,
                              shrink_seconds=args.shrink_seconds, quiet=True, release=against)
    status(f"keep-up: campaign of vLLM {version} against the spec at {against}, {args.scenarios} scenarios "
           f"of seed {args.seed}")
    res = run_campaign(options, [], sys.stdout)
    vllm, spec = load_impl_or_fail("vllm", None), SpecScheduler()

    def diverges(s):
        return compare_traces(run_scenario(s, vllm), run_scenario(s, spec))

    found = []
    for entry in res["divergences"]:
        minimal = entry.get("minimal")
        path = Path(minimal["file"] if minimal else entry["file"])
        s = load_scenario(path, against)
        d = diverges(s)
        if d is not None:
            found.append((s, d, str(path)))
    status(f"keep-up: grouping {len(found)} divergence(s) by rule")
    groups = group_divergences(found, diverges)
    peer = json.loads((out / "peer-tests.json").read_text()) if (out / "peer-tests.json").is_file() else \
        {"error": "not run"}
    text = render_report(version, against, groups, res, peer)
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps({
        "vllm": version, "spec_release": against, "scenarios": res["scenarios"],
        "steps_compared": res["steps_compared"], "divergences": len(res["divergences"]),
        "failures": res.get("failures", []),
        "groups": [{"field": g.field, "features": list(g.features), "count": g.count, "file": g.file,
                    "step": g.divergence.step, "first_field": g.divergence.field} for g in groups],
        "peer_tests": peer}, indent=1) + "\n")
    print(text)
    print(f"keep-up: report in {out / 'report.md'}")
    return 0


def cmd_keep_up(args) -> int:
    from schedspec.reference.outputs import check_output_dir

    version = check_vllm(args.version, "X")
    against = spec_release(version, args.against)
    out = Path(args.out or f"keep-up-{version}")
    if getattr(args, "in_release_env", False):
        if installed_vllm() != version:
            raise UsageError(f"{STAGE_FLAG}: this interpreter has vllm {installed_vllm()}, not {version}")
        return campaign_and_report(args, version, against, out)
    out = check_output_dir(out, "-o")
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise UsageError(f"-o: {out} is not empty; keep-up writes a fresh report, name a new folder")
    if installed_vllm() != version:
        install(version, out, not args.no_install)
    peer_tests(version, against, args.tests, out)
    py = Path(sys.executable) if installed_vllm() == version else env_python(version)
    command = [str(py), "-m", "schedspec", "keep-up", version, "--against", against, "--scenarios",
               str(args.scenarios), "--seed", str(args.seed), "--shrink-seconds", str(args.shrink_seconds),
               "-o", str(out), STAGE_FLAG]
    sys.stdout.flush()
    env = {**os.environ, REEXEC_ENV: version, COMPARE_WITH_ENV: against}
    return subprocess.run(command, env=env, check=False).returncode


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "keep-up", help="what the spec must learn to model vLLM release X: install it, run its tests under "
                        "the monitor and a campaign, group the divergences by rule",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1] + "  Steps: install X, run its own scheduler "
                    "tests under the monitor, a differential campaign with every modelled feature drawn, "
                    "the divergences grouped by first differing field and needed config features, one "
                    "shrunk scenario per group, and a report of the gates to add (DIR/report.md).")
    p.add_argument("version", metavar="X", help="a vLLM release, e.g. 0.35.0")
    p.add_argument("--against", metavar="Y", default=None,
                   help="the modelled release to compare with (default: the newest at or below X)")
    p.add_argument("--scenarios", type=int_arg(1, 1_000_000), default=300, metavar="N", help="random scenarios (default 300)")
    p.add_argument("--seed", type=int_arg(0, None), default=1, metavar="N", help="their seed (default 1)")
    p.add_argument("--shrink-seconds", type=float_arg(0.0, 3600.0), default=20.0, metavar="S",
                   help="time budget for shrinking one divergence (default 20)")
    p.add_argument("--tests", choices=("five", "all", "none"), default="five",
                   help="vLLM X's own scheduler tests to run under the monitor: the five default files, all of "
                        "tests/v1/core, or none (default five)")
    p.add_argument("--no-install", action="store_true", help="fail instead of installing vLLM X")
    p.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="a new or empty folder for the report and the scenarios (default ./keep-up-X)")
    p.add_argument(STAGE_FLAG, dest="in_release_env", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_keep_up)


def main(argv: list[str] | None = None) -> int:
    return standalone_main(register, argv)
