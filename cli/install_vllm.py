"""`schedspec install-vllm`: install the real vLLM scheduler of the newest modelled
release (spec/versions.py DEFAULT_RELEASE, scripts/install-vllm.sh DEFAULT_VLLM_VERSION;
CPU only) into the running interpreter, with scripts/install-vllm.sh; `--version X`
installs release X into its own virtualenv instead ($SCHEDSPEC_CACHE/vllm-envs/X,
default ~/.cache/schedspec/vllm-envs/X), with schedspec installed editable into
it, for `--impl vllm==X` (cli/vllm_version.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from schedspec.reference.errors import UsageError
from schedspec.spec.versions import DEFAULT_RELEASE, RELEASES

SCRIPT_NAME = "install-vllm.sh"


def script_path() -> Path | None:
    """scripts/install-vllm.sh of the source tree this package runs from."""
    here = Path(__file__).resolve().parent
    for root in (here.parent, *here.parents):
        candidate = root / "scripts" / SCRIPT_NAME
        if candidate.is_file():
            return candidate
    return None


def cmd_install_vllm(args) -> int:
    script = script_path()
    if script is None:
        raise UsageError(f"scripts/{SCRIPT_NAME} not found next to the schedspec sources; "
                         "install vLLM by hand as requirements-vllm.txt describes")
    command = ["bash", str(script)]
    env = dict(os.environ, PYTHON=sys.executable)
    if args.version is not None:
        from .vllm_version import check_vllm, env_dir

        # A release the spec does not model yet installs too (schedspec keep-up X needs it).
        check_vllm(args.version, "--version")
        # The new environment's interpreter is this one's base Python (a venv's, not the venv).
        env = dict(os.environ, BASE_PYTHON=getattr(sys, "_base_executable", sys.executable),
                   VLLM_ENV_DIR=str(env_dir(args.version)))
        command.append(args.version)
    try:
        proc = subprocess.run(command, env=env, check=False)
    except OSError as e:
        raise UsageError(f"cannot run {script}: {e.strerror or e}") from None
    if proc.returncode != 0:
        raise UsageError(f"installing vLLM failed (exit {proc.returncode} from {script}); "
                         "see the pip output above")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "install-vllm", help=f"install vLLM {DEFAULT_RELEASE} (CPU only) for --impl vllm",
        description=f"Install torch 2.13.0 (CPU), vllm {DEFAULT_RELEASE} and the scheduler's import "
                    "dependencies into this Python (scripts/install-vllm.sh). Idempotent.")
    p.add_argument("--version", metavar="X", default=None,
                   help=f"install vLLM release X ({RELEASES[0]} ... {RELEASES[-1]}) into its own virtualenv under "
                        "$SCHEDSPEC_CACHE/vllm-envs/X (default ~/.cache/schedspec/vllm-envs/X), for --impl vllm==X")
    p.set_defaults(func=cmd_install_vllm)
