#!/usr/bin/env bash
# The torch implementation on a CUDA machine: the differential campaign against
# the spec on cuda (the four combinations of prefix caching and async scheduling,
# as torch campaigns draw them, then each async combination alone), the shipped
# examples against the spec (the async ones included), then the spec-vs-torch
# benchmark on cuda, decode workload: both flags off, prefix caching, async
# scheduling, both on (and a shared system prompt), and both on with every full
# trace written to disk (the trace text rendered on the host, gpu/trace_render.c).  Without CUDA it says so and
# exits 0 (nothing to check here).
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
echo "== differential campaign: $N random scenarios, seed 3, torch on cuda against the spec (all four flag combinations)"
"$PY" -m schedspec diff --impl torch --device cuda --scenarios "$N" --seed 3 -o "$out/divergences"

echo "== differential campaign: async scheduling only (with and without prefix caching), seed 5"
"$PY" -m schedspec diff --impl torch --device cuda --scenarios "$N" --seed 5 --flags async,async+prefix \
    -o "$out/divergences-async"

echo "== shipped examples: torch on cuda against the spec"
"$PY" -m schedspec diff --impl torch --device cuda -o "$out/divergences-examples" reference/examples/*.json

echo "== benchmark: scenario-steps per second, spec vs torch on cuda"
"$PY" benchmarks/torch_vs_spec.py --device cuda
"$PY" benchmarks/torch_vs_spec.py --device cuda --workload decode --summaries-only
"$PY" benchmarks/torch_vs_spec.py --device cuda --workload decode --summaries-only --prefix-caching
"$PY" benchmarks/torch_vs_spec.py --device cuda --workload decode --summaries-only --prefix-caching --shared-prefix 512
"$PY" benchmarks/torch_vs_spec.py --device cuda --workload decode --summaries-only --async-scheduling
"$PY" benchmarks/torch_vs_spec.py --device cuda --workload decode --summaries-only --prefix-caching --async-scheduling \
    --repeat 3
"$PY" benchmarks/torch_vs_spec.py --device cuda --workload decode --prefix-caching --async-scheduling
mkdir -p "$out/traces"
"$PY" benchmarks/torch_vs_spec.py --device cuda --workload decode --prefix-caching --async-scheduling \
    --write-traces "$out/traces" --repeat 3
