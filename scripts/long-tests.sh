#!/usr/bin/env bash
# The tests marked `long` (pyproject.toml): searches and campaigns of a minute or
# so each, whose smaller siblings run in the default suite (and in CI).  Prints
# pytest's per-test times.  Run before a release, or after changing what they cover:
#   scripts/long-tests.sh            # all of them
#   scripts/long-tests.sh -k crosshair
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec .venv/bin/python -m pytest -m long --durations=0 "$@"
