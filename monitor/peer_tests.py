"""vLLM's own scheduler tests (tests/v1/core), run on this machine, plain and
under the shadow monitor (`schedspec peer-tests [--version X]`): the steps of
the command, put together.

Release X is any of spec/versions.py RELEASES (default DEFAULT_RELEASE, the
newest): its own sdist,
its own tests/v1/core, run by its own interpreter (the one this process has when
its vLLM is X, else the environment of `schedspec install-vllm --version X`), so
the monitor lifts vLLM X's schedulers and the spec models X (the lifted
config's vllm_version is the installed vLLM's, reference/vllm_lift.py), its
version gates applied.  The default files a release lacks are left out and
named (`default_files`: 0.20.0 and 0.25.0 have no
test_priority_preemption_bug.py).

The steps, each a public function that takes values, in the module that says
what it does:

    peer_fetch.py        cache_root, fetch_sdist (`pip download`, this machine's
                         pip configuration), check_sdist (--sdist PATH)
    peer_extract.py      extract_tests (tests/v1/core and the helpers it imports),
                         resolve_targets, write_model_configs (the offline hub cache)
    peer_environment.py  release_python, ensure_test_dependencies (test-only
                         packages into root/deps), peer_environment
    peer_run.py          run_pytest (plain or shadowed, with the plugin
                         schedspec.monitor.pytest_plugin), the sessions'
                         groups, `--plain-for failures`
    peer_report.py       build_table, format_table
    here                 prepare (fetch, extract, configs, packages),
                         run_peer_tests (all of it)

What fails plain on a CPU-only machine with the scheduler's vLLM install
(vLLM's tests or this machine, never the spec; the table lists each cause):
the multimodal models' code (llava, Qwen2.5-VL) imports torchvision, which has
no build for the CPU torch here (llava's also mistral_common); up to 0.33.0
Model Runner V2 needs Triton, so vLLM falls back to the V1 runner, which rejects
async scheduling with pipeline parallelism (0.34.0 has no V1 runner, and its CPU
platform's refusal of an x86 machine without Triton, made before any scheduler
exists, is bridged by the pytest plugin: pytest_plugin.py); the end-to-end
tests (LLM engines) need model weights, and
prefix_cache/test_hybrid_prefix_cache_hit_rate.py imports anthropic.  Every
failure a user can act on (pip download failing, a bad --sdist, no test
selected) is a UsageError with one line.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from schedspec.reference.errors import UsageError, shown

from .peer_environment import ensure_test_dependencies, peer_environment, release_python
from .peer_extract import (TEST_ROOT, available_files, default_files, extract_tests, model_configs, named_models,
                           resolve_targets, write_model_configs)
from .peer_fetch import VLLM_VERSION, StatusFn, cache_root, check_sdist, check_version, fetch_sdist, make_dir, quiet
from .peer_report import build_table
from .peer_run import (PytestRun, file_groups, merge_runs, needs_plain_run, new_run_dir, plain_report_where_needed,
                       run_pytest)


@dataclass
class PeerTestOptions:
    """What `schedspec peer-tests` runs (the command's flags, as values)."""
    files: Sequence[str] | None = None
    all_files: bool = False
    keyword: str | None = None
    plain_only: bool = False
    plain_for: str = "all"  # or "failures": plain only where the shadowed run failed or diverged
    sdist: str | None = None
    cache: str | None = None
    vectors_dir: str | None = None
    policy: str = "count"
    extra_pytest_args: Sequence[str] = field(default_factory=tuple)
    workers: int = 1
    version: str = VLLM_VERSION


def prepare(options: PeerTestOptions, status: StatusFn = quiet) -> tuple[Path, Path, dict[str, str], str]:
    """(cache root, extracted tree, the tests' environment, the interpreter),
    everything fetched and written, for release options.version."""
    version = check_version(options.version)
    python = release_python(version)  # before anything is fetched: a missing environment is one line
    root = make_dir(cache_root(options.cache), "cache folder")
    sdist = check_sdist(options.sdist) if options.sdist else fetch_sdist(root, status=status, version=version)
    tree = extract_tests(sdist, root, status, version)
    hub = root / "hf" / "hub"
    try:
        write_model_configs(hub)
    except OSError as e:
        raise UsageError(f"cannot write the model configs into {shown(str(hub), 200)}: {e.strerror or e}") from None
    paths = ensure_test_dependencies(root, status, python=python, version=version)
    return root, tree, peer_environment(root, hub, paths, version=version), python


def _targets(tree: Path, options: PeerTestOptions, status: StatusFn) -> tuple[list[str], list[str], list[str]]:
    """(pytest's targets, the default files the release lacks, the models the
    targets name that have no offline config), the last two also told."""
    version = options.version
    targets = resolve_targets(tree, options.files, options.all_files)
    lacking = default_files(tree)[1] if not (options.files or options.all_files) else []
    if lacking:
        status(f"vLLM {version}'s {TEST_ROOT} has no {', '.join(lacking)}: left out of the default files")
    paths = None if targets == [TEST_ROOT] else \
        sorted({t.partition("::")[0].removeprefix(TEST_ROOT + "/") for t in targets})
    unconfigured = [m for m in named_models(tree, paths) if m not in model_configs()]
    if unconfigured:
        status(f"no offline config for {', '.join(unconfigured)} (named by vLLM {version}'s tests): "
               "the tests that load them fail plain")
    return targets, lacking, unconfigured


@dataclass
class _Session:
    """What every pytest session of one run shares."""
    tree: Path
    env: dict[str, str]
    python: str
    options: PeerTestOptions
    status: StatusFn

    def run(self, targets: Sequence[str], where: Path, mode: str, vectors: Path | None,
            show_progress: bool | None) -> PytestRun:
        o = self.options
        # The plugin checks the interpreter's vLLM where it is not this one's default release.
        release = None if self.python == sys.executable and o.version == VLLM_VERSION else o.version
        return run_pytest(self.tree, targets, where, self.env, plain=mode == "plain", keyword=o.keyword,
                          vectors_dir=vectors if mode == "shadow" else None, policy=o.policy,
                          extra_args=o.extra_pytest_args, status=self.status, show_progress=show_progress,
                          python=self.python, vllm_version=release)


def _run_modes(session: _Session, targets: list[str], modes: list[str], run_dir: Path, vectors: Path,
               show_progress: bool | None) -> tuple[dict[str, PytestRun], list[str], int]:
    """({mode: its sessions merged}, the targets as run, the number of sessions).

    With `workers` > 1 the pytest sessions run at once: plain beside shadowed,
    and with 4 or more workers each mode split into groups of files (each
    pytest process imports vLLM, about 10 s, so files are split only where
    there are cores to pay for it).  Tests never share a session across groups
    that they would not share in one: a file is never split."""
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, session.options.workers)
    wanted = max(1, workers // len(modes))
    if wanted > 1 and targets == [TEST_ROOT]:  # --all: the files, so that they can be dealt out
        targets = [f"{TEST_ROOT}/{f}" for f in available_files(session.tree)]
    groups = file_groups(targets, wanted)
    jobs = [(mode, k, group) for mode in modes for k, group in enumerate(groups)]
    alone = workers == 1 or len(jobs) == 1

    def job(mode: str, k: int, group: list[str]) -> PytestRun:
        where = run_dir if len(groups) == 1 else run_dir / f"group-{k}"
        return session.run(group, where, mode, vectors, show_progress if alone else False)

    if alone:
        done = [job(*j) for j in jobs]
    else:
        session.status(f"{len(jobs)} pytest sessions, {min(workers, len(jobs))} at a time")
        with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
            done = list(pool.map(lambda j: job(*j), jobs))
    runs = {mode: merge_runs(mode, [r for (m, _, _), r in zip(jobs, done) if m == mode]) for mode in modes}
    return runs, targets, len(jobs)


def _plain_where_needed(session: _Session, runs: dict[str, PytestRun], run_dir: Path,
                        show_progress: bool | None) -> dict[str, PytestRun]:
    """`--plain-for failures`: the plain run of only the tests the shadowed run
    needs a plain outcome for, the others' outcome taken from the shadowed run."""
    rerun = needs_plain_run(runs["shadow"].report)
    if rerun:
        session.status(f"{len(rerun)} tests failed or diverged under the monitor: running them plain")
        plain = session.run(rerun, run_dir, "plain", None, show_progress)
    else:
        plain = PytestRun("plain", 0, {"tests": {}}, runs["shadow"].log, 0.0)
    return {"plain": PytestRun("plain", plain.returncode,
                               plain_report_where_needed(runs["shadow"].report, plain.report),
                               plain.log, plain.seconds), **runs}


def run_peer_tests(options: PeerTestOptions, status: StatusFn = quiet,
                   show_progress: bool | None = None) -> dict[str, Any]:
    """Fetch, extract, run plain (and, unless plain_only, under the monitor); the
    table, with what was run under "run".  `options.workers`: see _run_modes."""
    root, tree, env, python = prepare(options, status)
    targets, lacking, unconfigured = _targets(tree, options, status)
    run_dir = new_run_dir(root)
    vectors = Path(options.vectors_dir) if options.vectors_dir else run_dir / "vectors"
    if options.plain_for not in ("all", "failures"):
        raise UsageError(f"--plain-for: {shown(options.plain_for)} is neither all nor failures")
    modes = ["plain"] if options.plain_only else ["shadow"] if options.plain_for == "failures" else \
        ["plain", "shadow"]
    if "shadow" in modes:
        make_dir(vectors, "--vectors-out folder")
    session = _Session(tree, env, python, options, status)
    runs, targets, sessions = _run_modes(session, targets, modes, run_dir, vectors, show_progress)
    if options.plain_for == "failures" and not options.plain_only:
        runs = _plain_where_needed(session, runs, run_dir, show_progress)
    first = runs["plain" if options.plain_only else "shadow"] if options.plain_for == "failures" else runs["plain"]
    if first.returncode == 5 or not first.report.get("tests"):
        raise UsageError(f"no test selected in {', '.join(targets)}"
                         + (f" by -k {shown(options.keyword)}" if options.keyword else ""))
    table = build_table(runs["plain"].report, runs["shadow"].report if "shadow" in runs else None,
                        version=options.version)
    table["run"] = {"targets": targets, "default_files_absent": lacking, "python": python,
                    "models_without_config": unconfigured,
                    "keyword": options.keyword, "run_dir": str(run_dir),
                    "vectors_dir": str(vectors) if "shadow" in runs else None, "workers": max(1, options.workers),
                    "pytest_sessions": sessions, "plain_for": options.plain_for,
                    "plain_inferred": sum(1 for e in runs["plain"].report.get("tests", {}).values()
                                          if isinstance(e, Mapping) and e.get("inferred")),
                    **{f"{mode}_seconds": round(r.seconds, 1) for mode, r in runs.items()},
                    **{f"{mode}_pytest_exit": r.returncode for mode, r in runs.items()},
                    **{f"{mode}_log": str(r.log) for mode, r in runs.items()}}
    return table


__all__ = ["PeerTestOptions", "prepare", "run_peer_tests"]
