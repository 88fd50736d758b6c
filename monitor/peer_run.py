"""Running vLLM's tests for `schedspec peer-tests`: pytest in a subprocess with
the plugin schedspec.monitor.pytest_plugin, plain (no monitor) or shadowed
(every scheduler call checked against the spec), offline; the files dealt
between sessions; and `--plain-for failures`, which reruns plain only what the
shadowed run needs a plain outcome for.

    run_pytest(tree, targets, run_dir, env, plain=...)  one pytest session
    file_groups(targets, n), merge_runs(mode, runs)     the sessions of one mode
    needs_plain_run(shadow), plain_report_where_needed(shadow, plain)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from schedspec.reference.errors import UsageError, shown
from schedspec.reference.progress import Progress

from .peer_fetch import StatusFn, make_dir, quiet
from .peer_report import first_line, outcome_of

PLUGIN = "schedspec.monitor.pytest_plugin"


@dataclass
class PytestRun:
    """One pytest run: its mode, exit status, the plugin's report, its output."""
    mode: str
    returncode: int
    report: dict[str, Any] | None
    log: Path
    seconds: float


def run_pytest(tree: Path, targets: Sequence[str], run_dir: Path, env: Mapping[str, str], *,
               plain: bool, keyword: str | None = None, vectors_dir: Path | None = None,
               policy: str = "count", extra_args: Sequence[str] = (), status: StatusFn = quiet,
               show_progress: bool | None = None, python: str | None = None,
               vllm_version: str | None = None) -> PytestRun:
    """pytest on `targets` in `tree`, in a subprocess of `python` (this
    interpreter), with the plugin; its output goes to run_dir/pytest-<mode>.log,
    the count of tests done to stderr.  With `vllm_version` the plugin refuses
    to run unless that interpreter's vLLM is that release."""
    mode = "plain" if plain else "shadow"
    run_dir = make_dir(Path(run_dir), "run folder")
    report = run_dir / f"report-{mode}.json"
    progress_file = run_dir / f"progress-{mode}.txt"
    log = run_dir / f"pytest-{mode}.log"
    work = make_dir(run_dir / f"cwd-{mode}", "run folder")  # files tests write with relative names
    for p in (report, progress_file):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    python = python or sys.executable
    cmd = [python, "-m", "pytest", *[str(Path(tree) / t) for t in targets],
           "--rootdir", str(tree), "-c", str(Path(tree) / "pyproject.toml"),
           "-p", PLUGIN, "-p", "no:cacheprovider", "-q", "-rN", "--continue-on-collection-errors",
           "--schedspec-report", str(report), "--schedspec-progress", str(progress_file)]
    if vllm_version:
        cmd += ["--schedspec-vllm-version", vllm_version]
    if plain:
        cmd.append("--schedspec-plain")
    else:
        cmd += ["--schedspec-policy", policy]
        if vectors_dir is not None:
            cmd += ["--schedspec-vectors", str(vectors_dir)]
    if keyword:
        cmd += ["-k", keyword]
    cmd += list(extra_args)
    status(f"running vLLM's tests {'plain (no monitor)' if plain else 'under the shadow monitor'}; "
           f"pytest output in {log}")
    t0 = time.monotonic()
    progress = Progress(f"vLLM tests, {mode}", 1, enabled=show_progress, min_total=1)
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(cmd, cwd=work, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        except OSError as e:
            raise UsageError(f"cannot run {shown(python, 200)} -m pytest: {e.strerror or e}") from None
        try:
            while True:
                try:
                    proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    _show_progress(progress_file, progress)
            _show_progress(progress_file, progress)
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        finally:
            progress.close()
    seconds = time.monotonic() - t0
    data = None
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(report.read_text())
    if data is None or proc.returncode in (2, 3, 4):
        raise UsageError(f"pytest ({mode}) stopped with exit status {proc.returncode} before finishing: "
                         f"{shown(_last_line(log), 200)} (full output: {log})")
    return PytestRun(mode, proc.returncode, data, log, seconds)


def _show_progress(progress_file: Path, progress: Progress) -> None:
    try:
        lines = progress_file.read_text().splitlines()
    except OSError:
        return
    if not lines or not lines[0].startswith("collected "):
        return
    with contextlib.suppress(ValueError):
        total = int(lines[0].split()[1])
        progress(len(lines) - 1, max(total, 1))


def _last_line(log: Path) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 20000))
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return "no output"
    errors = [ln for ln in lines if ln.startswith(("E ", "ERROR", "ImportError", "error:"))]
    return (errors or lines or ["no output"])[-1].strip()


def new_run_dir(root: Path, keep: int = 10) -> Path:
    """root/runs/<time>-<pid>, the older runs beyond the last `keep` removed."""
    runs = make_dir(Path(root) / "runs", "cache folder")
    old = sorted(p for p in runs.iterdir() if p.is_dir())
    for p in old[: max(0, len(old) - keep + 1)]:
        shutil.rmtree(p, ignore_errors=True)
    return make_dir(runs / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}", "run folder")


def file_groups(targets: Sequence[str], groups: int) -> list[list[str]]:
    """`targets` dealt round-robin by file into at most `groups` non-empty
    groups, in order: the node ids of one file stay in one group."""
    files: dict[str, list[str]] = {}
    for t in targets:
        files.setdefault(t.partition("::")[0], []).append(t)
    per_file = list(files.values())
    groups = max(1, min(groups, len(per_file)))
    return [[t for f in per_file[k::groups] for t in f] for k in range(groups)]


def merge_runs(mode: str, runs: Sequence[PytestRun]) -> PytestRun:
    """One mode's pytest runs over groups of files, as one run: the plugin's
    reports joined (each test is in one group), the exit status pytest gives a
    whole session (1 if any test failed, 5 only if none was collected anywhere)."""
    if len(runs) == 1:
        return runs[0]
    tests: dict[str, Any] = {}
    for r in runs:
        tests.update((r.report or {}).get("tests", {}))
    codes = [r.returncode for r in runs]
    code = 5 if all(c == 5 for c in codes) else (1 if 1 in codes else 0)
    report = {**(runs[0].report or {}), "tests": tests}
    return PytestRun(mode, code, report, runs[0].log, max(r.seconds for r in runs))


def _untouched_failure(entry: Any) -> bool:
    """A shadowed test that failed before any scheduler call, with nothing from
    the monitor (no divergence, no monitor error)."""
    if not isinstance(entry, Mapping) or entry.get("outcome") not in ("failed", "error"):
        return False
    stats = entry.get("stats")
    if not isinstance(stats, Mapping):
        return False
    calls = stats.get("calls")
    if not isinstance(calls, Mapping) or any(not isinstance(c, Mapping) or c.get("total") != 0
                                             for c in calls.values()):
        return False
    return not stats.get("divergences") and not stats.get("monitor_errors")


def missing_package_failures(shadow: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """node id -> missing modules, for the shadowed tests that failed on a package
    this machine lacks before any scheduler call: those whose output names a
    module not installed, and those failing the same way (the same first line)
    without saying it again (vLLM remembers a model it failed to inspect and
    logs the cause once).  The monitor acts only through the scheduler's
    methods, so such a test fails the same way plain: `--plain-for failures`
    infers that outcome instead of running it again."""
    tests = (shadow or {}).get("tests") or {}
    untouched = {nodeid: entry for nodeid, entry in tests.items() if _untouched_failure(entry)}
    causes: dict[str, set[str]] = {}
    for entry in untouched.values():
        if entry.get("missing_modules"):
            causes.setdefault(first_line(entry.get("message")), set()).update(entry["missing_modules"])
    out = {}
    for nodeid, entry in untouched.items():
        modules = set(entry.get("missing_modules") or ()) | causes.get(first_line(entry.get("message")), set())
        if modules:
            out[nodeid] = sorted(modules)
    return out


def needs_plain_run(shadow: Mapping[str, Any] | None) -> list[str]:
    """The node ids of a shadowed run whose verdict needs the plain outcome: the
    tests that did not pass or skip under the monitor (did they fail plain too?),
    except those that failed on a missing package before any scheduler call
    (missing_package_failures), and those with a divergence (does it count?),
    in order."""
    out = []
    inferred = missing_package_failures(shadow)
    for nodeid, entry in sorted(((shadow or {}).get("tests") or {}).items()):
        stats = entry.get("stats") if isinstance(entry, Mapping) else None
        diverged = isinstance(stats, Mapping) and bool(stats.get("divergences"))
        if diverged or (outcome_of(shadow, nodeid) not in ("passed", "skipped") and nodeid not in inferred):
            out.append(nodeid)
    return out


def plain_report_where_needed(shadow: Mapping[str, Any] | None, plain: Mapping[str, Any] | None) -> dict[str, Any]:
    """The plain report of a `--plain-for failures` run: the plain outcome of
    the tests rerun plain, and for the others the shadowed outcome, marked
    `inferred`: for those that passed or skipped under the monitor with no
    divergence (a monitor that only observes cannot make a failing test pass),
    and for those that failed on a missing package before any scheduler call
    (missing_package_failures), with the shadowed failure's message and the
    missing modules.  A rerun test that was not reported plain (deselected, not
    collected) stays absent, so the table shows it and does not count it as
    passing."""
    tests: dict[str, Any] = {}
    rerun = set(needs_plain_run(shadow))
    missing = missing_package_failures(shadow)
    for nodeid, entry in ((shadow or {}).get("tests") or {}).items():
        if nodeid not in rerun:
            tests[nodeid] = {"outcome": outcome_of(shadow, nodeid), "inferred": True}
            if nodeid in missing:
                tests[nodeid].update(message=entry.get("message"), missing_modules=missing[nodeid])
    tests.update(((plain or {}).get("tests") or {}))
    return {**(plain or {}), "tests": tests}


__all__ = ["PLUGIN", "PytestRun", "file_groups", "merge_runs", "missing_package_failures", "needs_plain_run",
           "new_run_dir", "plain_report_where_needed", "run_pytest"]
