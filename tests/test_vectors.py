"""State vectors (docs/formats.md, "State vectors"): the JSON codecs are exact, an
export is valid against the published schema and replays on the spec, a broken
spec is caught, bad files are one-line errors, and the command line's exit codes."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import assert_one_line_error, assert_vector_file_error, cli
from mutants import Mutation, mutated
from schedspec.reference.campaign import random_scenarios
from schedspec.reference.engine import run_scenario
from schedspec.reference.example_files import EXAMPLES_DIR
from schedspec.reference.generator import FLAG_COMBINATIONS, FLAGS_ALL, generate_scenario, scenario_rng
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import load_scenario
from schedspec.reference.state_json import (StateJsonError, config_from_json, config_to_json, output_from_json,
                                            output_to_json, request_from_json, request_to_json, state_from_json,
                                            state_to_json)
from schedspec.reference.vectors import (SCHEMA_PATH, VectorError, add_request_call, apply_call, check_vector,
                                         export_campaign, finish_requests_call, make_vector, read_vector,
                                         schedule_call, vector_files, write_vector)
from schedspec.spec.block_pool import BlockPool
from schedspec.spec.config import ConfigError, SchedulerConfig
from schedspec.spec.input_processor import make_request
from schedspec.spec.request import RequestStatus
from schedspec.spec.state import SchedulerState

SCHEMA = json.loads(SCHEMA_PATH.read_text())


def via_text(obj):
    """Through JSON text and back, as a file carries it."""
    return json.loads(json.dumps(obj))


# --- the codecs are exact --------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def run_states(index: int, flags: tuple[bool, bool]) -> tuple:
    """Every state and output of random scenario `index` (seed 0) under one flag
    combination, its run cut to 40 steps to keep a draw cheap."""
    s = generate_scenario(scenario_rng(0, index), index, (flags,))
    s = dataclasses.replace(s, max_steps=min(s.max_steps, 40))
    seen = []
    run_scenario(s, SpecScheduler(), on_step=lambda t: seen.extend([(t.before, t.output), (t.after, t.output)]))
    return tuple(seen)


@st.composite
def spec_states(draw):
    flags = draw(st.sampled_from(FLAG_COMBINATIONS))
    seen = ()
    while not seen:
        seen = run_states(draw(st.integers(0, 300)), flags)
    return seen[draw(st.integers(0, len(seen) - 1))]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_states())
def test_state_round_trip_is_exact(pair):
    state, output = pair
    back = state_from_json(via_text(state_to_json(state)))
    assert back == state
    assert type(back.kv_cache) is type(state.kv_cache)
    assert output_from_json(via_text(output_to_json(output))) == output
    for r in state.requests.values():
        assert request_from_json(via_text(request_to_json(r))) == r


def test_round_trip_covers_both_pools_and_cached_blocks():
    """The states the property draws from hold what the codecs must carry: block
    pools with hashes and freed cached blocks, counts, async counters."""
    kinds, cached, placeholders = set(), False, False
    for flags in FLAG_COMBINATIONS:
        for i in range(6):
            for state, _ in run_states(i, flags):
                assert state_from_json(via_text(state_to_json(state))) == state
                kinds.add(type(state.kv_cache).__name__)
                cached |= isinstance(state.kv_cache, BlockPool) and bool(state.kv_cache.cached)
                placeholders |= any(r.num_output_placeholders for r in state.requests.values())
    assert kinds == {"BlockPool", "BlockCounts"} and cached and placeholders


@pytest.mark.parametrize("pause", ["UNPAUSED", "PAUSED_NEW", "PAUSED_ALL"])
def test_monitor_only_fields_round_trip_and_meet_the_schema(pause):
    """Fields only the monitor's lift sets (no scenario does): drop mode, no prefix
    reads, the pause state.  Written only when set, read back exactly, valid
    against the schema; a bad pause state is a one-line error naming it."""
    from schedspec.reference.strict_json import fast_valid
    from schedspec.reference.vectors import schema_validator

    state = prefix_state()
    a = dataclasses.replace(state.requests["a"], drop_stale_output=True, skip_reading_prefix_cache=True)
    state = dataclasses.replace(state, requests={"a": a}, pause_state=pause)
    text = via_text(state_to_json(state))
    assert text["requests"]["a"]["drop_stale_output"] is text["requests"]["a"]["skip_reading_prefix_cache"] is True
    assert ("pause_state" in text) == (pause != "UNPAUSED")
    assert state_from_json(text) == state
    v = make_vector(state, schedule_call(), source={"test": "monitor-only fields"})
    jsonschema.validate(v, SCHEMA)
    assert fast_valid(schema_validator().schema, via_text(v))  # the reader's own check says yes too
    plain = via_text(state_to_json(prefix_state()))
    assert "pause_state" not in plain and "drop_stale_output" not in plain["requests"]["a"]
    text["pause_state"] = "PAUSED"
    with pytest.raises(StateJsonError, match=r"^state\.pause_state: = 'PAUSED', must be one of 'UNPAUSED'"):
        state_from_json(text)


def test_unvalidated_config_loads_and_validated_one_is_refused():
    """A lifted config may break vLLM's start-up checks (a pool smaller than one
    sequence); each field is still type-checked."""
    c = SchedulerConfig(max_model_len=4096, num_gpu_blocks=4, block_size=16, max_num_batched_tokens=8,
                        max_num_seqs=16)
    assert config_from_json(via_text(config_to_json(c))) == c
    with pytest.raises(ConfigError, match=r"^config\.max_num_batched_tokens: "):
        config_from_json(config_to_json(c), validate=True)
    bad = {**config_to_json(c), "block_size": 0}
    with pytest.raises(StateJsonError, match=r"^config\.block_size: must be an integer >= 1, got 0$"):
        config_from_json(bad)
    bad = {**config_to_json(c), "watermark": "high"}
    with pytest.raises(StateJsonError, match=r"^config\.watermark: must be a number"):
        config_from_json(bad)


@pytest.mark.parametrize("change, path", [
    (lambda s: s["requests"]["a"].update(num_computed_tokens=-1),
     "state.requests.a.num_computed_tokens: must be an integer >= 0, got -1"),
    (lambda s: s["requests"]["a"].update(num_prompt_tokens=4.0),
     "state.requests.a.num_prompt_tokens: must be an integer >= 0, got 4.0"),
    (lambda s: s["requests"]["a"].update(status="DONE"), "state.requests.a.status: = 'DONE', must be a request status"),
    (lambda s: s["requests"]["a"].update(request_id="b"), "state.requests.a.request_id: = 'b', must equal"),
    (lambda s: s["running"].append("ghost"), "state.running[1]: = 'ghost' is not a key of state.requests"),
    (lambda s: s["waiting"].append("a"), "state.waiting[0]: = 'a' is already in state.running"),
    (lambda s: s["kv_cache"].update(kind="counts"), "state.kv_cache.kind: = 'counts', must be "),
    (lambda s: s["kv_cache"]["ref_cnt"].update({"01": 1}), "state.kv_cache.ref_cnt['01']: the key '01' must be a block id"),
    (lambda s: s["kv_cache"]["req_to_blocks"].update(a=[99]), "state.kv_cache.req_to_blocks.a[0]: = 99 is not a block"),
    (lambda s: s["requests"]["a"]["block_hashes"].append("ABC"), "state.requests.a.block_hashes[1]: must be a block hash"),
    (lambda s: s.pop("finished_req_ids"), "state.finished_req_ids: missing"),
])
def test_bad_state_json_names_the_field(change, path):
    state = prefix_state()
    obj = via_text(state_to_json(state))
    change(obj)
    with pytest.raises(StateJsonError) as e:
        state_from_json(obj)
    assert str(e.value).startswith(path), str(e.value)
    assert "\n" not in str(e.value)


def prefix_state(scheduled: bool = True) -> SchedulerState:
    """One request with prefix caching, waiting, or running after one schedule():
    a block pool with a hashed block."""
    c = SchedulerConfig(max_model_len=64, block_size=4, num_gpu_blocks=20, max_num_batched_tokens=64,
                        enable_prefix_caching=True)
    r = make_request(c, "a", 6, 5, prompt_token_ids=list(range(10, 16)))
    _, state = apply_call(SchedulerState(c), add_request_call(r))
    if not scheduled:
        return state
    _, state = apply_call(state, schedule_call())
    assert state.block_pool.cached and state.running == ("a",)
    return state


# --- making, writing, checking one vector --------------------------------------------------------


def test_make_vector_and_apply_call():
    state = prefix_state()
    v = make_vector(state, finish_requests_call(["a", "zz", "a"], RequestStatus.FINISHED_ABORTED),
                    source={"test": "make"})
    assert v["expected"] == {"finished": ["a"]}
    assert v["post_state"]["requests"] == {} and v["post_state"]["finished_req_ids"] == ["a"]
    jsonschema.validate(v, SCHEMA)
    assert check_vector(via_text(v), SpecScheduler()) == []
    result, post = apply_call(state, {"name": "schedule"})
    assert set(result) == {"output"} and post.finished_req_ids == ()
    with pytest.raises(VectorError, match="duplicate request id"):
        apply_call(state, add_request_call(state.requests["a"]))
    with pytest.raises(VectorError, match=r"^call\.status: = 'RUNNING', must be a finished status: FINISHED_STOPPED"):
        apply_call(state, {"name": "finish_requests", "request_ids": ["a"], "status": "RUNNING"})


def test_write_vector_never_overwrites(tmp_path):
    v = make_vector(prefix_state(), schedule_call(), source={})
    first = write_vector(tmp_path, "case", v)
    second = write_vector(tmp_path, "case", v)
    assert (first.name, second.name) == ("case.json", "case-2.json")
    assert read_vector(second) == read_vector(first) == via_text(v)


class WrongSchedule(SpecScheduler):
    """Reports its admissions as running requests (its state stays the spec's)."""

    name = "wrong"

    def schedule(self):
        out = super().schedule()
        return dataclasses.replace(out, scheduled_new_reqs=(),
                                   scheduled_running_reqs=out.scheduled_running_reqs + out.scheduled_new_reqs)


class Crashes(SpecScheduler):
    name = "crashes"

    def schedule(self):
        raise RuntimeError("boom")


class NoLoadState:
    """The implementation protocol without the optional load_state()."""

    name = "noload"

    def __init__(self):
        self.impl = SpecScheduler()

    def reset(self, config): self.impl.reset(config)  # noqa: E704 - the loader wants real methods
    def add_request(self, r): self.impl.add_request(r)  # noqa: E704
    def finish_requests(self, ids, st): return self.impl.finish_requests(ids, st)  # noqa: E704
    def schedule(self): return self.impl.schedule()  # noqa: E704
    def update_from_output(self, o, s): return self.impl.update_from_output(o, s)  # noqa: E704
    def observe(self): return self.impl.observe()  # noqa: E704


def test_check_vector_reports_differences_and_crashes():
    v = via_text(make_vector(prefix_state(scheduled=False), schedule_call(), source={}))
    found = check_vector(v, WrongSchedule())
    assert found == ['expected.output.scheduled_new_reqs: expected ["a"], got []',
                     'expected.output.scheduled_running_reqs: expected [], got ["a"]']
    assert check_vector(v, Crashes()) == ["crashes failed in schedule(): RuntimeError: boom"]
    with pytest.raises(VectorError, match=r"^implementation noload cannot be set to a given state: it has no load_state\(\)$"):
        check_vector(v, NoLoadState())


# --- an export --------------------------------------------------------------------------------


def small_scenarios():
    """Six random scenarios drawing both engine flags, cut to 20 steps, and two
    shipped examples: prefix-cache eviction and async preemption."""
    cut = [dataclasses.replace(s, max_steps=min(s.max_steps, 20)) for s, _ in random_scenarios(6, 0, FLAGS_ALL)]
    return cut + [load_scenario(EXAMPLES_DIR / f"{n}.json") for n in ("prefix-eviction", "async-preemption")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("vectors")
    count = export_campaign(d, small_scenarios())
    files = vector_files([d])
    assert count == len(files) > 0
    return d, files


def test_export_covers_every_call_and_both_pools(exported):
    _, files = exported
    vectors = [json.loads(f.read_text()) for f in files]
    assert {v["call"]["name"] for v in vectors} == {"add_request", "finish_requests", "schedule", "update_from_output"}
    assert {v["pre_state"]["kv_cache"]["kind"] for v in vectors} == {"counts", "blocks"}
    assert any(v["pre_state"]["config"]["async_scheduling"] for v in vectors)
    assert {f.parent.name for f in files} >= {"prefix-eviction", "async-preemption", "random-s0-0"}


def test_exported_vectors_meet_the_schema(exported):
    """jsonschema on the published schema as written (no reader shortcut), on a spread of files."""
    _, files = exported
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for f in files[::7]:
        validator.validate(json.loads(f.read_text()))


def test_exported_vectors_chain_and_replay_on_the_spec(exported):
    d, files = exported
    by_folder: dict[Path, list[Path]] = {}
    for f in files:
        by_folder.setdefault(f.parent, []).append(f)
    spec = SpecScheduler()
    for folder, fs in by_folder.items():
        previous = None
        for f in fs:  # names sort in call order
            v = read_vector(f)
            if previous is not None:
                assert v["pre_state"] == previous["post_state"], f
            assert v["source"]["call"] == int(f.name[:5])
            assert check_vector(v, spec) == [], f
            previous = v


def test_cli_check_agrees_on_the_export(exported, capsys):
    d, files = exported
    rc, out, err = cli(capsys, "vectors", "check", "--impl", "spec", d)
    assert rc == 0, err
    assert f"vectors: {len(files)} checked on spec, {len(files)} agreed, 0 differed" in out


def test_a_broken_spec_is_caught(exported, capsys):
    """A mutant that forgets to flush the finished ids in schedule(): every
    schedule() after a finish differs."""
    d, _ = exported
    with mutated([Mutation("scheduler.schedule", "s.finished_req_ids = ()", "pass")]):
        rc, out, err = cli(capsys, "vectors", "check", d)
    assert rc == 1, err
    assert "DIFFERS" in out and "post_state.finished_req_ids: expected [], got [" in out
    assert " 0 differed" not in out


def test_export_of_another_implementation_records_observed(tmp_path):
    scenario = small_scenarios()[-1]  # async-preemption
    export_campaign(tmp_path, [scenario], "wrong", impl=WrongSchedule())
    vectors = [read_vector(f) for f in vector_files([tmp_path])]
    diverged = [v for v in vectors if "observed" in v]
    assert diverged and all(v["call"]["name"] == "schedule" for v in diverged)
    v = diverged[0]
    assert v["observed"]["result"] != v["expected"] and v["source"]["implementation"] == "wrong"
    jsonschema.validate(v, SCHEMA)


# --- the reader's fast schema check ------------------------------------------------------------

STRICT_INTEGERS = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool)))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 40) | st.floats(-2, 2, allow_nan=False)
    | st.sampled_from(["", "r0", "RUNNING", "FINISHED_ABORTED", "blocks", "counts", "ab", "0", "01", "schedule"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(["r0", "1", "kind", "x"]),
                                                                      children, max_size=3),
    max_leaves=6)


@st.composite
def corrupted(draw, vectors):
    """A vector with one value somewhere replaced, or one key removed."""
    v = json.loads(json.dumps(draw(st.sampled_from(vectors))))
    node = v
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = draw(st.sampled_from(keys))
        child = node[key]
        if isinstance(child, (dict, list)) and child and draw(st.booleans()):
            node = child
            continue
        if isinstance(node, dict) and draw(st.booleans()):
            del node[key]
        else:
            node[key] = draw(json_values)
        return v


@pytest.fixture(scope="module")
def sample_vectors(exported):
    _, files = exported
    return [json.loads(f.read_text()) for f in files[::25]]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_fast_schema_check_accepts_nothing_the_schema_refuses(sample_vectors, data):
    """read_vector trusts a yes of its fast check (vectors.fast_valid on the
    inlined schema) and asks jsonschema on a no; a yes must be jsonschema's too."""
    from schedspec.reference.vectors import fast_valid, schema_validator

    v = data.draw(corrupted(sample_vectors))
    if fast_valid(schema_validator().schema, v):
        assert STRICT_INTEGERS(SCHEMA).is_valid(v)


# --- bad files ----------------------------------------------------------------------------------


def one_vector(exported, call_name: str) -> dict:
    _, files = exported
    return json.loads(next(f for f in files if f.name.endswith(f"-{call_name}.json")).read_text())


@pytest.mark.parametrize("call_name, change, message", [
    ("schedule", lambda v: next(iter(v["pre_state"]["requests"].values())).update(num_computed_tokens=-1),
     r"pre_state\.requests\.r\d+\.num_computed_tokens: must be an integer >= 0, got -1$"),
    ("schedule", lambda v: v["post_state"].update(running=v["post_state"]["running"] + ["ghost"]),
     r"post_state\.running\[\d+\]: = 'ghost' is not a key of post_state\.requests$"),
    ("schedule", lambda v: v["call"].update(name="run"), r"call\.name: = 'run', must be one of "),
    ("schedule", lambda v: v.update(format="schedspec.trace/1"), r"format: = 'schedspec.trace/1', must be "),
    ("schedule", lambda v: v.pop("expected"), r"expected: missing; this field is required$"),
    ("schedule", lambda v: v["expected"].update(finished=[]), r"expected\.finished: unknown field"),
    ("schedule", lambda v: v["pre_state"]["config"].update(max_num_seqs=2.0),
     r"pre_state\.config\.max_num_seqs: must be an integer, got 2\.0$"),
    ("update_from_output", lambda v: v["call"]["sampled_token_ids"].update(r0=[-5]),
     r"call\.sampled_token_ids\.r0\[0\]: must be an integer >= 0, got -5$"),
    ("finish_requests", lambda v: v["call"].update(status="RUNNING"), r"call\.status: = 'RUNNING', must be one of"),
    ("add_request", lambda v: v["call"]["request"].update(status=7), r"call\.request\.status: = 7, must be one of"),
])
def test_bad_vector_is_a_one_line_error_naming_the_field(exported, tmp_path, call_name, change, message):
    v = one_vector(exported, call_name)
    change(v)
    assert_vector_file_error(v, tmp_path, message)


@pytest.mark.parametrize("text, message", [
    ('{"format": 1, "format": 2}', "format: the key appears more than once"),
    ('{"a": NaN}', "a: = NaN is not a JSON number"),
    ("{", "not valid JSON"),
    ("[]", "the top level: must be an object"),
])
def test_unreadable_json_is_a_one_line_error(tmp_path, text, message):
    p = tmp_path / "v.json"
    p.write_text(text)
    with pytest.raises(VectorError, match=message):
        read_vector(p)


def test_a_block_pool_key_error_names_the_key(exported, tmp_path):
    _, files = exported
    v = next(v for v in map(lambda f: json.loads(f.read_text()), files) if v["pre_state"]["kv_cache"]["kind"] == "blocks")
    v["pre_state"]["kv_cache"]["ref_cnt"]["007"] = 1
    p = tmp_path / "v.json"
    p.write_text(json.dumps(v))
    with pytest.raises(VectorError, match=r"pre_state\.kv_cache\.ref_cnt: the key '007' does not match"):
        read_vector(p)


# --- the command line -------------------------------------------------------------------------


def test_cli_export_refuses_a_non_empty_folder_unless_forced(tmp_path, capsys):
    out = tmp_path / "v"
    rc, stdout, err = cli(capsys, "vectors", "export", "prefix-eviction", "--out", out)
    assert rc == 0, err
    first = sorted(p.relative_to(out) for p in out.rglob("*.json"))
    assert stdout.startswith(f"{len(first)} vectors from 1 scenarios written to ")
    rc, _, err = cli(capsys, "vectors", "export", "prefix-eviction", "--out", out)
    assert_one_line_error(rc, err, "is not empty", "--force")
    (out / "mine.txt").write_text("keep me")
    rc, _, err = cli(capsys, "vectors", "export", "prefix-eviction", "--out", out, "--force")
    assert rc == 0, err
    assert (out / "mine.txt").read_text() == "keep me"
    again = sorted(p.relative_to(out) for p in out.rglob("*.json"))
    assert set(first) < set(again) and len(again) == 2 * len(first)  # a second folder, nothing replaced
    assert (out / "prefix-eviction-2").is_dir()


def test_cli_random_export_and_check(tmp_path, capsys):
    out = tmp_path / "v"
    rc, stdout, err = cli(capsys, "vectors", "export", "--scenarios", 1, "--seed", 1, "--flags", "sync",
                          "--out", out)
    assert rc == 0, err
    rc, stdout, err = cli(capsys, "vectors", "check", out)
    assert rc == 0 and " 0 differed" in stdout, err


@pytest.mark.parametrize("argv, words", [
    (["vectors", "export", "--out", "x"], ["nothing to export"]),
    (["vectors", "export", "table3-b8", "--scenarios", "2", "--out", "x"], ["not both"]),
    (["vectors", "check", "/nonexistent/vectors"], ["no such file or folder"]),
    (["vectors", "check", "--impl", "test_vectors:NoLoadState", "PLACEHOLDER"],
     ["cannot be set to a given state: it has no load_state()"]),
    (["vectors", "check", "--impl", "test_vectors:Nope", "PLACEHOLDER"], ["has no class Nope"]),
])
def test_cli_user_errors_are_one_line_exit_2(exported, capsys, argv, words):
    d, _ = exported
    argv = [str(d) if a == "PLACEHOLDER" else a for a in argv]
    rc, _, err = cli(capsys, *argv)
    assert_one_line_error(rc, err, *words)


def test_cli_check_of_a_bad_file_names_file_and_field(exported, tmp_path, capsys):
    v = one_vector(exported, "schedule")
    v["pre_state"]["config"]["policy"] = "lifo"
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(v))
    rc, _, err = cli(capsys, "vectors", "check", p)
    assert_one_line_error(rc, err, str(p), "pre_state.config.policy")


def test_cli_check_of_a_differing_implementation_exits_1(exported, capsys):
    d, files = exported
    rc, out, err = cli(capsys, "vectors", "check", "--impl", "test_vectors:WrongSchedule", d)
    assert rc == 1, err
    assert "DIFFERS" in out and "expected.output.scheduled_new_reqs" in out
