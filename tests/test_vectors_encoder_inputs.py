"""State vectors with encoder inputs (docs/formats.md, "Addition: encoder inputs"): a
request's `mm_features`, the state's `encoder_cache` and an output's
`scheduled_encoder_inputs` and `free_encoder_mm_hashes` round-trip exactly, are
written only when not empty, meet the published schema, a bad one is a one-line
error naming the field, and an export of a scenario with encoder inputs replays on
the spec."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import jsonschema
import pytest

from helpers import assert_vector_file_error, cli
from mutants import Mutation, mutated
from schedspec.reference.campaign import random_scenario
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import scenario_from_json
from schedspec.reference.state_json import (StateJsonError, output_from_json, output_to_json, request_from_json,
                                            request_to_json, state_from_json, state_to_json)
from schedspec.reference.vectors import (SCHEMA_PATH, check_vector, export_campaign, read_vector,
                                         vector_files)
from schedspec.spec import scheduler as S
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.encoder_cache import EMPTY_ENCODER_CACHE, MultiModalFeature
from schedspec.spec.input_processor import make_request
from schedspec.spec.output import SchedulerOutput
from schedspec.spec.state import SchedulerState

SCHEMA = json.loads(SCHEMA_PATH.read_text())


def via_text(obj):
    """Through JSON text and back, as a file carries it."""
    return json.loads(json.dumps(obj))


# --- states the spec reaches with encoder inputs -----------------------------------------------


def run_items(prefix_caching: bool, async_scheduling: bool) -> list[tuple[SchedulerState, SchedulerOutput]]:
    """Every state and output of a hand-built run: "a" encodes x and "b" y in one step,
    where "b" finds x; "c" arrives once x and y are freeable, and its item z (12) needs
    x's room (cache 20): an eviction.  Each step returns every token it scheduled."""
    c = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=128, block_size=4, num_gpu_blocks=80,
                        max_num_encoder_input_tokens=16, encoder_cache_size=20,
                        enable_prefix_caching=prefix_caching, async_scheduling=async_scheduling)
    s = SchedulerState(c)
    seen: list[tuple[SchedulerState, SchedulerOutput]] = []
    arrivals = {0: [("a", 20, [(2, 8, "x")]), ("b", 24, [(0, 8, "x"), (10, 8, "y")])], 3: [("c", 20, [(4, 12, "z")])]}
    for step in range(8):
        for rid, n, items in arrivals.get(step, ()):
            s = S.add_request(s, make_request(c, rid, n, 3, arrival_time=float(len(seen)), mm_features=items,
                                              prompt_token_ids=list(range(100, 100 + n)) if prefix_caching else None))
        out, s = S.schedule(s)
        seen.append((s, out))
        _, s = S.update_from_output(s, out, {rid: [7] for rid, _ in out.num_scheduled_tokens})
        seen.append((s, out))
    return seen


FLAGS = [(False, False), (True, False), (False, True), (True, True)]


@pytest.mark.parametrize("prefix_caching, async_scheduling", FLAGS)
def test_states_with_encoder_inputs_round_trip_exactly(prefix_caching, async_scheduling):
    seen = run_items(prefix_caching, async_scheduling)
    # The run reaches what the fields carry: shared entries, freeable ones, an eviction.
    assert any(len(s.encoder_cache.cached.get("x", ())) == 2 for s, _ in seen)
    assert any(s.encoder_cache.freeable for s, _ in seen)
    assert any(o.free_encoder_mm_hashes == ("x",) for _, o in seen)
    assert any(o.scheduled_encoder_inputs for _, o in seen)
    for state, output in seen:
        back = state_from_json(via_text(state_to_json(state)))
        assert back == state
        assert back.encoder_cache == state.encoder_cache
        assert output_from_json(via_text(output_to_json(output))) == output
        for r in state.requests.values():
            assert request_from_json(via_text(request_to_json(r))) == r


def test_the_read_back_has_the_spec_types():
    """frozensets of request ids, int input ids, the freeable order as a tuple, features as
    MultiModalFeature: a value equal to the spec's, not one that merely prints alike."""
    state = next(s for s, _ in run_items(False, False) if s.encoder_cache.freeable and s.encoder_cache.refs)
    back = state_from_json(via_text(state_to_json(state)))
    e = back.encoder_cache
    assert all(type(ids) is frozenset for ids in e.cached.values())
    assert all(type(i) is int for held in e.refs.values() for i in held)
    assert type(e.freeable) is tuple and e.freeable == state.encoder_cache.freeable
    assert all(type(f) is MultiModalFeature for r in back.requests.values() for f in r.mm_features)


def test_the_json_shapes():
    seen = run_items(False, False)
    state = next(s for s, _ in seen if len(s.encoder_cache.cached.get("x", ())) == 2)
    obj = via_text(state_to_json(state))
    assert obj["encoder_cache"]["cached"]["x"] == ["a", "b"]  # sorted: a set
    assert obj["encoder_cache"]["num_embeds"]["x"] == 8
    assert obj["encoder_cache"]["refs"]["b"] == {"0": "x", "1": "y"}  # input ids in decimal
    assert obj["encoder_cache"]["freeable"] == []
    assert obj["requests"]["b"]["mm_features"] == [{"offset": 0, "length": 8, "identifier": "x"},
                                                   {"offset": 10, "length": 8, "identifier": "y"}]
    first = via_text(output_to_json(seen[0][1]))
    assert first["scheduled_encoder_inputs"] == [["a", [0]], ["b", [1]]]  # b finds x, allocated by a
    evicting = via_text(output_to_json(next(o for _, o in seen if o.free_encoder_mm_hashes)))
    assert evicting["free_encoder_mm_hashes"] == ["x"]


def test_empty_fields_are_not_written():
    """Vectors without encoder inputs read and write as they did before them."""
    c = SchedulerConfig(max_num_batched_tokens=64, max_model_len=128, block_size=4, num_gpu_blocks=80)
    s = S.add_request(SchedulerState(c), make_request(c, "a", 10, 2))
    out, s = S.schedule(s)
    obj = state_to_json(s)
    assert "encoder_cache" not in obj and "mm_features" not in obj["requests"]["a"]
    assert not {"scheduled_encoder_inputs", "free_encoder_mm_hashes"} & set(output_to_json(out))
    assert state_from_json(via_text(obj)).encoder_cache is EMPTY_ENCODER_CACHE
    # An encoder cache emptied again (every entry evicted, none referenced) is left out too.
    assert "encoder_cache" not in state_to_json(dataclasses.replace(s, encoder_cache=type(EMPTY_ENCODER_CACHE)()))


@functools.lru_cache(maxsize=None)
def random_encoder_runs() -> tuple:
    """Every state and output of random scenarios that draw encoder inputs (all four
    flag combinations), cut to 30 steps."""
    seen = []
    for i in range(60):
        sc = random_scenario(31, i, FLAGS_ALL, frozenset({"encoder_inputs"}))
        if not any(r.mm_features for r in sc.requests):
            continue
        sc = dataclasses.replace(sc, max_steps=min(sc.max_steps, 30))
        run_scenario(sc, SpecScheduler(), on_step=lambda t: seen.extend([(t.before, t.output), (t.after, t.output)]))
    return tuple(seen)


def test_random_states_with_encoder_inputs_round_trip_exactly():
    seen = random_encoder_runs()
    assert sum(s.encoder_cache != EMPTY_ENCODER_CACHE for s, _ in seen) > 50
    assert any(o.free_encoder_mm_hashes for _, o in seen) and any(s.encoder_cache.freeable for s, _ in seen)
    for state, output in seen:
        assert state_from_json(via_text(state_to_json(state))) == state
        assert output_from_json(via_text(output_to_json(output))) == output


# --- bad input --------------------------------------------------------------------------------


def shared_state_json() -> dict:
    """"a" and "b" both hold x; "b" holds y too (encoder_cache.refs.b = {"0": "x", "1": "y"})."""
    state = next(s for s, _ in run_items(False, False) if len(s.encoder_cache.cached.get("x", ())) == 2)
    return via_text(state_to_json(state))


def feature(s, rid="b", k=0):
    return s["requests"][rid]["mm_features"][k]


def cache(s):
    return s["encoder_cache"]


@pytest.mark.parametrize("change, message", [
    (lambda s: feature(s).update(length=-1), "state.requests.b.mm_features[0].length: must be an integer >= 1, got -1"),
    (lambda s: feature(s).update(length=0), "state.requests.b.mm_features[0].length: must be an integer >= 1, got 0"),
    (lambda s: feature(s).update(offset=1.0), "state.requests.b.mm_features[0].offset: must be an integer >= 0, got 1.0"),
    (lambda s: feature(s).update(identifier=7), "state.requests.b.mm_features[0].identifier: must be a string, got 7"),
    (lambda s: feature(s).update(identifier=""), "state.requests.b.mm_features[0].identifier: must be a non-empty"),
    (lambda s: feature(s).pop("identifier"), "state.requests.b.mm_features[0].identifier: missing"),
    (lambda s: feature(s).update(hash="x"), "state.requests.b.mm_features[0].hash: unknown field"),
    (lambda s: s["requests"]["b"].update(mm_features={"offset": 0}), "state.requests.b.mm_features: must be an array"),
    (lambda s: cache(s).pop("freeable"), "state.encoder_cache.freeable: missing"),
    (lambda s: cache(s).update(size=3), "state.encoder_cache.size: unknown field"),
    (lambda s: cache(s)["num_embeds"].update(x=0), "state.encoder_cache.num_embeds.x: must be an integer >= 1, got 0"),
    (lambda s: cache(s)["cached"].update(w=[]), "state.encoder_cache.cached.w: has no num_embeds"),
    (lambda s: cache(s)["num_embeds"].update(w=3), "state.encoder_cache.num_embeds: must name the entries of cached"),
    (lambda s: cache(s)["cached"].update(x=["a", "a"]), "state.encoder_cache.cached.x[1]: = 'a' appears twice"),
    (lambda s: cache(s)["refs"]["b"].update({"01": cache(s)["refs"]["b"].pop("1")}),
     "state.encoder_cache.refs.b['01']: must be keyed by an input id"),
    (lambda s: cache(s)["refs"]["b"].update({"²": cache(s)["refs"]["b"].pop("1")}),
     "state.encoder_cache.refs.b['²']: must be keyed by an input id"),
    # The spec would look input 5 up in b's two items: refused, not a crash of the spec.
    (lambda s: cache(s)["refs"]["b"].update({"5": cache(s)["refs"]["b"].pop("1")}),
     "state.encoder_cache.refs.b['5']: is not an input id of request 'b': it has 2 items"),
    (lambda s: cache(s)["refs"]["a"].update({"0": "y"}),
     "state.encoder_cache.refs.a['0']: = 'y', but state.encoder_cache.cached does not list 'a' for it"),
    (lambda s: cache(s)["refs"]["b"].update({"1": 9}), "state.encoder_cache.refs.b['1']: must be a string, got 9"),
    (lambda s: cache(s).update(freeable=["x"]), "state.encoder_cache.freeable[0]: = 'x' must be an entry no request"),
])
def test_bad_state_json_names_the_field(change, message):
    obj = shared_state_json()
    change(obj)
    with pytest.raises(StateJsonError) as e:
        state_from_json(obj)
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("change, message", [
    (lambda o: o.update(scheduled_encoder_inputs=[["a", [-1]]]),
     "output.scheduled_encoder_inputs[0][1][0]: must be an integer >= 0, got -1"),
    (lambda o: o.update(scheduled_encoder_inputs=[["a", 0]]), "output.scheduled_encoder_inputs[0][1]: must be an array"),
    (lambda o: o.update(scheduled_encoder_inputs=[["a"]]),
     "output.scheduled_encoder_inputs[0]: must be [request id, [input ids]]"),
    (lambda o: o.update(free_encoder_mm_hashes=[3]), "output.free_encoder_mm_hashes[0]: must be a string, got 3"),
])
def test_bad_output_json_names_the_field(change, message):
    obj = via_text(output_to_json(run_items(False, False)[0][1]))
    change(obj)
    with pytest.raises(StateJsonError) as e:
        output_from_json(obj)
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


# --- export and replay ------------------------------------------------------------------------

# Shared items (x in four requests), an eviction, a prefix group whose hits cover an
# item, and a small pool under async scheduling: preemptions that drop references.
SCENARIO = {
    "format": "schedspec.scenario/1", "name": "mm-vectors",
    "config": {"max_num_batched_tokens": 64, "max_num_seqs": 8, "max_num_encoder_input_tokens": 24,
               "encoder_cache_size": 40, "num_gpu_blocks": 20, "max_model_len": 256, "block_size": 16,
               "enable_prefix_caching": True, "async_scheduling": True},
    "requests": [
        {"id": "a", "prompt_len": 60, "output_len": 5,
         "mm_features": [{"offset": 5, "length": 10, "identifier": "x"}, {"offset": 20, "length": 20, "identifier": "y"}]},
        {"id": "b", "prompt_len": 50, "output_len": 4,
         "mm_features": [{"offset": 0, "length": 10, "identifier": "x"}, {"offset": 30, "length": 15, "identifier": "z"}]},
        {"id": "c", "prompt_len": 40, "arrival_step": 2, "output_len": 3,
         "mm_features": [{"offset": 10, "length": 24, "identifier": "w"}]},
        {"id": "d", "prompt_len": 60, "arrival_step": 3, "output_len": 3, "prefix_group": "g", "prefix_len": 40,
         "mm_features": [{"offset": 5, "length": 10, "identifier": "x"}]},
        {"id": "e", "prompt_len": 60, "arrival_step": 9, "output_len": 3, "prefix_group": "g", "prefix_len": 40,
         "mm_features": [{"offset": 5, "length": 10, "identifier": "x"}]},
    ],
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, list[Path], list[dict]]:
    d = tmp_path_factory.mktemp("vectors")
    scenarios = [scenario_from_json(SCENARIO)]
    scenarios += [dataclasses.replace(s, max_steps=min(s.max_steps, 20))
                  for s in (random_scenario(31, i, FLAGS_ALL, frozenset({"encoder_inputs"})) for i in range(30))
                  if any(r.mm_features for r in s.requests)][:4]
    count = export_campaign(d, scenarios)
    files = vector_files([d])
    assert count == len(files) > 0
    return d, files, [json.loads(f.read_text()) for f in files]


def test_the_export_carries_every_encoder_field(exported):
    _, _, vectors = exported
    outputs = [v["expected"]["output"] for v in vectors if v["call"]["name"] == "schedule"]
    assert any("mm_features" in v["call"]["request"] for v in vectors if v["call"]["name"] == "add_request")
    assert any(v["pre_state"].get("encoder_cache", {}).get("freeable") for v in vectors)
    assert any("scheduled_encoder_inputs" in o for o in outputs)
    assert any("free_encoder_mm_hashes" in o for o in outputs)
    assert any("free_encoder_mm_hashes" in v["call"]["output"] for v in vectors
               if v["call"]["name"] == "update_from_output")


def test_the_export_meets_the_schema(exported):
    """jsonschema on the published schema as written (no reader shortcut)."""
    _, _, vectors = exported
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for v in vectors:
        validator.validate(v)


def test_the_export_chains_and_replays_on_the_spec(exported):
    _, files, _ = exported
    spec = SpecScheduler()
    previous: dict[Path, dict] = {}
    for f in files:  # names sort in call order
        v = read_vector(f)
        if f.parent in previous:
            assert v["pre_state"] == previous[f.parent]["post_state"], f
        assert check_vector(v, spec) == [], f
        previous[f.parent] = v


def test_cli_export_and_check_of_a_scenario_file(tmp_path, capsys):
    scenario = tmp_path / "mm.json"
    scenario.write_text(json.dumps(SCENARIO))
    out = tmp_path / "v"
    rc, stdout, err = cli(capsys, "vectors", "export", scenario, "--out", out)
    assert rc == 0, err
    n = len(list(out.rglob("*.json")))
    assert n > 20 and stdout.startswith(f"{n} vectors from 1 scenarios written to ")
    rc, stdout, err = cli(capsys, "vectors", "check", out)
    assert rc == 0, err
    assert f"vectors: {n} checked on spec, {n} agreed, 0 differed" in stdout


def test_a_spec_evicting_the_newest_entry_is_caught(exported, capsys):
    """The encoder cache's eviction order reaches the replay: a mutant evicting the
    newest freeable entry first differs in the state or the output."""
    d, _, _ = exported
    with mutated([Mutation("encoder_cache.EncoderCacheWork.can_allocate", "next(iter(self.freeable))",
                           "next(reversed(self.freeable))")]):
        rc, out, err = cli(capsys, "vectors", "check", d)
    assert rc == 1, err
    assert "DIFFERS" in out and ("encoder_cache" in out or "free_encoder_mm_hashes" in out)


@pytest.mark.parametrize("change, message", [
    (lambda v: v["call"]["request"]["mm_features"][0].update(length=-3),
     r"call\.request\.mm_features\[0\]\.length: "),
    (lambda v: v["call"]["request"]["mm_features"][0].update(identifier=5),
     r"call\.request\.mm_features\[0\]\.identifier: "),
    (lambda v: v["pre_state"]["config"].update(encoder_cache_size=0), r"pre_state\.config\.encoder_cache_size: "),
])
def test_a_bad_vector_file_is_a_one_line_error_naming_the_field(exported, tmp_path, change, message):
    _, _, vectors = exported
    v = json.loads(json.dumps(next(v for v in vectors if v["call"]["name"] == "add_request"
                                   and "mm_features" in v["call"]["request"])))
    change(v)
    assert_vector_file_error(v, tmp_path, "^" + message)


def test_a_bad_encoder_cache_in_a_vector_file_names_the_field(exported, tmp_path, capsys):
    """A reference to an item its request lacks: one line from `vectors check`, exit 2,
    not a crash of the spec on replay."""
    _, _, vectors = exported
    v = json.loads(json.dumps(next(v for v in vectors if v["call"]["name"] == "update_from_output"
                                   and v["pre_state"].get("encoder_cache", {}).get("refs"))))
    refs = v["pre_state"]["encoder_cache"]["refs"]
    rid = next(iter(refs))
    refs[rid]["7"] = refs[rid].pop(next(iter(refs[rid])))
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(v))
    rc, _, err = cli(capsys, "vectors", "check", p)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(p) in err and f"pre_state.encoder_cache.refs.{rid}['7']: is not an input id of request" in err
