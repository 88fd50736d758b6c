"""Fixtures shared by the test files."""

from __future__ import annotations

import os

import pytest


def vllm_required() -> bool:
    """CI (CI=true) and SCHEDSPEC_REQUIRE_VLLM=1 must have vLLM: a missing install
    is a failure there, a skip elsewhere."""
    return os.environ.get("SCHEDSPEC_REQUIRE_VLLM") == "1" or os.environ.get("CI") == "true"


@pytest.fixture(scope="module")
def vllm():
    """The real vLLM scheduler (.venv's: the default release) behind the implementation protocol."""
    try:
        from schedspec.reference.vllm_adapter import VllmScheduler

        impl = VllmScheduler()
    except ImportError as e:
        if vllm_required():
            pytest.fail(f"vLLM is required here (SCHEDSPEC_REQUIRE_VLLM=1 or CI=true) but cannot be imported: {e}")
        pytest.skip(f"vLLM is not installed ({e}); run `schedspec install-vllm`")
    yield impl
    impl.close()


# --- shards ------------------------------------------------------------------------------------
# SCHEDSPEC_TEST_SHARD=k/n runs the k-th of n disjoint parts of the suite (CI runs
# both halves at once on its two cores); the n parts together are the whole suite.
# Whole files are dealt, heaviest first, each to the lightest shard so far, by the
# seconds in shard_weights.json, so a file's module fixtures are built once.  Files
# that share the default cache folder (the peer-tests runs and the release installs
# there) stay in one shard, so that two shards never race on it.

SAME_SHARD = ("test_peer_tests.py", "test_peer_tests_versions.py", "test_versions.py")


def parse_shard(text: str) -> tuple[int, int]:
    k, sep, n = text.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise pytest.UsageError(f"SCHEDSPEC_TEST_SHARD: {text!r} is not k/n with 1 <= k <= n")
    return int(k), int(n)


def shard_of_files(files: list[str], n: int, weights: dict[str, float]) -> dict[str, int]:
    """file name -> shard (1..n): SAME_SHARD as one unit, then heaviest first to the lightest shard."""
    units: list[tuple[str, ...]] = []
    together = tuple(f for f in files if f in SAME_SHARD)
    if together:
        units.append(together)
    units += [(f,) for f in files if f not in SAME_SHARD]
    units.sort(key=lambda u: (-sum(weights.get(f, 5.0) for f in u), u))
    load = [0.0] * n
    out = {}
    for unit in units:
        k = min(range(n), key=lambda i: (load[i], i))
        load[k] += sum(weights.get(f, 5.0) for f in unit)
        out.update({f: k + 1 for f in unit})
    return out


def pytest_collection_modifyitems(config, items):
    if mutation_run():
        for_mutation_run(items)
    text = os.environ.get("SCHEDSPEC_TEST_SHARD")
    if not text:
        return
    import json
    from pathlib import Path

    k, n = parse_shard(text)
    weights = json.loads((Path(__file__).parent / "shard_weights.json").read_text())["seconds"]
    names = sorted({item.path.name for item in items})
    shard = shard_of_files(names, n, weights)
    keep = [item for item in items if shard[item.path.name] == k]
    config.hook.pytest_deselected(items=[item for item in items if shard[item.path.name] != k])
    items[:] = keep


# --- mutation runs (scripts/mutation-score.sh) --------------------------------------------------
# mutmut runs the selected tests once per mutant, stopping at the first failure
# (-x), with the mutant's name in MUTANT_UNDER_TEST.  There a failing example
# is all that counts, so hypothesis does not shrink it, and the tests run in
# the order pyproject.toml lists them, cheapest first: a mutant they kill costs
# only them.  The verdicts are the same, only sooner.

def mutation_order() -> list[str]:
    """The test files of [tool.mutmut]'s selection (pyproject.toml), in its order."""
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    selection = pyproject["tool"]["mutmut"]["pytest_add_cli_args_test_selection"]
    files = [t.split("::")[0].rsplit("/", 1)[-1] for t in selection]
    return list(dict.fromkeys(files))


def mutation_run() -> bool:
    return "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", "")


def for_mutation_run(items) -> None:
    from hypothesis import Phase, settings

    settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate])
    settings.load_profile("mutation")

    order = mutation_order()

    def rank(item):
        name = item.path.name
        return order.index(name) if name in order else len(order)

    items.sort(key=rank)  # stable: each file keeps its own order
