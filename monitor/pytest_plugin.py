"""A pytest plugin that records each test's outcome and, unless told to run
plain, runs every test under the shadow monitor (monitor/shadow.py).

    python -m pytest TESTS -p schedspec.monitor.pytest_plugin \
        --schedspec-report report.json [--schedspec-plain] \
        [--schedspec-vectors DIR] [--schedspec-policy count|log|raise] \
        [--schedspec-progress progress.txt] [--schedspec-vllm-version X]

The report (written at the end of the session, also when tests fail):

    {"version": 1, "plain": bool, "vllm_version": the installed vLLM or null,
     "tests": {nodeid: {"outcome": "passed" | "failed" | "skipped" | "error",
                        "message": first line of the failure or skip reason, or null,
                        "missing_modules": [modules a failure's output says are not installed]
                                           (only when there are such),
                        "stats": the monitor's figures for the test, or null}}}

`outcome` is the call phase's; a failing or skipped setup is "error" or
"skipped", a failing teardown of a passed test "error", and a file that cannot
be collected is one entry "error" under the file's node id.  `stats` is
`Monitor.end()` for the test (calls by name, calls outside the spec's scope by
feature, divergences, monitor errors); null when plain.

With --schedspec-progress FILE the plugin writes "collected N" and then one
line per finished test, for a runner that shows progress.

With --schedspec-vllm-version X the session stops at once (a usage error) unless
the interpreter's vLLM is release X: the monitor lifts the config's
vllm_version from the installed vLLM (reference/vllm_lift.py), so the spec
then models X.  The report's "vllm_version" is the release the session ran.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest

REPORT_VERSION = 1
MESSAGE_LIMIT = 2000


def pytest_addoption(parser) -> None:
    group = parser.getgroup("schedspec", "schedspec: vLLM's tests under the spec's shadow monitor")
    group.addoption("--schedspec-report", metavar="PATH", default=None,
                    help="write each test's outcome (and the monitor's figures) to PATH as JSON")
    group.addoption("--schedspec-plain", action="store_true", default=False,
                    help="record outcomes only; do not install the monitor")
    group.addoption("--schedspec-vectors", metavar="DIR", default=None,
                    help="folder the monitor writes a state vector to for each divergence")
    group.addoption("--schedspec-policy", default="count", choices=("count", "log", "raise"),
                    help="what the monitor does on a divergence (default count)")
    group.addoption("--schedspec-progress", metavar="PATH", default=None,
                    help="write 'collected N', then a line per finished test, to PATH")
    group.addoption("--schedspec-vllm-version", metavar="X", default=None,
                    help="refuse to run unless the installed vLLM is release X (what the spec then models)")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config) -> None:
    """Before vLLM's conftest.py files import vLLM: on a CPU-only run
    (VLLM_TARGET_DEVICE=cpu, as peer-tests runs), select vLLM's CPU platform
    where the release does not itself.  Bridge (platform): up to 0.25.0 a PyPI
    wheel on Linux infers no platform ("Failed to infer device type"), see
    reference/vllm_adapter.py select_cpu_platform; from 0.28.0 nothing is done.
    Bridge (Triton check): from 0.34.0 the CPU platform's config hook refuses an x86
    machine without Triton, before any scheduler exists (0.34.0
    platforms/cpu.py:239-243); each VllmConfig a test builds runs that hook with
    HAS_TRITON read as true for the hook's duration only (vllm_adapter.triton_presumed),
    in plain runs and monitored ones alike."""
    if os.environ.get("VLLM_TARGET_DEVICE") != "cpu" or installed_vllm() is None:
        return
    from schedspec.reference.vllm_adapter import TRITON_CHECKED_SINCE, TARGET_DEVICE_READ_SINCE
    from schedspec.spec.versions import RELEASES, release_key

    version = installed_vllm()
    if version in RELEASES and release_key(version) < release_key(TARGET_DEVICE_READ_SINCE):
        from schedspec.reference.vllm_adapter import select_cpu_platform

        select_cpu_platform(version)
    if version in RELEASES and release_key(version) >= release_key(TRITON_CHECKED_SINCE):
        # When vLLM's CPU platform is first imported, not now: importing it takes torch
        # (1.6 s), which a session that never imports vLLM need not pay.
        when_imported("vllm.platforms.cpu", bridge_triton_check)


def bridge_triton_check(_module: Any) -> None:
    from schedspec.reference.vllm_adapter import bridge_cpu_platform_check

    bridge_cpu_platform_check()


def when_imported(name: str, action: Callable[[Any], None]) -> None:
    """Run `action(module)` as soon as module `name` is imported: now if it is, else
    right after its code has run, before whatever imported it goes on."""
    if name in sys.modules:
        action(sys.modules[name])
        return

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)  # once: the module's own finders find it
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                action(module)
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder())


def pytest_configure(config) -> None:
    opts = config.option
    if not (opts.schedspec_report or opts.schedspec_progress or not opts.schedspec_plain
            or opts.schedspec_vllm_version):
        return
    config.pluginmanager.register(Recorder(config), "schedspec-recorder")


class Recorder:
    """The plugin's state for one session."""

    def __init__(self, config) -> None:
        opts = config.option
        self.report_path = opts.schedspec_report
        self.progress_path = opts.schedspec_progress
        self.plain = bool(opts.schedspec_plain)
        self.tests: dict[str, dict[str, Any]] = {}
        self.monitor = None
        self.vllm_version = installed_vllm()
        wanted = opts.schedspec_vllm_version
        if wanted and self.vllm_version != wanted:
            raise pytest.UsageError(f"schedspec: this interpreter ({sys.executable}) has vllm "
                                    f"{self.vllm_version or 'not installed'}, not {wanted}")
        if self.progress_path:
            Path(self.progress_path).write_text("")
        if not self.plain:
            from .shadow import install

            try:
                self.monitor = install(policy=opts.schedspec_policy, vectors_dir=opts.schedspec_vectors)
            except Exception as e:  # the monitor cannot start: a usage error of this run
                raise pytest.UsageError(f"schedspec: the shadow monitor could not be installed: "
                                        f"{type(e).__name__}: {e}") from None
            if wanted:
                import vllm  # the release the lift reads (vllm.__version__), imported by shadow.py

                if getattr(vllm, "__version__", None) != wanted:
                    raise pytest.UsageError(f"schedspec: vllm.__version__ is {getattr(vllm, '__version__', None)}, "
                                            f"not {wanted}: the monitor would model another release")

    # -- collection and progress ------------------------------------------------

    def pytest_collection_finish(self, session) -> None:
        if self.progress_path:
            with open(self.progress_path, "w") as f:
                f.write(f"collected {len(session.items)}\n")

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.tests[report.nodeid] = {"outcome": "error", "message": message_of(report), "stats": None}
            if missing_modules(report):
                self.tests[report.nodeid]["missing_modules"] = sorted(missing_modules(report))

    # -- one test ---------------------------------------------------------------

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if self.monitor is None:
            yield
            return
        self.monitor.begin(item.nodeid)
        try:
            yield
        finally:
            try:
                stats = self.monitor.end()
            except Exception as e:  # the monitor's own failure is reported, not the test's
                stats = {"calls": {}, "outside_scope": {}, "divergences": [],
                         "monitor_errors": [{"call": "end", "call_number": 0,
                                             "error": f"{type(e).__name__}: {e}"}]}
            self.tests.setdefault(item.nodeid, {"outcome": "error", "message": None, "stats": None})
            self.tests[item.nodeid]["stats"] = stats

    def pytest_runtest_logreport(self, report) -> None:
        entry = self.tests.setdefault(report.nodeid, {"outcome": None, "message": None, "stats": None})
        if report.failed:
            missing = sorted(set(entry.get("missing_modules", [])) | missing_modules(report))
            if missing:
                entry["missing_modules"] = missing
        if report.when == "setup":
            if report.failed:
                entry.update(outcome="error", message=message_of(report))
            elif report.skipped:
                entry.update(outcome="skipped", message=message_of(report))
        elif report.when == "call":
            outcome = "passed" if report.passed else "failed" if report.failed else "skipped"
            entry.update(outcome=outcome, message=None if report.passed else message_of(report))
        elif report.when == "teardown":
            if report.failed and entry["outcome"] in (None, "passed"):
                entry.update(outcome="error", message=message_of(report))
            if entry["outcome"] is None:
                entry["outcome"] = "error"
            if self.progress_path:
                with open(self.progress_path, "a") as f:
                    f.write(report.nodeid.replace("\n", " ") + "\n")

    # -- the end ------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if not self.report_path:
            return
        data = {"version": REPORT_VERSION, "plain": self.plain, "vllm_version": self.vllm_version,
                "tests": self.tests}
        target = Path(self.report_path)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or Path("."))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, default=str)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def installed_vllm() -> str | None:
    """The vLLM release this interpreter has, from its metadata (no import)."""
    import importlib.metadata as md

    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        return None


MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([A-Za-z0-9_.]+)'")


def missing_modules(report) -> set[str]:
    """The modules a failed test's output says could not be imported (also in a
    subprocess whose error was logged, as vLLM's model inspection does)."""
    text = report.longreprtext + "".join(content for _, content in report.sections)
    return set(MISSING_MODULE.findall(text))


def message_of(report) -> str | None:
    """The first line that says why a test failed or was skipped."""
    longrepr = report.longrepr
    if longrepr is None:
        return None
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (file, line, reason)
        text = str(longrepr[2])
    else:
        text = getattr(getattr(longrepr, "reprcrash", None), "message", None)
        if not text:
            lines = str(longrepr).strip().splitlines()
            text = re.sub(r"^E\s+", "", lines[-1]) if lines else ""  # a collection error's last "E   ..." line
    return str(text)[:MESSAGE_LIMIT] or None


__all__ = ["REPORT_VERSION", "Recorder", "message_of", "missing_modules", "pytest_addoption", "pytest_configure"]
