"""What vLLM's tests run with under `schedspec peer-tests`: release X's
interpreter, the test-only packages a scheduler-only vLLM install lacks, and
the environment (offline, CPU, our hub cache, schedspec importable).

    release_python(X)             the interpreter of release X (one line naming
                                  `schedspec install-vllm --version X` if none)
    ensure_test_dependencies(root)  the few test-only packages vLLM's tests import
                                  that a scheduler-only vLLM install lacks (and
                                  pytest itself, for a release's environment),
                                  installed by pip into root/deps (deps-X for
                                  release X; never into the interpreter)
    peer_environment(root, hub, paths)  the tests' environment variables
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from schedspec.reference.errors import UsageError, shown

from .peer_fetch import VLLM_VERSION, StatusFn, make_dir, quiet

# Modules vLLM's tests (or the model code they reach) import that a scheduler-only
# vLLM install (requirements-vllm.txt) lacks: import name -> pinned requirement.
# tblib: tests/conftest.py; compressed-tensors (and its loguru): the hybrid
# (mamba/GDN) model code behind Qwen3-Next, pinned as vLLM 0.33.0 and 0.34.0 pin it
# (requirements/common.txt:45); mistral_common (and the three packages it imports
# that a scheduler-only install lacks): the LLaVA model code, which vLLM inspects
# for the multimodal tests' configs (0.34.0 requires mistral_common[image]>=1.13.0,
# 0.30.0 to 0.33.0 >=1.11.6).
TEST_DEPENDENCIES = {"tblib": "tblib==3.2.2", "compressed_tensors": "compressed-tensors==0.17.0",
                     "loguru": "loguru==0.7.3", "mistral_common": "mistral-common==1.13.1",
                     "pycountry": "pycountry==26.2.16", "pydantic_extra_types": "pydantic-extra-types==2.11.1",
                     "tiktoken": "tiktoken==0.14.0"}
# Bridge (test dependencies): 0.20.0 pins compressed-tensors 0.15.0.1
# (0.20.0 requirements/common.txt); 0.25.0 to 0.34.0 pin 0.17.0.
TEST_DEPENDENCIES_BY_RELEASE = {"0.20.0": {**TEST_DEPENDENCIES, "compressed_tensors": "compressed-tensors==0.15.0.1"}}
# pytest itself, for a release's environment (install-vllm installs vLLM only).
# vLLM's tests run without pytest-xdist there, so the newest pytest does (the project's
# own suite stays below 9.2 for xdist's grouping: pyproject.toml).
PYTEST_DEPENDENCIES = {"pytest": "pytest==9.2.0", "pluggy": "pluggy==1.7.0", "iniconfig": "iniconfig==2.3.1",
                       "pygments": "pygments==2.21.0"}
# What tests/conftest.py needs of tblib, when pip cannot install it: it only
# makes exceptions picklable for tests that run in subprocesses.
TBLIB_STAND_IN = ('"""Stand-in written by schedspec peer-tests: tblib could not be installed."""\n',
                  "def install(*args, **kwargs):\n    return None\n")

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu",
               "HF_HUB_DISABLE_TELEMETRY": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "TOKENIZERS_PARALLELISM": "false"}


# --- test-only dependencies ----------------------------------------------------------------------

def release_test_dependencies(version: str = VLLM_VERSION) -> dict[str, str]:
    """{import name: pinned requirement} release `version`'s tests need beyond a
    scheduler-only vLLM install."""
    return dict(TEST_DEPENDENCIES_BY_RELEASE.get(version, TEST_DEPENDENCIES))


def absent_modules(python: str | os.PathLike, modules: Iterable[str]) -> set[str]:
    """The modules interpreter `python` cannot find (asked in a subprocess: no import)."""
    modules = list(modules)
    if not modules:
        return set()
    if str(python) == sys.executable:
        return {m for m in modules if importlib.util.find_spec(m) is None}
    code = ("import importlib.util, json, sys; "
            "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))")
    try:
        proc = subprocess.run([str(python), "-c", code, *modules], capture_output=True, text=True,
                              timeout=120, check=False, env={k: v for k, v in os.environ.items()
                                                             if k != "PYTHONPATH"})
        return set(json.loads(proc.stdout.strip().splitlines()[-1])) if proc.returncode == 0 else set(modules)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return set(modules)


def missing_dependencies(deps: Path | None = None,
                         wanted: Mapping[str, str] | None = None,
                         python: str | os.PathLike | None = None) -> dict[str, str]:
    """{import name: requirement} of `wanted` (TEST_DEPENDENCIES) neither the
    interpreter `python` (this one) nor `deps` has."""
    wanted = TEST_DEPENDENCIES if wanted is None else wanted
    candidates = [m for m in wanted
                  if deps is None or not ((deps / m).is_dir() or (deps / f"{m}.py").is_file())]
    absent = absent_modules(python or sys.executable, candidates)
    return {m: wanted[m] for m in candidates if m in absent}


def deps_dir(root: Path, version: str = VLLM_VERSION) -> Path:
    """root/deps for the default release, root/deps-X for release X's environment."""
    return Path(root) / ("deps" if version == VLLM_VERSION else f"deps-{version}")


def ensure_test_dependencies(root: Path, status: StatusFn = quiet,
                             python: str | None = None, version: str = VLLM_VERSION) -> list[Path]:
    """Folders to put on the tests' PYTHONPATH with the test-only packages the
    interpreter `python` (this one) lacks, and pytest where a release's
    environment lacks it: deps_dir(root, version), installed there by pip
    (--no-deps, pinned); where pip fails, a stand-in for tblib (root/stand-ins)
    so that tests/conftest.py loads."""
    deps = deps_dir(root, version)
    wanted = {**release_test_dependencies(version), **PYTEST_DEPENDENCIES}
    missing = missing_dependencies(deps, wanted, python)
    if missing:
        status(f"installing the test-only packages {', '.join(missing.values())} into {deps} "
               "(not into the interpreter)")
        make_dir(Path(root), "cache folder")
        tmp = Path(tempfile.mkdtemp(prefix=".deps.", dir=root))
        try:
            cmd = [python or sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                   "--no-deps", "--no-compile", "--target", str(tmp), *missing.values()]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
            if proc.returncode == 0:
                deps.mkdir(parents=True, exist_ok=True)
                for item in tmp.iterdir():
                    target = deps / item.name
                    if target.exists():
                        shutil.rmtree(target) if target.is_dir() else target.unlink()
                    os.replace(item, target)
            else:
                last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
                status(f"could not install {', '.join(missing.values())} ({shown(last, 160)}); "
                       "the tests that import them will fail plain")
        except (OSError, subprocess.SubprocessError) as e:
            status(f"could not run pip to install {', '.join(missing.values())}: {shown(str(e), 160)}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    paths = [deps] if deps.is_dir() else []
    if "tblib" in missing_dependencies(deps, {"tblib": TEST_DEPENDENCIES["tblib"]}, python):
        stand_in = Path(root) / "stand-ins" / "tblib"
        stand_in.mkdir(parents=True, exist_ok=True)
        (stand_in / "__init__.py").write_text(TBLIB_STAND_IN[0])
        (stand_in / "pickling_support.py").write_text("".join(TBLIB_STAND_IN))
        paths.append(stand_in.parent)
    if "pytest" in missing_dependencies(deps, {"pytest": PYTEST_DEPENDENCIES["pytest"]}, python):
        raise UsageError(f"pytest is not installed for vLLM {version}'s interpreter {shown(str(python), 200)}, "
                         f"and pip could not install it into {deps}")
    return paths


def installed_vllm() -> str | None:
    """The vLLM release this interpreter has, from its metadata (no import)."""
    import importlib.metadata as md

    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        return None


def release_env_python(version: str) -> Path:
    """Release `version`'s interpreter where `schedspec install-vllm --version X`
    puts it: $SCHEDSPEC_CACHE/vllm-envs/X, default ~/.cache/schedspec/vllm-envs/X
    (cli/vllm_version.py env_python, which the command line owns)."""
    env = os.environ.get("SCHEDSPEC_CACHE", "").strip()
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "schedspec"
    return base / "vllm-envs" / version / "bin" / "python"


def release_python(version: str = VLLM_VERSION) -> str:
    """The interpreter that runs release `version`'s tests: this one when its vLLM
    is that release (or, for the default release, when no environment of it
    exists: the tests then show what is missing), else the environment of
    `schedspec install-vllm --version X` (cli/vllm_version.py)."""
    if installed_vllm() == version:
        return sys.executable
    py = release_env_python(version)
    if os.access(py, os.X_OK):
        problem = foreign_schedspec(str(py))
        if problem:
            raise UsageError(f"--version {version}: {problem}; point it here with "
                             f"`schedspec install-vllm --version {version}`")
        return str(py)
    if version == VLLM_VERSION:
        return sys.executable
    raise UsageError(f"--version {version}: vLLM {version} is not installed for schedspec (no {py}); "
                     f"install it with `schedspec install-vllm --version {version}`")


def imported_schedspec(python: str | Path) -> str | None:
    """The real path of the schedspec interpreter `python` imports, or None."""
    p = subprocess.run([str(python), "-c", "import os, schedspec; print(os.path.realpath(schedspec.__file__))"],
                       capture_output=True, text=True, timeout=120)
    return p.stdout.strip() if p.returncode == 0 else None


_ORIGINS: dict[str, str | None] = {}  # interpreter -> foreign_schedspec's answer, asked once a process


def foreign_schedspec(python: str) -> str | None:
    """Why interpreter `python` would not run this schedspec (another checkout's, one
    whose folder is gone, none), or None.  A release environment holds schedspec as
    installed when it was made (cli/install_vllm.py): a clone made since, or a
    removed one, leaves it running other code, or none, without a word."""
    if python not in _ORIGINS:
        import schedspec

        ours, theirs = os.path.realpath(schedspec.__file__), imported_schedspec(python)
        _ORIGINS[python] = None if theirs == ours else \
            f"{python} runs schedspec from {os.path.dirname(theirs)}, not this one ({os.path.dirname(ours)})" \
            if theirs else f"{python} cannot import schedspec (the checkout it was installed from is gone?)"
    return _ORIGINS[python]


# --- the tests' environment ---------------------------------------------------------------------

def peer_environment(root: Path, hub: Path, python_path: Sequence[Path] = (),
                     base: Mapping[str, str] | None = None, version: str = VLLM_VERSION) -> dict[str, str]:
    """The environment vLLM's tests run in: offline, CPU, our hub cache and
    vLLM cache, the extra packages importable (schedspec is installed in
    the interpreter that runs them: .venv, or a release's environment)."""
    env = dict(os.environ if base is None else base)
    for key in [k for k in env if k.startswith("PYTEST_")]:
        env.pop(key)  # an outer pytest's settings (PYTEST_ADDOPTS, PYTEST_CURRENT_TEST, ...) are not ours
    env.update(OFFLINE_ENV)
    env["HF_HOME"] = str(hub.parent)
    env["HF_HUB_CACHE"] = str(hub)
    env["VLLM_CACHE_ROOT"] = str(Path(root) / ("vllm-cache" if version == VLLM_VERSION else f"vllm-cache-{version}"))
    paths = [str(p) for p in python_path]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


__all__ = ["OFFLINE_ENV", "PYTEST_DEPENDENCIES", "TEST_DEPENDENCIES", "TEST_DEPENDENCIES_BY_RELEASE",
           "absent_modules", "deps_dir", "ensure_test_dependencies", "foreign_schedspec", "imported_schedspec", "installed_vllm", "missing_dependencies",
           "peer_environment", "release_env_python", "release_python", "release_test_dependencies"]
