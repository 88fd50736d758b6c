"""Metrics, the Table 1 batching baselines and the token-budget plot."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from schedspec.reference.baselines import run_baseline
from schedspec.reference.engine import run_scenario
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.metrics import compute_metrics, format_metrics, percentile
from schedspec.reference.plot import plot_budget
from schedspec.reference.scenario import Abort, RequestSpec, Scenario, load_scenario

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "reference" / "examples"
TRACE_SCHEMA = json.loads((ROOT / "reference" / "schemas" / "trace.schema.json").read_text())


def scenario(requests, aborts=(), **config):
    reqs = tuple(RequestSpec(id=rid, prompt_len=prompt, arrival_step=arrival, max_tokens=out,
                             arrival_time=float(i))
                 for i, (rid, arrival, prompt, out) in enumerate(requests))
    return Scenario(name="t", config=config, requests=reqs,
                    aborts=tuple(Abort(rid, step) for rid, step in aborts), max_steps=100)


def step_of(trace, k):
    (st,) = [s for s in trace["steps"] if s["step"] == k]
    return st


def first_token(trace, rid):
    return trace["summary"]["requests"][rid]["first_token_step"]


# --- the seed's worked example ----------------------------------------------------

def test_static_waste_is_42_5_percent():
    sc = load_scenario(EXAMPLES / "static-waste.json")
    trace = run_baseline(sc, "static")
    m = compute_metrics(sc, trace, step_ms=20.0)
    assert m["overall"]["steps"] == 200
    assert m["overall"]["total_ms"] == 4000
    assert m["overall"]["slot_steps_held"] == 800 and m["overall"]["slot_steps_useful"] == 460
    assert m["overall"]["held_ms"] == 16000
    assert m["overall"]["useful_ms"] == 9200
    assert m["overall"]["wasted_ms"] == 6800
    assert m["overall"]["waste_fraction"] == pytest.approx(0.425)
    # The 10-token request is done at step 9 but holds its slot to step 199.
    assert m["requests"]["r0"]["finish_step"] == 9
    assert all(st["slots_held"] == 4 for st in trace["steps"])
    text = format_metrics(m)
    assert "6800 ms = 42.5 %" in text and "16000 ms" in text


@pytest.mark.parametrize("run", [lambda sc: run_baseline(sc, "iteration"),
                                 lambda sc: run_scenario(sc, SpecScheduler())],
                         ids=["baseline-iteration", "spec"])
def test_static_waste_vanishes_at_iteration_level(run):
    sc = load_scenario(EXAMPLES / "static-waste.json")
    m = compute_metrics(sc, run(sc))
    assert m["overall"]["steps"] == 200
    assert (m["overall"]["held_ms"], m["overall"]["useful_ms"], m["overall"]["wasted_ms"]) == (9200, 9200, 0)
    assert m["overall"]["waste_fraction"] == 0


def test_request_level_equals_static_when_all_arrive_together():
    sc = load_scenario(EXAMPLES / "static-waste.json")
    assert compute_metrics(sc, run_baseline(sc, "request"))["overall"]["wasted_ms"] == 6800


# --- hand-checked baseline behaviours -----------------------------------------------

def test_iteration_admits_the_step_after_a_slot_frees():
    # 2 slots; a (2 tokens) finishes at step 1, so c is admitted at step 2.
    sc = scenario([("a", 0, 4, 2), ("b", 0, 4, 5), ("c", 1, 4, 2)], max_num_seqs=2)
    t = run_baseline(sc, "iteration")
    assert step_of(t, 1)["finished"] == [["a", "length"]]
    assert step_of(t, 1)["waiting"] == ["c"]
    assert step_of(t, 2)["new"] == ["c"]
    assert first_token(t, "c") == 2
    assert [s["slots_held"] for s in t["steps"]] == [2, 2, 2, 2, 1]
    m = compute_metrics(sc, t)
    assert m["requests"]["c"]["ttft_steps"] == 2
    assert m["overall"]["wasted_ms"] == 0


def test_request_level_waits_for_the_batch_to_end():
    sc = scenario([("a", 0, 4, 2), ("b", 0, 4, 5), ("c", 1, 4, 2)], max_num_seqs=2)
    t = run_baseline(sc, "request")
    # b ends at step 4; the batch boundary frees both slots for step 5.
    assert step_of(t, 4)["finished"] == [["b", "length"]]
    assert step_of(t, 5)["new"] == ["c"]
    assert first_token(t, "c") == 5
    assert [s["slots_held"] for s in t["steps"]] == [2, 2, 2, 2, 2, 1, 1]
    m = compute_metrics(sc, t)
    assert m["requests"]["c"]["ttft_steps"] == 5
    assert m["overall"]["slot_steps_wasted"] == 3  # a's slot idle in steps 2, 3, 4


def test_request_level_launches_a_partial_batch_static_does_not():
    # 2 slots; a alone at step 0, b at step 2.
    sc = scenario([("a", 0, 4, 3), ("b", 2, 4, 2)], max_num_seqs=2)
    req = run_baseline(sc, "request")
    assert step_of(req, 0)["new"] == ["a"]  # a batch of one
    assert step_of(req, 2)["waiting"] == ["b"]  # the batch is not over yet
    assert first_token(req, "b") == 3
    static = run_baseline(sc, "static")
    assert step_of(static, 0)["scheduled"] == [] and step_of(static, 1)["waiting"] == ["a"]
    assert step_of(static, 2)["new"] == ["a", "b"]  # full: launch
    assert first_token(static, "a") == 2
    it = run_baseline(sc, "iteration")
    assert first_token(it, "a") == 0 and first_token(it, "b") == 2
    assert compute_metrics(sc, static)["requests"]["a"]["ttft_steps"] == 3


def test_static_launches_a_partial_batch_after_the_last_arrival():
    sc = scenario([("a", 0, 4, 2), ("b", 3, 4, 2)], max_num_seqs=4)
    t = run_baseline(sc, "static")
    assert all(step_of(t, k)["scheduled"] == [] for k in range(3))
    assert step_of(t, 3)["new"] == ["a", "b"]
    assert step_of(t, 3)["slots_held"] == 2


def test_static_batch_of_more_than_capacity_runs_in_two_batches():
    sc = scenario([(f"r{i}", 0, 4, 2 + i) for i in range(3)], max_num_seqs=2)
    t = run_baseline(sc, "static")
    assert step_of(t, 0)["new"] == ["r0", "r1"]
    assert step_of(t, 0)["waiting"] == ["r2"]
    assert step_of(t, 3)["new"] == ["r2"]  # r1 (3 tokens) ends the first batch at step 2
    assert t["summary"]["steps"] == 7


def test_iteration_kv_admission_breaks_at_the_first_misfit():
    # 4 usable blocks of 16: a needs 2, b 3, c 1.  b does not fit after a, and
    # c waits behind it although it would fit (FCFS, break).
    sc = scenario([("a", 0, 20, 12), ("b", 0, 30, 10), ("c", 0, 4, 4)],
                  max_num_seqs=4, max_model_len=64, block_size=16, num_gpu_blocks=5)
    t = run_baseline(sc, "iteration")
    assert step_of(t, 0)["new"] == ["a"]
    assert step_of(t, 0)["num_free_blocks"] == 2
    assert step_of(t, 0)["waiting"] == ["b", "c"]
    assert step_of(t, 11)["finished"] == [["a", "length"]]
    assert step_of(t, 11)["num_free_blocks"] == 4  # reaped: back in the pool
    assert step_of(t, 12)["new"] == ["b", "c"]
    assert step_of(t, 12)["num_free_blocks"] == 0
    assert "num_free_blocks" not in step_of(run_baseline(sc, "static"), 0)


def test_baseline_token_counts_and_computed_tokens():
    sc = scenario([("a", 0, 7, 3)], max_num_seqs=2)
    t = run_baseline(sc, "iteration")
    assert [s["scheduled"] for s in t["steps"]] == [[["a", 7]], [["a", 1]], [["a", 1]]]
    assert [s["num_computed_tokens"] for s in t["steps"]] == [{"a": 7}, {"a": 8}, {}]
    assert [s["sampled"] for s in t["steps"]] == [["a"], ["a"], ["a"]]
    m = compute_metrics(sc, t, step_ms=10.0, token_ms=1.0)
    assert m["overall"]["total_ms"] == (10 + 7) + (10 + 1) + (10 + 1)
    assert m["requests"]["a"]["ttft_ms"] == 17
    assert m["requests"]["a"]["itl_ms"] == 11


def test_eos_and_aborts():
    reqs = (RequestSpec("a", 4, 0, max_tokens=10, output_len=3),
            RequestSpec("b", 4, 0, max_tokens=10, arrival_time=1.0),
            RequestSpec("c", 4, 0, max_tokens=10, arrival_time=2.0))
    sc = Scenario("t", {"max_num_seqs": 2}, reqs, aborts=(Abort("b", 4), Abort("c", 2)),
                  max_steps=100)
    it = run_baseline(sc, "iteration")
    # This step's aborts come first, then the requests that finished in it.
    assert step_of(it, 2)["finished"] == [["c", "aborted"], ["a", "stopped"]]
    assert step_of(it, 1)["waiting"] == ["c"] and step_of(it, 2)["waiting"] == []
    assert step_of(it, 4)["finished"] == [["b", "aborted"]]
    assert it["summary"]["steps"] == 5
    st = run_baseline(sc, "static")
    # c is aborted before it ever runs; b holds its slot while a's is idle.
    m = compute_metrics(sc, st)
    assert m["overall"]["no_first_token"] == ["c"]
    assert m["requests"]["c"]["ttft_steps"] is None and m["requests"]["c"]["ttft_ms"] is None
    assert m["requests"]["c"]["finish_reason"] == "aborted"
    assert m["requests"]["b"]["output_tokens"] == 4
    assert m["overall"]["ttft_steps_mean"] == 1
    assert "no first token: c" in format_metrics(m)


@pytest.mark.parametrize("kind", ["static", "request", "iteration"])
@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.json")))
def test_baseline_traces_follow_the_schema(kind, example):
    sc = load_scenario(EXAMPLES / example)
    t = run_baseline(sc, kind)
    jsonschema.validate(t, TRACE_SCHEMA)
    assert t["implementation"] == f"baseline-{kind}"
    for st in t["steps"]:
        assert st["slots_held"] >= len(st["scheduled"])
        assert st["slots_held"] <= sc.scheduler_config().max_num_seqs
    if "error" not in t:
        m = compute_metrics(sc, t)
        s = t["summary"]["requests"]
        for rid, r in m["requests"].items():
            assert r["first_token_step"] == s[rid]["first_token_step"]
            assert r["output_tokens"] == s[rid]["num_output_tokens"]


def test_unknown_baseline_is_rejected():
    with pytest.raises(ValueError, match="unknown baseline"):
        run_baseline(load_scenario(EXAMPLES / "static-waste.json"), "dynamic")


# --- metrics on spec traces ------------------------------------------------------

def test_ttft_of_the_table3_prompt():
    sc = load_scenario(EXAMPLES / "table3-b16.json")
    t = run_scenario(sc, SpecScheduler())
    m = compute_metrics(sc, t, step_ms=20.0)
    p = m["requests"]["prompt"]
    # Admitted at step 1, 6 tokens a step, first token at step 4.
    assert p["first_token_step"] == 4
    assert p["ttft_steps"] == 4
    assert p["ttft_ms"] == 80
    # Steps 1-4 schedule 16 tokens each.
    assert compute_metrics(sc, t, step_ms=20.0, token_ms=1.0)["requests"]["prompt"]["ttft_ms"] == 4 * 36
    assert m["requests"]["d0"]["ttft_steps"] == 1 and m["requests"]["d0"]["itl_steps"] == 1
    # The prompt's blocks in steps 1-3 receive tokens but sample none.
    assert m["overall"]["slot_steps_useful"] == sum(len(s["scheduled"]) for s in t["steps"])
    assert m["overall"]["output_tokens"] == 10 * 12 + 4


def test_preemption_counted_and_extensions_rebuilt():
    sc = load_scenario(EXAMPLES / "preemption.json")
    t = run_scenario(sc, SpecScheduler())
    m = compute_metrics(sc, t, token_ms=0.25)
    assert m["overall"]["preemptions"] == 1 and m["requests"]["r1"]["preemptions"] == 1
    bare = copy.deepcopy(t)
    for st in bare["steps"]:
        del st["sampled"], st["slots_held"]
    m2 = compute_metrics(sc, bare, token_ms=0.25)
    assert m2["derived"] == ["sampled", "slots_held"]
    assert {k: v for k, v in m2.items() if k != "derived"} == {k: v for k, v in m.items() if k != "derived"}


def test_error_trace_is_refused():
    sc = load_scenario(EXAMPLES / "static-waste.json")
    with pytest.raises(ValueError, match="error trace"):
        compute_metrics(sc, {"format": "schedspec.trace/1", "scenario": "x",
                             "implementation": "spec", "error": "bad", "steps": []})


def test_percentiles_interpolate():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 0, 20], 99) == pytest.approx(19.8)
    assert percentile([], 50) is None


# --- the plot --------------------------------------------------------------------

def test_plot_budget_writes_a_png(tmp_path):
    sc = load_scenario(EXAMPLES / "table3-b16.json")
    out = plot_budget(run_scenario(sc, SpecScheduler()), tmp_path / "sub" / "b16.png",
                      token_budget=16, title="B = 16")
    data = Path(out).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 5000


def test_plot_budget_many_requests_and_baseline(tmp_path):
    sc = scenario([(f"q{i}", i // 3, 4 + i, 2 + i % 5) for i in range(40)], max_num_seqs=8)
    out = plot_budget(run_baseline(sc, "iteration"), tmp_path / "many.png", token_budget=64)
    assert out.stat().st_size > 5000
