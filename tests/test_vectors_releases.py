"""State vectors carry the vLLM release they model: the pre-state's
`config.vllm_version`, with that release's rules, 0.20.0's free-queue order
(versions.UNHASHED_FREE_BLOCKS_FIRST) included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from schedspec.reference.vectors import VectorError, check_vector, read_vector, validate_vector
from schedspec.reference.impl import SpecScheduler
from schedspec.spec import versions

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "docs" / "changes" / "unhashed_free_blocks_first.json"


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "schedspec", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def vectors_0_20(tmp_path_factory):
    out = tmp_path_factory.mktemp("v") / "out"
    r = run_cli("vectors", "export", "--vllm-version", "0.20.0", "--out", str(out), str(SCENARIO))
    assert r.returncode == 0, r.stderr
    return sorted(out.rglob("*.json"))


def as_release(vector, version):
    """The vector relabelled as `version`'s (what a writer that forgot the release would give)."""
    v = json.loads(json.dumps(vector))
    v["vllm_version"] = version
    for key in ("pre_state", "post_state"):
        v[key]["config"]["vllm_version"] = version
    return v


def test_vectors_name_their_release_and_replay_on_it(vectors_0_20):
    assert len(vectors_0_20) >= 5
    for path in vectors_0_20:
        v = read_vector(path)
        assert v["vllm_version"] == "0.20.0" == v["pre_state"]["config"]["vllm_version"]
        assert check_vector(v, SpecScheduler()) == [], path


def test_the_free_queue_order_of_0_20_0_is_what_the_vectors_check(vectors_0_20):
    # The same calls read as 0.25.0's: freed unhashed blocks then go first, so some
    # vector's expected state no longer follows; the release is not decoration.
    differ = 0
    for path in vectors_0_20:
        v = as_release(read_vector(path), "0.25.0")
        validate_vector(v)
        differ += bool(check_vector(v, SpecScheduler()))
    assert differ >= 1
    assert not versions.has("0.20.0", versions.UNHASHED_FREE_BLOCKS_FIRST)


def test_a_vector_whose_release_disagrees_with_its_pre_state_is_refused(vectors_0_20):
    v = read_vector(vectors_0_20[0])
    v["vllm_version"] = "0.33.0"
    with pytest.raises(VectorError, match="vllm_version.*0.20.0"):
        validate_vector(v)
    v["vllm_version"] = "0.29.0"  # not a release schedspec models
    with pytest.raises(VectorError, match="vllm_version"):
        validate_vector(v)
