#!/usr/bin/env bash
# Quick start, step 1: create .venv at the repo root, install schedspec with its
# test tools and the real vLLM 0.34.0 scheduler (the differential-testing oracle),
# then run the shipped examples.
#
#   ./setup.sh              # everything
#   ./setup.sh --no-vllm    # skip vLLM (the vLLM differential tests then skip)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

with_vllm=1
for arg in "$@"; do
  case "$arg" in
    --no-vllm) with_vllm=0 ;;
    *) echo "setup.sh: unknown option $arg (use --no-vllm or nothing)" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup.sh: schedspec needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# Byte-compiling every installed file is more than half the install's CPU time; Python
# compiles the modules it imports on first use and keeps them, unless
# PYTHONDONTWRITEBYTECODE is set, where only pip's compiled files would ever exist.
nocompile=--no-compile
[ -z "${PYTHONDONTWRITEBYTECODE:-}" ] || nocompile=
# torch first, pinned: this version resolves to the CPU build on this machine kind;
# an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q --disable-pip-version-check $nocompile torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check $nocompile -e '.[test,gpu,ray]'
if [ "$with_vllm" = 1 ]; then
  .venv/bin/schedspec install-vllm
fi
bash scripts/install-browser.sh   # Chromium for the explore page's browser tests; never fails
.venv/bin/schedspec examples
