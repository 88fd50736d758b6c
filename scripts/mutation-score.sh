#!/usr/bin/env bash
# The spec's mutation score against the proofs' agreement tests
# (proofs/README.md "Mutation score"): mutmut mutates the spec's
# scheduling core ([tool.mutmut] in pyproject.toml), runs the agreement tests
# against each mutant, then scripts/mutation_report.py prints the score and
# every mutant not killed, with the line it changes.
#
#   scripts/mutation-score.sh [MUTANT_NAME ...]    (JOBS=N: mutants run at once, default: cores)
#
# mutmut works in ./mutants (git ignores it) and keeps its results there, so an
# interrupted run resumes; `rm -rf mutants` starts afresh.  On 2 cores the whole
# run takes about 1.5 hours.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c "import mutmut" 2>/dev/null; then
    .venv/bin/pip install -q "mutmut==3.8.1"  # as pyproject.toml's `mutation` extra
fi
.venv/bin/mutmut run --max-children "${JOBS:-$(nproc)}" "$@"
.venv/bin/python scripts/mutation_report.py
