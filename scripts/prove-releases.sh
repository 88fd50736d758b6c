#!/usr/bin/env bash
# `schedspec prove --vllm-version X` for every release schedspec models: one table
# row per release (obligations, ok, proved, refuted as the release's known vLLM
# bugs, seconds) and the findings.  No vLLM install is needed: the proofs are on
# the spec's rules.  Exit 1 if any release has an obligation that is not ok.
#
#   scripts/prove-releases.sh                     # every modelled release
#   RELEASES="0.33.0 0.25.0" scripts/prove-releases.sh
#   BOUND=3 scripts/prove-releases.sh             # prove --bound 3 (default: prove's own, 4 + 4)
#
# On this 2-core machine each release took 1.5 to 3 min at the former default bound
# 3 + 3 (about 15 min for all); at 4 + 4, 0.33.0 takes about 7 min.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
RELEASES=${RELEASES:-"0.34.0 0.33.0 0.32.0 0.31.0 0.30.0 0.28.0 0.25.0 0.20.0"}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"

status=0
for v in $RELEASES; do
  echo "prove --vllm-version $v ..." >&2
  rc=0
  "$PY" -m schedspec prove --vllm-version "$v" ${BOUND:+--bound "$BOUND"} --json -o "$OUT/witnesses-$v" \
    > "$OUT/prove-$v.json" || rc=$?
  if [ "$rc" -gt 1 ]; then echo "prove --vllm-version $v failed (exit $rc)" >&2; exit "$rc"; fi
  [ "$rc" -eq 0 ] || status=1
done

"$PY" - "$OUT" $RELEASES <<'PYEOF'
import json, sys
out, releases = sys.argv[1], sys.argv[2:]
print("| release | obligations | ok | proved | refuted (release's vLLM bug) | seconds |")
print("|---|---|---|---|---|---|")
findings = {}
for v in releases:
    d = json.load(open(f"{out}/prove-{v}.json"))
    rows = d["obligations"]
    found = [r for r in rows if r.get("finding")]
    for r in found:
        findings.setdefault(r["finding"], []).append(r["name"])
    print(f"| {v} | {len(rows)} | {sum(r['ok'] for r in rows)} | {sum(r['result'] == 'proved' for r in rows)} | "
          f"{sum(r['result'] == 'refuted' for r in found)} | {d['seconds']:.0f} |")
for f, names in findings.items():
    print(f"\n- {f}: {', '.join(names)}")
PYEOF
echo "reports in $OUT" >&2
exit $status
