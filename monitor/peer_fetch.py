"""Getting vLLM's source distribution for `schedspec peer-tests`: the cache it is
kept in, and `pip download`, run with this interpreter's pip, so that the user's
own pip configuration (index, mirrors, proxies, certificates) applies.

    cache_root(override)          where peer-tests keeps everything: the override,
                                  else $SCHEDSPEC_CACHE/peer-tests, else
                                  $XDG_CACHE_HOME/schedspec/peer-tests, else
                                  ~/.cache/schedspec/peer-tests
    fetch_sdist(root, version=X)  vllm-X.tar.gz, kept in `root` (its sha256 beside
                                  it), reused while it matches; else `pip download`
    check_sdist(path)             --sdist PATH: the user's own copy, used as it is
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Mapping

from schedspec.reference.errors import UsageError, shown
from schedspec.spec.versions import DEFAULT_RELEASE, RELEASES, spec_release_for

VLLM_VERSION = DEFAULT_RELEASE  # the newest modelled release: the one run without --version
SDIST_NAME = f"vllm-{VLLM_VERSION}.tar.gz"

# `pip download` prepares an sdist's metadata before it saves it, even with
# --no-deps (pip issue 1884), by running the build backend the sdist names:
# for vLLM, setuptools with torch and a compiler toolchain, which pip would
# install (gigabytes) into an isolated build environment first.  So pip runs
# with --no-build-isolation and --use-pep517, and this stand-in comes first on
# its PYTHONPATH as `setuptools.build_meta` (the backend every vLLM release's
# pyproject.toml names; `__legacy__` is the one pip uses for an sdist naming
# none): it hands pip the sdist's own PKG-INFO as its metadata.  It is written
# into a temporary folder for the one pip run, never onto the tests' path.
METADATA_BACKEND = '''"""Stand-in written by schedspec peer-tests for `pip download`: an sdist's
metadata is its own PKG-INFO (no build requirement is installed, nothing is built)."""
import email.parser
import os
import re
import shutil
import sys


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    with open("PKG-INFO", encoding="utf-8") as f:
        info = email.parser.Parser().parse(f, headersonly=True)
    name = re.sub(r"[-_.]+", "_", info["Name"])
    folder = f"{name}-{info['Version']}.dist-info"
    os.makedirs(os.path.join(metadata_directory, folder))
    shutil.copyfile("PKG-INFO", os.path.join(metadata_directory, folder, "METADATA"))
    return folder


__legacy__ = sys.modules[__name__]
'''

StatusFn = Callable[[str], None]


def quiet(message: str) -> None:
    return None


# --- the cache ----------------------------------------------------------------------------------

def cache_root(override: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The folder peer-tests keeps its downloads and extracted trees in."""
    env = os.environ if env is None else env
    if override is not None and str(override).strip():
        return Path(override).expanduser()
    if env.get("SCHEDSPEC_CACHE", "").strip():
        return Path(env["SCHEDSPEC_CACHE"]).expanduser() / "peer-tests"
    base = env.get("XDG_CACHE_HOME", "").strip()
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "schedspec" / "peer-tests"


def make_dir(path: Path, what: str) -> Path:
    """`path`, created if need be; a one-line UsageError naming `what` if it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the {what} {shown(str(path), 200)}: {e.strerror or e}") from None
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- the release ---------------------------------------------------------------------------------

def check_version(version: str) -> str:
    """A release schedspec models (spec/versions.py), or a later one, whose tests run
    against the newest modelled release at or below it (`schedspec keep-up`); else a
    one-line UsageError."""
    if spec_release_for(version) is None:
        raise UsageError(f"--version {shown(version)}: not a vLLM release schedspec models, nor a later one; "
                         f"use one of {', '.join(RELEASES)}")
    return version


def sdist_name(version: str = VLLM_VERSION) -> str:
    return f"vllm-{version}.tar.gz"


# --- the download --------------------------------------------------------------------------------

def pip_error_line(stderr: str) -> str:
    """pip's last error line ("ERROR: No matching distribution found for ..."),
    else its last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.lower().startswith("error:")]
    return (errors or lines or ["no output"])[-1]


def _pip_environment(backend: Path, env: Mapping[str, str] | None) -> dict[str, str]:
    """`env` (this process's) with the stand-in metadata backend first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    package = make_dir(backend / "setuptools", "cache folder")
    (package / "__init__.py").write_text('"""Stand-in written by schedspec peer-tests for `pip download`."""\n')
    (package / "build_meta.py").write_text(METADATA_BACKEND)
    env["PYTHONPATH"] = os.pathsep.join([str(backend), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def pip_download(version: str, folder: Path, env: Mapping[str, str] | None = None,
                 status: StatusFn = quiet) -> Path:
    """vllm-`version`.tar.gz downloaded by `sys.executable -m pip download` into
    `folder`/out (pip verifies the hash its index gives); a one-line UsageError
    with pip's last error line if pip fails.  On a terminal pip shows its own
    progress bar on stderr."""
    name = sdist_name(version)
    out = Path(folder) / "out"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
           "--use-pep517", "--disable-pip-version-check", "--dest", str(out), f"vllm=={version}"]
    progress = os.environ.get("SCHEDSPEC_PROGRESS", "") != "0" and sys.stderr.isatty()
    if not progress:
        cmd += ["--progress-bar", "off"]
    pip_env = _pip_environment(Path(folder) / "backend", env)
    status(f"downloading {name} with pip (pip download, as your pip configuration says)")
    try:
        sys.stderr.flush()
        proc = subprocess.run(cmd, env=pip_env, stdin=subprocess.DEVNULL,
                              stdout=sys.stderr.fileno() if progress else subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, check=False)
    except OSError as e:
        raise UsageError(f"cannot run {shown(sys.executable, 200)} -m pip to download {name}: "
                         f"{e.strerror or e}; pass --sdist PATH to use a copy you have") from None
    if proc.returncode != 0:
        raise UsageError(f"pip download of {name} failed (exit {proc.returncode}): "
                         f"{shown(pip_error_line(proc.stderr), 240)}; pass --sdist PATH to use a copy you have")
    got = out / name
    if not got.is_file():
        saved = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
        raise UsageError(f"pip download saved no {name} (it saved: {shown(', '.join(saved) or 'nothing', 200)}); "
                         "pass --sdist PATH to use a copy you have")
    return got


def fetch_sdist(root: Path, env: Mapping[str, str] | None = None, status: StatusFn = quiet,
                version: str = VLLM_VERSION) -> Path:
    """vLLM `version`'s source distribution, from `root` when the copy there still
    has the sha256 recorded beside it, else downloaded by pip into a temporary
    folder of `root` and moved into place only once pip has succeeded."""
    dest = Path(root) / sdist_name(version)
    recorded = dest.with_name(dest.name + ".sha256")
    if dest.is_file() and recorded.is_file():
        with contextlib.suppress(OSError):
            if recorded.read_text().strip() == sha256_file(dest):
                return dest
    make_dir(Path(root), "cache folder")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=root))
    try:
        got = pip_download(version, tmp, env, status)
        digest = sha256_file(got)
        os.replace(got, dest)
    except OSError as e:
        raise UsageError(f"cannot keep {dest.name} in {shown(str(root), 200)}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.suppress(OSError):
        recorded.write_text(digest + "\n")
    return dest


def check_sdist(path: str | os.PathLike) -> Path:
    """--sdist PATH: an existing file (its contents are checked when read)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--sdist {shown(str(path), 200)}: no such file")
    return p


__all__ = ["METADATA_BACKEND", "SDIST_NAME", "StatusFn", "VLLM_VERSION", "cache_root", "check_sdist",
           "check_version", "fetch_sdist", "make_dir", "pip_download", "pip_error_line", "quiet", "sdist_name",
           "sha256_file"]
