"""How the suite is dealt to the cores (conftest.py): a group per file, the files that
share the cache folder as one group, the heaviest groups first."""

import itertools
import re
import os
import subprocess
import sys
from pathlib import Path

from conftest import SHARED_CACHE, file_weights, group_of, heaviest_first

ROOT = Path(__file__).resolve().parent.parent


def test_a_group_per_file_and_one_for_the_cache_sharers():
    assert group_of("test_cli.py") == "test_cli.py"
    assert len({group_of(f) for f in SHARED_CACHE}) == 1
    assert group_of(SHARED_CACHE[0]) not in {group_of("test_cli.py"), group_of("test_plot.py")}


def test_heaviest_group_first():
    files = ["a.py", "b.py", "c.py", *SHARED_CACHE]
    weights = {"a.py": 100, "b.py": 60, "c.py": 50, SHARED_CACHE[0]: 10, SHARED_CACHE[1]: 10}
    # the cache sharers weigh 10 + 10 + an unknown file's weight together
    assert heaviest_first(files, weights) == ["a.py", "b.py", "c.py", group_of(SHARED_CACHE[0])]
    assert heaviest_first(["x.py", "y.py"], {}) == ["x.py", "y.py"]  # ties by name
    assert heaviest_first(files, {**weights, "c.py": 20})[2] == group_of(SHARED_CACHE[0])


def test_every_test_file_has_a_weight():
    """A new file weighs UNKNOWN_WEIGHT until scripts/file-weights.py refreshes the
    table; a heavy one would then start last and hold the run up."""
    files = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    assert files - set(file_weights()) <= {"test_file_groups.py", "test_docs_site.py", "test_wheel.py"}


def test_the_collection_is_ordered_and_grouped():
    """The real collection, one process: heaviest file first, every test in its group."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    files = ["tests/test_plot.py", "tests/test_peer_tests.py", "tests/test_versions.py", "tests/test_cli.py"]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-n", "0",
                          "-p", "no:cacheprovider", *files],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    names = [line.split("::")[0].rsplit("/", 1)[-1] for line in out.stdout.splitlines() if "::" in line]
    runs = [name for name, _ in itertools.groupby(names)]
    assert len(runs) == len(set(runs)) == 4, runs  # each file's tests together
    assert [g for g, _ in itertools.groupby(map(group_of, runs))] == heaviest_first(runs, file_weights())


def test_two_workers_never_split_a_file(tmp_path):
    """A real two-worker session with this conftest.py: each file's tests all run on
    one worker, under its group's name.  (With pytest 9.2 and pytest-xdist 3.8 the
    group marks are silently ignored, pytest-dev/pytest-xdist#1386, and each test is
    dealt out alone.)  Two small files of their own keep it quick."""
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("conftest.py", "file_weights.json"):
        (tests / name).write_text((ROOT / "tests" / name).read_text())
    files = ["test_one.py", "test_two.py"]
    for name in files:
        (tests / name).write_text("import pytest\n\n\n@pytest.mark.parametrize('i', range(6))\n"
                                  "def test_it(i):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    out = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-vv",
                          "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--rootdir", str(tmp_path),
                          *(f"tests/{f}" for f in files)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    workers: dict[str, set[str]] = {}
    for line in out.stdout.splitlines():
        m = re.match(r"\[(gw\d+)\] .*PASSED (tests/(test_\w+\.py)::\S+)", line)
        if m:
            assert m.group(2).endswith("@" + group_of(m.group(3))), line  # the group xdist saw
            workers.setdefault(m.group(3), set()).add(m.group(1))
    assert set(workers) == set(files), out.stdout[-2000:]
    assert all(len(w) == 1 for w in workers.values()), workers
