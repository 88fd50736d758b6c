"""The differential campaign spec vs torch: random scenarios of
reference/generator.py run through `run_batch` as batches and through the spec
engine, compared field by field with compare_traces: 0 divergences."""

import pytest
from schedspec.gpu.batch import run_batch, run_one
from schedspec.gpu.limits import MAX_MODEL_LEN, MAX_STEPS
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import generate_scenario, scenario_rng
from schedspec.base.loader import ImplementationError, load_impl
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import RequestSpec, Scenario
from torch_mutants import MUTANTS, load_torch_mutant

BATCH = 128


def campaign(seed: int, count: int, run=run_batch):
    """(scenario, divergence) for each diverging scenario of the campaign."""
    scenarios = [generate_scenario(scenario_rng(seed, i), i) for i in range(count)]
    torch_traces = []
    for k in range(0, count, BATCH):
        torch_traces += run(scenarios[k:k + BATCH], device="cpu")
    out = []
    for sc, t in zip(scenarios, torch_traces):
        d = compare_traces(run_scenario(sc, SpecScheduler()), t)
        if d is not None:
            out.append((sc, d))
    return out


def test_campaign_agrees():
    # seed 1, so that it is not the mutant test's campaign (seed 0) again
    bad = campaign(1, 500)
    assert not bad, "\n".join(f"{sc.name}: {d.describe()}" for sc, d in bad[:5])


def test_protocol_class_agrees():
    """TorchScheduler through the reference engine: the same traces."""
    for i in range(25):
        sc = generate_scenario(scenario_rng(2, i), i)
        spec = run_scenario(sc, SpecScheduler())
        assert compare_traces(spec, run_scenario(sc, load_impl("torch", device="cpu"))) is None, sc.name
        assert compare_traces(spec, run_one(sc, device="cpu")) is None, sc.name


def test_campaign_sees_a_broken_variant():
    mutant = load_torch_mutant(MUTANTS["requeue_at_back"], name="diff_requeue")
    assert campaign(1, 128, run=mutant.batch.run_batch)


def _scenario(_max_steps=10, **config):
    return Scenario(name="limits", config=config, requests=(RequestSpec(id="a", prompt_len=3, max_tokens=2),),
                    max_steps=_max_steps)


@pytest.mark.parametrize("config, field", [
    ({"max_model_len": MAX_MODEL_LEN + 1, "block_size": 2**20, "max_num_batched_tokens": 2048}, "config.max_model_len"),
    ({"max_num_batched_tokens": 2**62, "max_num_seqs": 4}, "config.max_num_batched_tokens"),
    ({"_max_steps": MAX_STEPS + 1}, "max_steps"),
])
def test_beyond_limits_is_an_error_trace(config, field):
    sc = _scenario(**config)
    assert "error" not in run_scenario(sc, SpecScheduler())  # vLLM would accept it
    trace = run_one(sc, device="cpu")
    assert trace["error"].startswith(field + ":"), trace["error"]
    assert trace["steps"] == [] and "summary" not in trace


def test_at_the_limit_runs():
    sc = _scenario(max_model_len=MAX_MODEL_LEN, block_size=2**20, max_num_batched_tokens=2048)
    assert compare_traces(run_scenario(sc, SpecScheduler()), run_one(sc, device="cpu")) is None


def test_rejected_scenarios_are_error_traces():
    bad_config = _scenario(max_num_batched_tokens=4, max_num_seqs=8)
    bad_request = Scenario(name="bad", config={"max_model_len": 8},
                           requests=(RequestSpec(id="a", prompt_len=8),), max_steps=5)
    good = _scenario()
    traces = run_batch([bad_config, good, bad_request], device="cpu")
    assert "max_num_batched_tokens" in traces[0]["error"]
    assert traces[2]["error"].startswith("requests[0].prompt_len")
    assert compare_traces(run_scenario(good, SpecScheduler()), traces[1]) is None


def test_device_choice():
    import torch
    from schedspec.gpu.device import resolve_device
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="tpu"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(ImplementationError, match="takes no device"):
        load_impl("spec", device="cpu")
