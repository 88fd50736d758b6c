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


# --- the two cores -------------------------------------------------------------------------------
# The README's `python -m pytest` runs on every core with pytest-xdist
# (pyproject.toml: -n auto --dist loadgroup --no-loadscope-reorder).  Each file is an
# xdist group, so its module fixtures (a vLLM scheduler, a z3 context) are built
# once; files that share the default cache folder (the peer-tests runs and the
# release installs there) are one group, so that two workers never race on it.
# Groups are handed out heaviest first, by the seconds in file_weights.json, so the
# longest files start at once and the short ones fill in at the end.

SHARED_CACHE = ("test_peer_tests.py", "test_peer_tests_versions.py", "test_versions.py")
UNKNOWN_WEIGHT = 5.0


def group_of(file: str) -> str:
    return "shared-cache" if file in SHARED_CACHE else file


def heaviest_first(files: list[str], weights: dict[str, float]) -> list[str]:
    """The groups of `files`, heaviest (summed weight) first; ties by name."""
    load: dict[str, float] = {}
    for f in files:
        load[group_of(f)] = load.get(group_of(f), 0.0) + weights.get(f, UNKNOWN_WEIGHT)
    return sorted(load, key=lambda g: (-load[g], g))


def file_weights() -> dict[str, float]:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parent / "file_weights.json").read_text())["seconds"]


# tryfirst: xdist's worker reads the xdist_group marks in its own
# pytest_collection_modifyitems; run after it, these marks would come too late and
# every test would be a group of its own (tests/test_file_groups.py runs two workers
# and checks that no file is split).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if mutation_run():
        for_mutation_run(items)
        return
    rank = {g: i for i, g in enumerate(heaviest_first(sorted({i.path.name for i in items}), file_weights()))}
    items.sort(key=lambda item: rank[group_of(item.path.name)])  # stable: a file keeps its order
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item.path.name)))


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
