"""`schedspec install-vllm`: install the real vLLM scheduler of the newest modelled
release (spec/versions.py DEFAULT_RELEASE, cli/install/install-vllm.sh
DEFAULT_VLLM_VERSION; CPU only) into the running interpreter; `--version X` installs
release X into its own virtualenv instead ($SCHEDSPEC_CACHE/vllm-envs/X, default
~/.cache/schedspec/vllm-envs/X), with this schedspec installed into it, for
`--impl vllm==X` (cli/vllm_version.py).

The script and the requirement files it reads ship in the package (cli/install/),
so a schedspec installed from a wheel installs vLLM as a source checkout does."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

from schedspec.monitor.peer_environment import imported_schedspec
from schedspec.reference.errors import UsageError
from schedspec.spec.versions import DEFAULT_RELEASE, RELEASES

SCRIPT = Path(__file__).resolve().with_name("install") / "install-vllm.sh"
# In a release's environment, the folder a .pth file names, holding a link to this
# schedspec's package folder (a schedspec installed from a wheel: nothing to install
# it from but itself).
LINK_FOLDER = "schedspec-link"


def schedspec_origin() -> tuple[str, Path]:
    """How this schedspec is installed: ("editable", its source tree) for
    `pip install -e`, else ("package", the installed package's folder)."""
    import schedspec

    try:
        direct = importlib.metadata.distribution("schedspec").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        direct = None
    if direct:
        info = json.loads(direct)
        if info.get("dir_info", {}).get("editable") and info.get("url", "").startswith("file:"):
            return "editable", Path(urllib.request.url2pathname(urllib.parse.urlparse(info["url"]).path))
    return "package", Path(schedspec.__file__).resolve().parent


def runtime_requirements() -> list[str]:
    """This schedspec's own requirements, without those of its extras."""
    requires = importlib.metadata.requires("schedspec") or []
    return [r.split(";")[0].strip() for r in requires if not re.search(r"extra\s*==", r)]


def install_schedspec_into(py: Path, env: Path) -> None:
    """Make `py` (a release's own environment) import this very schedspec."""
    import schedspec

    ours = os.path.realpath(schedspec.__file__)
    if imported_schedspec(py) == ours:
        return
    kind, where = schedspec_origin()
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if kind == "editable":
        run_checked(pip + ["-e", str(where)], f"installing schedspec ({where}) into {py}")
    else:
        run_checked(pip + runtime_requirements(), f"installing schedspec's requirements into {py}")
        purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        link = env / LINK_FOLDER / "schedspec"
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(where, target_is_directory=True)
        Path(purelib, f"{LINK_FOLDER}.pth").write_text(f"{link.parent}\n")
    if imported_schedspec(py) != ours:
        raise UsageError(f"schedspec was installed into {py}, but it does not import this schedspec ({ours})")


def run_checked(command: list[str], what: str, env: dict[str, str] | None = None) -> None:
    try:
        proc = subprocess.run(command, env=env, check=False)
    except OSError as e:
        raise UsageError(f"{what}: cannot run {command[0]}: {e.strerror or e}") from None
    if proc.returncode != 0:
        raise UsageError(f"{what} failed (exit {proc.returncode}); see the output above")


def install_vllm(version: str | None) -> int:
    """Install vLLM `version` (None: the default release, into this interpreter)."""
    if not SCRIPT.is_file():
        raise UsageError(f"{SCRIPT} is missing from this schedspec install; "
                         "install vLLM by hand as cli/install/requirements-vllm.txt describes")
    command = ["bash", str(SCRIPT)]
    if version is None:
        run_checked(command, "installing vLLM", dict(os.environ, PYTHON=sys.executable))
        return 0
    from .vllm_version import check_vllm, env_dir, env_python

    # A release the spec does not model yet installs too (schedspec keep-up X needs it).
    check_vllm(version, "--version")
    # The new environment's interpreter is this one's base Python (a venv's, not the venv).
    env = dict(os.environ, BASE_PYTHON=getattr(sys, "_base_executable", sys.executable),
               VLLM_ENV_DIR=str(env_dir(version)))
    run_checked(command + [version], f"installing vLLM {version}", env)
    install_schedspec_into(env_python(version), env_dir(version))
    print(f"install-vllm: done; try `schedspec diff --impl vllm=={version} --scenarios 100`")
    return 0


def cmd_install_vllm(args) -> int:
    return install_vllm(args.version)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "install-vllm", help=f"install vLLM {DEFAULT_RELEASE} (CPU only) for --impl vllm",
        description=f"Install torch 2.13.0 (CPU), vllm {DEFAULT_RELEASE} and the scheduler's import "
                    "dependencies into this Python (cli/install/install-vllm.sh). Idempotent.")
    p.add_argument("--version", metavar="X", default=None,
                   help=f"install vLLM release X ({RELEASES[0]} ... {RELEASES[-1]}) into its own virtualenv under "
                        "$SCHEDSPEC_CACHE/vllm-envs/X (default ~/.cache/schedspec/vllm-envs/X), for --impl vllm==X")
    p.set_defaults(func=cmd_install_vllm)
