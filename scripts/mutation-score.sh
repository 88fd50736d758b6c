#!/usr/bin/env bash
# The spec's mutation score against the proofs' agreement tests
# (proofs/README.md "Mutation score"): mutmut mutates the spec's
# scheduling core ([tool.mutmut] in pyproject.toml), runs the agreement tests
# against each mutant, then scripts/mutation_report.py prints the score and
# every mutant not killed, with the line it changes.
#
#   scripts/mutation-score.sh [MUTANT_NAME ...]    (JOBS=N: mutants run at once, default: cores)
#
# mutmut names a mutant by its file's path and expects that path to be the module's
# dotted name, so it runs in a staging copy with the installed package's layout
# (build/mutation/schedspec/spec/..., from pyproject.toml's package-dir) and the
# repo's tests/ linked in.  It keeps its results in build/mutation/mutants, so an
# interrupted run resumes; `rm -rf build/mutation` starts afresh.  On 2 cores the whole
# run takes about 1.5 hours.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c "import mutmut" 2>/dev/null; then
    .venv/bin/pip install -q "mutmut==3.8.1"  # as pyproject.toml's `mutation` extra
fi
STAGE=build/mutation
.venv/bin/python - "$STAGE" <<'EOF'
import shutil, sys, tomllib
from pathlib import Path
stage = Path(sys.argv[1])
pyproject = tomllib.loads(Path("pyproject.toml").read_text())
for package, folder in pyproject["tool"]["setuptools"]["package-dir"].items():
    target = stage / Path(*package.split("."))
    for path in Path(folder).rglob("*"):  # refreshed in place: mutmut's own copies stay in mutants/
        if path.is_file() and "__pycache__" not in path.parts:
            (target / path.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / path.relative_to(folder))
# [tool.mutmut] names files of the repo (spec/scheduler.py); in the stage they are schedspec/spec/...
text = Path("pyproject.toml").read_text()
mutmut = pyproject["tool"]["mutmut"]
for name in [*mutmut["only_mutate"], *mutmut["source_paths"]]:
    text = text.replace(f'"{name}"', f'"schedspec/{name}"')
(stage / "pyproject.toml").write_text(text)
EOF
ln -sfn ../../tests "$STAGE/tests"
(cd "$STAGE" && ../../.venv/bin/mutmut run --max-children "${JOBS:-$(nproc)}" "$@")
.venv/bin/python scripts/mutation_report.py --root "$STAGE"
