"""Every fixed bug keeps its scenario (tests/regressions/*.json): each one runs on the
spec with every property holding, and where vLLM is installed, vLLM's trace equals
the spec's step for step."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import cli
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.loader import load_impl
from schedspec.reference.scenario import load_scenario

FILES = sorted((Path(__file__).parent / "regressions").glob("*.json"))


def test_there_are_regression_files():
    assert FILES


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_regression_holds_on_the_spec(capsys, path):
    rc, out, err = cli(capsys, "check", path)
    assert rc == 0, out + err
    assert "0 violated" in out


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_regression_agrees_with_vllm(vllm, path):
    scenario = load_scenario(path)
    spec = run_scenario(scenario, load_impl("spec"))
    real = run_scenario(scenario, vllm)
    assert compare_traces(spec, real) is None
