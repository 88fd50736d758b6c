"""KV connector sends (spec/kv_connector.py hold_sending, free_sent) against vLLM
0.33.0's scheduler: a request whose KV the connector sends once it finishes (a KV
producer's, `kv_connector_send_steps` in a scenario) keeps its blocks, finished,
until the worker reports the send (S:3180-3200, 3517-3536, 3730-3733).

- The rules on hand-built states: held at every kind of finish, freed by the report,
  a batch returning for it dropped, a report for a request not held refused.
- Side by side with vLLM on random scenarios that draw the feature (all four flag
  combinations): after every call lift(vLLM) equals the spec's state; spec mutants
  of each rule are caught.
- The engine's reports, the file contract and the refusals.
"""

from __future__ import annotations

import pytest

from schedspec.reference.campaign import random_scenario
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL, features_for
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import ScenarioError, scenario_from_json
from schedspec.reference.state_json import state_from_json, state_to_json
from schedspec.spec import scheduler as S
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.input_processor import make_request
from schedspec.spec.request import RequestStatus
from schedspec.spec.state import SchedulerOutput, SchedulerState

from monitor_helpers import Both
from mutants import Mutation, mutated

SEED = 31
NUM_SCENARIOS = 160


def state(**kw) -> SchedulerState:
    c = SchedulerConfig(**{**dict(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=64, block_size=4,
                                  num_gpu_blocks=40), **kw})
    s = SchedulerState(c)
    for rid, sends in (("a", True), ("b", False)):
        s = S.add_request(s, make_request(c, rid, 10, 2, arrival_time=float(len(s.requests)), kv_connector_sends=sends))
    return s


def test_a_request_whose_kv_is_sent_keeps_its_blocks_until_the_send_is_reported():
    s = state()
    out, s = S.schedule(s)
    held = s.num_blocks("a")
    finished, s = S.update_from_output(s, out, {"a": [7], "b": [7]})
    assert not finished
    out, s = S.schedule(s)
    finished, s = S.update_from_output(s, out, {"a": [7], "b": [7]})
    assert dict(finished) == {"a": RequestStatus.FINISHED_LENGTH_CAPPED, "b": RequestStatus.FINISHED_LENGTH_CAPPED}
    # "b" is gone; "a" stays, finished, with its blocks, out of every queue.
    assert "b" not in s.requests and s.requests["a"].status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert s.num_blocks("a") == held and "a" not in s.running + s.waiting
    # The engine keeps stepping for it once the finished ids are handed on (S:3297-3305).
    out, s = S.schedule(s)
    assert not out.num_scheduled_tokens and not s.finished_req_ids and s.has_requests()
    free = s.num_free_blocks
    _, s = S.update_from_output(s, out, {}, finished_sending=["a"])
    assert "a" not in s.requests and s.num_free_blocks == free + held
    _, s = S.schedule(s)
    assert not s.has_requests()


def test_an_aborted_request_is_held_and_a_batch_returning_for_it_is_dropped():
    s = state(async_scheduling=True)
    out, s = S.schedule(s)
    done, s = S.finish_requests(s, ["a"], RequestStatus.FINISHED_ABORTED)
    assert done == ("a",) and s.requests["a"].status == RequestStatus.FINISHED_ABORTED
    assert s.requests["a"].num_in_flight_tokens == 10
    finished, s = S.update_from_output(s, out, {"a": [7], "b": [7]})
    assert [rid for rid, _ in finished] == []  # "a" is not finished a second time
    assert s.requests["a"].num_in_flight_tokens == 0 and s.requests["a"].num_output_tokens == 0


def test_a_report_for_a_request_not_held_is_refused():
    s = state()
    with pytest.raises(ValueError, match="finished_sending: request 'b' is not finished with its KV being sent"):
        S.update_from_output(s, SchedulerOutput(), {}, finished_sending=["b"])


def test_the_front_end_refuses_an_older_release():
    c = SchedulerConfig(vllm_version="0.30.0")
    with pytest.raises(Exception, match="kv_connector_send_steps"):
        make_request(c, "a", 10, 2, kv_connector_sends=True)


def send_scenarios(n: int = NUM_SCENARIOS):
    drawn = (random_scenario(SEED, i, FLAGS_ALL, features_for("vllm", "spec")) for i in range(n))
    return [s for s in drawn if any(r.kv_connector_send_steps for r in s.requests)]


def test_the_generator_draws_the_feature_with_every_flag():
    found = send_scenarios()
    assert len(found) >= 8
    flags = {(bool(s.config.enable_prefix_caching), bool(s.config.async_scheduling)) for s in found}
    assert len(flags) == 4, flags


def test_lift_equals_the_spec_after_every_call(vllm):
    both = Both(vllm)
    for scenario in send_scenarios():
        trace = run_scenario(scenario, both)
        assert "error" not in trace, (scenario.name, trace.get("error"))
    assert both.calls > 1000, both.calls


@pytest.mark.parametrize("mutant", [
    Mutation("kv_connector.hold_sending", "w.requests[rid].kv_connector_sends", "False"),
    Mutation("kv_connector.dropped_output", "not w.requests[rid].status.is_finished", "True"),
    Mutation("scheduler.update_from_output",
             "kv_connector.free_sent(kv_connector.free_held(done, finished_recving), finished_sending)",
             "kv_connector.free_held(done, finished_recving)"),
], ids=["freed-at-finish", "output-applied-after-the-finish", "send-report-ignored"])
def test_vllm_catches_a_broken_rule(vllm, mutant):
    from schedspec.reference.campaign import run_guarded
    from schedspec.reference.compare import compare_runs

    with mutated([mutant]):
        caught = any(compare_runs(run_guarded(s, vllm), run_guarded(s, SpecScheduler())) is not None
                     for s in send_scenarios())
    assert caught


# -- the engine, the file contract, the refusals -------------------------------------------------


def scenario(**request) -> dict:
    return {"format": "schedspec.scenario/1", "name": "sends",
            "config": {"max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 40, "block_size": 4,
                       "num_gpu_blocks": 12},
            "requests": [{"id": "a", "prompt_len": 10, "max_tokens": 2, **request},
                         {"id": "b", "prompt_len": 33, "max_tokens": 2, "arrival_step": 1}]}


def test_the_engine_reports_the_send_that_many_steps_after_the_finish():
    # "a" finishes at step 1 holding 3 of the 11 blocks; "b"'s whole sequence needs 9
    # (the full-ISL gate), so it is admitted only after the send, reported to the
    # update of step 1 + 3: at step 5, not at step 2 as without the send.
    trace = run_scenario(scenario_from_json(scenario(kv_connector_send_steps=3)), SpecScheduler())
    assert trace["summary"]["requests"]["a"]["finish_step"] == 1
    assert trace["summary"]["requests"]["b"]["first_token_step"] == 5
    plain = run_scenario(scenario_from_json(scenario()), SpecScheduler())
    assert plain["summary"]["requests"]["b"]["first_token_step"] == 2


@pytest.mark.parametrize("steps", [1, 3])
def test_vllm_agrees_on_the_hand_written_case(vllm, steps):
    sc = scenario_from_json(scenario(kv_connector_send_steps=steps))
    assert compare_traces(run_scenario(sc, vllm), run_scenario(sc, SpecScheduler())) is None


def test_the_scenario_field_round_trips_and_is_bounded():
    sc = scenario_from_json(scenario(kv_connector_send_steps=2))
    assert sc.requests[0].kv_connector_send_steps == 2
    assert sc.to_json()["requests"][0]["kv_connector_send_steps"] == 2
    assert "kv_connector_send_steps" not in scenario_from_json(scenario()).to_json()["requests"][0]
    with pytest.raises(ScenarioError, match=r"requests\[0\]\.kv_connector_send_steps: = 0, must be >= 1"):
        scenario_from_json(scenario(kv_connector_send_steps=0))


def test_state_vectors_carry_the_field():
    s = state()
    assert state_to_json(s)["requests"]["a"]["kv_connector_sends"] is True
    assert "kv_connector_sends" not in state_to_json(s)["requests"]["b"]
    assert state_from_json(state_to_json(s)) == s


def test_an_implementation_without_finished_sending_is_refused():
    class NoSends(SpecScheduler):
        name = "nosends"

        def update_from_output(self, output, sampled_token_ids, finished_recving=()):
            return super().update_from_output(output, sampled_token_ids, finished_recving)

    trace = run_scenario(scenario_from_json(scenario(kv_connector_send_steps=1)), NoSends())
    assert "requests[0].kv_connector_send_steps: nosends does not model KV connector sends" in trace["error"]


def test_torch_refuses_the_feature():
    pytest.importorskip("torch")
    from schedspec.reference.loader import load_impl
    from schedspec.gpu.batch import prepare

    sc = scenario_from_json(scenario(kv_connector_send_steps=1))
    assert "requests[0].kv_connector_send_steps: = 1: the torch implementation does not model KV connector sends" \
        in prepare(sc)
    assert "does not model KV connector sends" in run_scenario(sc, load_impl("torch", device="cpu"))["error"]


def test_a_state_vector_carries_the_report_and_replays():
    """A vector of the update that reports a send validates against the schema and
    replays: the pre-state holds the finished request, the post-state has let it go."""
    from schedspec.reference.vectors import (check_vector, make_vector, update_from_output_call,
                                             validate_vector)

    s = state()
    for _ in range(2):
        out, s = S.schedule(s)
        _, s = S.update_from_output(s, out, {"a": [7], "b": [7]})
    out, s = S.schedule(s)
    vector = make_vector(s, update_from_output_call(out, {}, finished_sending=["a"]), source={"test": "sends"})
    validate_vector(vector)
    assert vector["call"]["finished_sending"] == ["a"] and "a" not in vector["post_state"]["requests"]
    assert vector["pre_state"]["requests"]["a"]["status"] == "FINISHED_LENGTH_CAPPED"
    assert check_vector(vector, SpecScheduler()) == []
