#!/usr/bin/env bash
# Install the real vLLM 0.33.0 scheduler, CPU only, for `schedspec diff --impl vllm`.
#
#   scripts/install-vllm.sh                 # into .venv/bin/python of this repo
#   PYTHON=/path/to/python scripts/install-vllm.sh
#
# Idempotent: does nothing when the pinned versions are already installed and
# the scheduler imports.  About 100 s and 2.2 GB on a fresh environment.
# Steps (see requirements-vllm.txt):
#   1. torch==2.13.0 first (a CPU build, where the package index provides one;
#      set TORCH_INDEX_URL to pick another index for torch);
#   2. vllm==0.33.0 and xgrammar==0.2.9 with --no-deps: vLLM's own pins would
#      pull torch 2.14 with CUDA and triton (several GB) the scheduler does not use;
#   3. requirements-vllm.txt: what importing vllm.v1.core.sched.scheduler and
#      building ModelConfig need.  pip then warns about vLLM's unmet pins (torch
#      2.14, xgrammar 0.2.8, llguidance, fastapi); they do not matter to the
#      scheduler, which is pure Python.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
REQ="$ROOT/requirements-vllm.txt"
TORCH_VERSION=2.13.0
VLLM_VERSION=0.33.0
XGRAMMAR_VERSION=0.2.9

if [ ! -x "$PY" ]; then
  echo "install-vllm: no Python interpreter at $PY; create .venv or set PYTHON=/path/to/python" >&2
  exit 2
fi
if [ ! -f "$REQ" ]; then
  echo "install-vllm: $REQ is missing" >&2
  exit 2
fi

check() {
  VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_LOGGING_LEVEL=ERROR \
    "$PY" - "$TORCH_VERSION" "$VLLM_VERSION" "$XGRAMMAR_VERSION" <<'EOF' >/dev/null 2>&1
import importlib.metadata as m, sys
torch_v, vllm_v, xg_v = sys.argv[1:4]
assert m.version("torch").split("+")[0] == torch_v
assert m.version("vllm") == vllm_v
assert m.version("xgrammar") == xg_v
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401
from vllm.config import ModelConfig, VllmConfig  # noqa: F401
EOF
}

if check; then
  echo "install-vllm: vllm $VLLM_VERSION (torch $TORCH_VERSION) is already installed for $PY"
  exit 0
fi

echo "install-vllm: installing torch $TORCH_VERSION, vllm $VLLM_VERSION into $PY" >&2
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  "$PY" -m pip install "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX_URL"
else
  "$PY" -m pip install "torch==$TORCH_VERSION"
fi
"$PY" -m pip install --no-deps "vllm==$VLLM_VERSION" "xgrammar==$XGRAMMAR_VERSION"
"$PY" -m pip install -r "$REQ"

if ! check; then
  echo "install-vllm: installed, but \`from vllm.v1.core.sched.scheduler import Scheduler\` still fails in $PY" >&2
  exit 1
fi
echo "install-vllm: done; try \`schedspec diff --impl vllm --scenarios 100\`"
