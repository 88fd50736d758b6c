#!/usr/bin/env python3
"""Refresh tests/shard_weights.json from a pytest JUnit XML report:

    .venv/bin/python -m pytest --junitxml=/tmp/junit.xml
    python3 scripts/shard-weights.py /tmp/junit.xml

Seconds per test file; SCHEDSPEC_TEST_SHARD=k/n (tests/conftest.py) balances by them."""

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

if len(sys.argv) != 2:
    sys.exit("usage: scripts/shard-weights.py JUNIT_XML")
seconds: collections.Counter = collections.Counter()
for case in ET.parse(sys.argv[1]).iter("testcase"):
    parts = (case.get("classname") or "").split(".")
    if len(parts) >= 2 and parts[0] == "tests":
        seconds[parts[1] + ".py"] += float(case.get("time") or 0)
path = Path(__file__).resolve().parent.parent / "tests" / "shard_weights.json"
doc = json.loads(path.read_text())
doc["seconds"] = {name: round(s, 1) for name, s in sorted(seconds.items())}
path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
print(f"{path}: {len(seconds)} files, {sum(seconds.values()):.0f} s")
