"""`schedspec install-vllm`: install the real vLLM 0.33.0 scheduler (CPU only)
into the running interpreter, with scripts/install-vllm.sh."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from schedspec.base.errors import UsageError

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
    env = dict(os.environ, PYTHON=sys.executable)
    try:
        proc = subprocess.run(["bash", str(script)], env=env, check=False)
    except OSError as e:
        raise UsageError(f"cannot run {script}: {e.strerror or e}") from None
    if proc.returncode != 0:
        raise UsageError(f"installing vLLM failed (exit {proc.returncode} from {script}); "
                         "see the pip output above")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "install-vllm", help="install vLLM 0.33.0 (CPU only) for --impl vllm",
        description="Install torch 2.13.0 (CPU), vllm 0.33.0 and the scheduler's import "
                    "dependencies into this Python (scripts/install-vllm.sh). Idempotent.")
    p.set_defaults(func=cmd_install_vllm)
