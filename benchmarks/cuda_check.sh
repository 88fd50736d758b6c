#!/usr/bin/env bash
# The torch implementation on a CUDA machine: the differential campaign against
# the spec on cuda (prefix caching drawn on and off, as torch campaigns draw it),
# the prefix-caching examples against the spec, then the spec-vs-torch benchmark
# on cuda, decode workload without and with prefix caching (and a shared system
# prompt).  Without CUDA it says so and exits 0 (nothing to check here).
#
#   benchmarks/cuda_check.sh [SCENARIOS]      # default 5000 scenarios, seed 3
#
# Run from the repository root after ./setup.sh.  Exit status: 0 all agree (or
# no CUDA), 1 a divergence, 2 a usage error, else a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
N="${1:-5000}"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "cuda_check: no CUDA device visible to torch on this machine; skipping (nothing checked)"
    exit 0
fi
"$PY" -c 'import torch; print("cuda_check:", torch.cuda.get_device_name(0), "torch", torch.__version__)'

out="$(mktemp -d "${TMPDIR:-/tmp}/cuda_check.XXXXXX")"
echo "== differential campaign: $N random scenarios, seed 3, torch on cuda against the spec (prefix caching on/off)"
"$PY" -m schedspec diff --impl torch --device cuda --scenarios "$N" --seed 3 -o "$out/divergences"

echo "== prefix-caching examples: torch on cuda against the spec"
"$PY" -m schedspec diff --impl torch --device cuda -o "$out/divergences-examples" \
    prefix-eviction prefix-resume-hit prefix-shared-system-prompt

echo "== benchmark: scenario-steps per second, spec vs torch on cuda"
"$PY" benchmarks/torch_vs_spec.py --device cuda
"$PY" benchmarks/torch_vs_spec.py --device cuda --workload decode --summaries-only
"$PY" benchmarks/torch_vs_spec.py --device cuda --workload decode --summaries-only --prefix-caching
"$PY" benchmarks/torch_vs_spec.py --device cuda --workload decode --summaries-only --prefix-caching --shared-prefix 512
