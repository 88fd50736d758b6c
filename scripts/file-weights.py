#!/usr/bin/env python3
"""Refresh tests/file_weights.json from the test times of a run:

    .venv/bin/python -m pytest --junitxml=/tmp/junit.xml
    python3 scripts/file-weights.py /tmp/junit.xml

or from logs of runs with `--durations=0` (e.g. the two shards of a CI run made with
PYTEST_ADDOPTS=--durations=0; each log's "NN.NNs call|setup|teardown tests/..." lines):

    python3 scripts/file-weights.py shard1.log shard2.log

Several reports are summed (disjoint shards).  Seconds per test file;
tests/conftest.py hands files to the cores heaviest first by them."""

import collections
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

DURATION = re.compile(r"^\s*([0-9.]+)s (?:call|setup|teardown)\s+tests/([^/:\s]+\.py)::")


def file_seconds(report: Path) -> collections.Counter:
    seconds: collections.Counter = collections.Counter()
    text = report.read_text(errors="replace")
    if text.lstrip().startswith("<"):
        for case in ET.fromstring(text).iter("testcase"):
            parts = (case.get("classname") or "").split(".")
            if len(parts) >= 2 and parts[0] == "tests":
                seconds[parts[1] + ".py"] += float(case.get("time") or 0)
    else:
        for line in text.splitlines():
            m = DURATION.match(line)
            if m:
                seconds[m.group(2)] += float(m.group(1))
    return seconds


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: scripts/file-weights.py REPORT [REPORT ...] (JUnit XML, or a --durations=0 log)",
              file=sys.stderr)
        return 2
    seconds: collections.Counter = collections.Counter()
    for name in argv:
        try:
            found = file_seconds(Path(name))
        except (OSError, ET.ParseError) as e:
            print(f"file-weights: {name}: cannot read it as a report ({e})", file=sys.stderr)
            return 2
        if not found:
            print(f"file-weights: {name}: no test times in it (JUnit XML, or a log of a --durations=0 run)",
                  file=sys.stderr)
            return 2
        seconds.update(found)
    path = Path(__file__).resolve().parent.parent / "tests" / "file_weights.json"
    doc = json.loads(path.read_text())
    doc["seconds"] = {name: round(s, 1) for name, s in sorted(seconds.items())}
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"{path}: {len(seconds)} files, {sum(seconds.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
