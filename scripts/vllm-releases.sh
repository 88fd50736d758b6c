#!/usr/bin/env bash
# Every vLLM release schedspec models, against the spec: install each release's own
# environment (idempotent, about 70 s and 2 GB each the first time), then run
# `schedspec diff --impl vllm==X --scenarios N --seed S` on it and print one table
# row per release, with the time it took.  Exit 1 if any release diverges.
#
#   scripts/vllm-releases.sh                 # 2000 scenarios of seed 21 per release
#   SCENARIOS=300 scripts/vllm-releases.sh   # quicker
#   RELEASES="0.34.0 0.33.0" scripts/vllm-releases.sh
#
# On this 2-core machine, 2000 scenarios take 1 to 2.5 min per release (about 17 min for
# all eight, installs not counted); 300 take about 15 to 25 s each.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
SCENARIOS=${SCENARIOS:-2000}
SEED=${SEED:-21}
RELEASES=${RELEASES:-"0.34.0 0.33.0 0.32.0 0.31.0 0.30.0 0.28.0 0.25.0 0.20.0"}
# The release setup.sh installs into .venv (spec/versions.py DEFAULT_RELEASE).
DEFAULT=$("$PY" -c 'from schedspec.spec.versions import DEFAULT_RELEASE; print(DEFAULT_RELEASE)')
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"

status=0
start_all=$(date +%s)
rows=()
for v in $RELEASES; do
  if [ "$v" = "$DEFAULT" ]; then
    "$PY" -m schedspec install-vllm >&2
  else
    "$PY" -m schedspec install-vllm --version "$v" >&2
  fi
  t0=$(date +%s)
  rc=0
  "$PY" -m schedspec diff --impl "vllm==$v" --scenarios "$SCENARIOS" --seed "$SEED" \
    -o "$OUT/divergences-$v" --json > "$OUT/$v.json" 2> "$OUT/$v.err" || rc=$?
  t1=$(date +%s)
  row=$("$PY" - "$OUT/$v.json" "$v" "$((t1 - t0))" "$rc" <<'EOF'
import json, sys
path, v, wall, rc = sys.argv[1:5]
text = open(path).read()
try:
    r = json.loads(text[text.index("{"):])
except ValueError:
    print(f"| {v} | - | - | error (exit {rc}) | {wall} s |")
    sys.exit()
rejected = r.get("coverage", {}).get("rejected scenarios", 0)
print(f"| {v} | {r['scenarios']} ({rejected} refused by both) | {r['steps_compared']} | "
      f"{len(r['divergences'])} | {wall} s |")
EOF
)
  rows+=("$row")
  [ "$rc" = 0 ] || status=1
done
echo "| release | scenarios | steps compared | divergences | time |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo "total: $(( $(date +%s) - start_all )) s; reports in $OUT"
exit $status
