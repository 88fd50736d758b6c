#!/usr/bin/env bash
# Install the real vLLM scheduler, CPU only, for `schedspec diff --impl vllm`.
#
# `schedspec install-vllm` runs it (cli/install_vllm.py); it ships in the package,
# beside the requirement files it reads:
#
#   PYTHON=/path/to/python install-vllm.sh  # vLLM 0.34.0 into that interpreter
#   BASE_PYTHON=/path/to/python3 install-vllm.sh 0.30.0
#                                           # vLLM 0.30.0 into its own virtualenv,
#                                           # $VLLM_ENV_DIR, else $SCHEDSPEC_CACHE/vllm-envs/0.30.0
#                                           # (default ~/.cache/schedspec/vllm-envs/0.30.0);
#                                           # schedspec itself is then installed into it
#                                           # by cli/install_vllm.py
#
# Idempotent: does nothing when the pinned versions are already installed and
# the scheduler imports.  About 100 s and 2.2 GB on a fresh environment.
# Steps (see requirements-vllm.txt):
#   1. torch==2.13.0 first (a CPU build, where the package index provides one;
#      set TORCH_INDEX_URL to pick another index for torch);
#   2. vllm==X with --no-deps, then the xgrammar version vllm==X requires in its
#      own metadata (0.34.0 and 0.33.0: ==0.2.8; 0.30.0: <1.0.0,>=0.2.1), --no-deps
#      too: vLLM's own pins would pull a CUDA torch (0.34.0 asks torch 2.14.0; the
#      scheduler runs on 2.13.0) and triton (several GB) the scheduler does not use;
#   3. requirements-vllm-X.txt where a release needs other packages than
#      requirements-vllm.txt (0.20.0 also imports gguf), else requirements-vllm.txt
#      (the same pins serve 0.25.0 to 0.34.0): what importing vllm.v1.core.sched.scheduler and building ModelConfig need.
#      pip then warns about vLLM's unmet pins; they do not matter to the
#      scheduler, which is pure Python;
#   4. (a release's own virtualenv only, by cli/install_vllm.py) schedspec itself,
#      so that `--impl vllm==X` can run the spec and that release in one process.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TORCH_VERSION=2.13.0
DEFAULT_VLLM_VERSION=0.34.0  # spec/versions.py DEFAULT_RELEASE
VLLM_VERSION=${1:-$DEFAULT_VLLM_VERSION}

if ! [[ "$VLLM_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "install-vllm: version '$VLLM_VERSION' is not of the form X.Y.Z (e.g. 0.30.0)" >&2
  exit 2
fi

if [ $# -ge 1 ]; then
  CACHE=${SCHEDSPEC_CACHE:-$HOME/.cache/schedspec}
  ENV_DIR=${VLLM_ENV_DIR:-$CACHE/vllm-envs/$VLLM_VERSION}
  PY=$ENV_DIR/bin/python
  if [ ! -x "$PY" ]; then
    BASE=${BASE_PYTHON:-python3}
    if ! "$BASE" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "install-vllm: $BASE is not Python >= 3.11; set BASE_PYTHON=/path/to/python3.11" >&2
      exit 2
    fi
    mkdir -p "$(dirname "$ENV_DIR")"
    "$BASE" -m venv "$ENV_DIR"
  fi
else
  if [ -z "${PYTHON:-}" ]; then
    echo "install-vllm: set PYTHON=/path/to/python (the interpreter to install vLLM into)" >&2
    exit 2
  fi
  PY=$PYTHON
fi

REQ="$HERE/requirements-vllm-$VLLM_VERSION.txt"
[ -f "$REQ" ] || REQ="$HERE/requirements-vllm.txt"

if [ ! -x "$PY" ]; then
  echo "install-vllm: no Python interpreter at $PY; create .venv or set PYTHON=/path/to/python" >&2
  exit 2
fi
if [ ! -f "$REQ" ]; then
  echo "install-vllm: $REQ is missing" >&2
  exit 2
fi

# The xgrammar requirement the installed vllm states (Requires-Dist, without its
# marker): "==0.2.8" for 0.34.0 and 0.33.0, a range such as "<1.0.0,>=0.2.1"
# for 0.30.0; empty if none.
xgrammar_pin() {
  "$PY" - <<'EOF' 2>/dev/null
import importlib.metadata as m, re
for req in m.requires("vllm") or ():
    found = re.match(r"xgrammar\s*([<>=!~][^;]*)", req)
    if found:
        print(found.group(1).replace(" ", ""))
        break
EOF
}

check() {
  VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_LOGGING_LEVEL=ERROR \
    "$PY" - "$TORCH_VERSION" "$VLLM_VERSION" "$(xgrammar_pin)" <<'EOF' >/dev/null 2>&1
import importlib.metadata as m, sys
from packaging.specifiers import SpecifierSet
torch_v, vllm_v, xg_spec = sys.argv[1:4]
assert m.version("torch").split("+")[0] == torch_v
assert m.version("vllm") == vllm_v
assert not xg_spec or m.version("xgrammar") in SpecifierSet(xg_spec)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401
from vllm.config import ModelConfig, VllmConfig  # noqa: F401
EOF
}

if check; then
  echo "install-vllm: vllm $VLLM_VERSION (torch $TORCH_VERSION) is already installed for $PY"
  exit 0
fi

# Byte-compiling all of torch and transformers is most of the install's CPU time;
# Python compiles what the scheduler imports on first use and keeps it, unless
# PYTHONDONTWRITEBYTECODE is set, where pip's compiled files are the only ones.
nocompile=--no-compile
[ -z "${PYTHONDONTWRITEBYTECODE:-}" ] || nocompile=
echo "install-vllm: installing torch $TORCH_VERSION, vllm $VLLM_VERSION into $PY" >&2
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  "$PY" -m pip install $nocompile "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX_URL"
else
  "$PY" -m pip install $nocompile "torch==$TORCH_VERSION"
fi
"$PY" -m pip install $nocompile --no-deps "vllm==$VLLM_VERSION"
XGRAMMAR_SPEC=$(xgrammar_pin)
if [ -n "$XGRAMMAR_SPEC" ]; then
  "$PY" -m pip install $nocompile --no-deps "xgrammar$XGRAMMAR_SPEC"
fi
"$PY" -m pip install $nocompile -r "$REQ"

if ! check; then
  echo "install-vllm: installed, but \`from vllm.v1.core.sched.scheduler import Scheduler\` still fails in $PY" >&2
  exit 1
fi
echo "install-vllm: vllm $VLLM_VERSION installed into $PY"
