"""SCHEDSPEC_TEST_SHARD (conftest.py): the n shards are disjoint and together the whole suite."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SAME_SHARD, parse_shard, shard_of_files

ROOT = Path(__file__).resolve().parent.parent


def collected(shard: str | None) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "SCHEDSPEC_TEST_SHARD"}
    if shard:
        env["SCHEDSPEC_TEST_SHARD"] = shard
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider",
                          "tests/test_shards.py", "tests/test_peer_tests.py", "tests/test_versions.py",
                          "tests/test_cli.py", "tests/test_plot.py", "tests/test_sweep.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 5), out.stdout[-2000:] + out.stderr[-2000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_shards_are_disjoint_and_cover_the_suite():
    whole = collected(None)
    parts = [collected(f"{k}/3") for k in (1, 2, 3)]
    assert whole and sum(len(p) for p in parts) == len(whole) and set().union(*parts) == whole
    shard_of = {t.split("::")[0]: k for k, p in enumerate(parts) for t in p}
    assert shard_of["tests/test_peer_tests.py"] == shard_of["tests/test_versions.py"]


def test_files_dealt_by_weight_with_the_cache_sharers_together():
    files = ["a.py", "b.py", "c.py", *SAME_SHARD]
    shard = shard_of_files(files, 2, {"a.py": 100, "b.py": 60, "c.py": 50, SAME_SHARD[0]: 10})
    assert shard["a.py"] != shard["b.py"] and len({shard[f] for f in SAME_SHARD}) == 1
    assert set(shard) == set(files) and set(shard.values()) == {1, 2}
    assert shard_of_files(["x.py"], 1, {}) == {"x.py": 1}


@pytest.mark.parametrize("text", ["", "1", "0/2", "3/2", "a/b", "1/0"])
def test_a_bad_shard_is_a_usage_error(text):
    with pytest.raises(pytest.UsageError, match="SCHEDSPEC_TEST_SHARD"):
        parse_shard(text)
