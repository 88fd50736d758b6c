"""Reading scenario files (docs/formats.md, "Reading a scenario file"): strict
JSON, integer fields that take integers only, schedspec's bounds, the rules a
schema cannot say, and one-line errors that name the field."""

import copy
import dataclasses
import json
import re

import pytest

from helpers import assert_one_line_error, cli
from schedspec.reference.example_files import EXAMPLES_DIR
from schedspec.reference.scenario import (MAX_DEPTH, MAX_FILE_BYTES, SCHEMA_DIR, Abort, RequestSpec, Scenario,
                                          ScenarioError, check_bounds, load_scenario, published_schema, save_scenario,
                                          scenario_from_json)
from schedspec.reference.scenario_fields import ARRIVAL_TIME_BOUND, REQUEST
from schedspec.spec.config import CONFIG_TABLE

# The integer fields with schedspec's bound: the config's (spec/config.py) and a
# request's (reference/scenario_fields.py) tables.
CONFIG_BOUNDS = {name: (None, row.maximum) for name, row in CONFIG_TABLE.items() if row.maximum is not None}
REQUEST_BOUNDS = {f.name: (f.minimum, f.maximum) for f in REQUEST.fields if f.kind == "integer"}
OTHER_BOUNDS = (None, 2**31 - 1)  # aborts[].step and max_steps

BASE = json.loads((EXAMPLES_DIR / "group-a.json").read_text())  # 11 requests, max_steps 12


def write(tmp_path, data, name="s.json"):
    f = tmp_path / name
    f.write_bytes(data if isinstance(data, bytes) else
                  (data if isinstance(data, str) else json.dumps(data)).encode("utf-8"))
    return f


def mutated(fn):
    d = copy.deepcopy(BASE)
    fn(d)
    return d


def error_of(capsys, f):
    rc, _, err = cli(capsys, "validate", f)
    assert_one_line_error(rc, err)
    return err.strip()


# --- pass 1: bytes to JSON --------------------------------------------------------------


BASE_TEXT = json.dumps(BASE)


@pytest.mark.parametrize("raw, words", [
    (BASE_TEXT.encode()[:40] + b"\xff" + BASE_TEXT.encode()[40:], ["not UTF-8", "0xff", "offset 40"]),
    (BASE_TEXT.encode("utf-16"), ["not UTF-8"]),
    (b"[" * 100_000, ["nested more than"]),
    (("[" * 1000 + "]" * 1000).encode(), ["nested more than"]),
    (BASE_TEXT.replace('"max_steps": 12', '"max_steps": ' + "9" * 5000).encode(), ["max_steps", "5000 digits"]),
    (BASE_TEXT.replace('"max_steps": 12', '"max_steps": NaN').encode(), ["max_steps", "NaN"]),
    (BASE_TEXT.replace('"max_steps": 12', '"max_steps": -Infinity').encode(), ["max_steps", "Infinity"]),
    (BASE_TEXT.replace('"max_steps": 12', '"max_steps": 1e999').encode(), ["max_steps", "infinity"]),
    (BASE_TEXT.replace('"max_num_seqs": 32', '"max_num_seqs": 32, "max_num_seqs": 33').encode(),
     ["config.max_num_seqs", "more than once"]),
    (BASE_TEXT.replace('"name": "group-a"', '"name": "\\ud800"').encode(), ["name", "surrogate"]),
    (b"", ["not valid JSON"]),
    (BASE_TEXT.encode()[:-7], ["not valid JSON"]),
])
def test_bad_bytes_are_one_line_errors(tmp_path, capsys, raw, words):
    f = write(tmp_path, raw)
    for command in ("validate", "run", "check"):
        rc, _, err = cli(capsys, command, f)
        assert_one_line_error(rc, err, *words)
        assert len(err) < 400, err


def test_nesting_inside_a_field_names_the_field(tmp_path, capsys):
    d = mutated(lambda d: d.update(description=json.loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))))
    assert "description[0][0]" in error_of(capsys, write(tmp_path, d))


def test_a_byte_order_mark_is_skipped(tmp_path, capsys):
    rc, _, err = cli(capsys, "validate", write(tmp_path, b"\xef\xbb\xbf" + BASE_TEXT.encode()))
    assert rc == 0, err


def test_file_size_cap(tmp_path, capsys):
    f = tmp_path / "big.json"
    with open(f, "wb") as fh:  # a sparse file: no disk used
        fh.truncate(MAX_FILE_BYTES + 1)
    assert "64 MiB" in error_of(capsys, f)
    assert "cannot read" in error_of(capsys, tmp_path)  # a folder


# --- the one path style, excerpts -------------------------------------------------------


@pytest.mark.parametrize("mutate, prefix", [
    (lambda d: d["config"].update(max_num_seqs="many"), "config.max_num_seqs: "),
    (lambda d: d["config"].update(max_num_seqs=0), "config.max_num_seqs: "),  # vLLM's check
    (lambda d: d["requests"][3].update(prompt_len=[]), "requests[3].prompt_len: "),
    (lambda d: d["requests"][3].update(prompt_len=9000), "requests[3].prompt_len: "),  # vLLM's check
    (lambda d: d["requests"][3].update(max_tokens=0), "requests[3].max_tokens: "),  # vLLM's check
    (lambda d: d["requests"][3].pop("prompt_len"), "requests[3].prompt_len: missing"),
    (lambda d: d["requests"][3].update(colour="red"), "requests[3].colour: unknown field"),
    (lambda d: d["config"].update(max_num_seq=4), "config.max_num_seq: unknown field; did you mean max_num_seqs?"),
    (lambda d: d["requests"][3].update(prompt_ln=4), "requests[3].prompt_ln: unknown field; did you mean prompt_len?"),
    (lambda d: d.update(max_step=4), "max_step: unknown field; did you mean max_steps?"),
    (lambda d: d.update(aborts=[{"id": "d0", "step": "x"}]), "aborts[0].step: "),
    (lambda d: d.update(aborts=[{"id": "d0", "step": 0}]), "aborts[0].step: "),
    (lambda d: d.update(max_steps=0), "max_steps: "),
    (lambda d: d.pop("name"), "name: missing"),
    (lambda d: d.update(format="schedspec.scenario/2"), "format: "),
])
def test_one_path_style(tmp_path, capsys, mutate, prefix):
    f = write(tmp_path, mutated(mutate))
    err = error_of(capsys, f)
    assert err.startswith(f"schedspec: error: {f}: {prefix}"), err
    assert "$" not in err


def test_long_values_and_keys_are_cut(tmp_path, capsys):
    long = "x" * 100_000
    for mutate, field in [(lambda d: d["requests"][0].update(prompt_len=long), "requests[0].prompt_len"),
                          (lambda d: d["config"].update(policy=long), "config.policy"),
                          (lambda d: d["config"].update({long: 1}), "config['xxx"),
                          (lambda d: d["requests"][0].update(id="\n\x1b[31m" + long), "requests[0].id")]:
        d = mutated(mutate)
        if field == "requests[0].id":
            d["requests"][1]["id"] = d["requests"][0]["id"]  # a duplicate quotes it
            field = "requests[1].id"
        err = error_of(capsys, write(tmp_path, d))
        assert field in err and len(err) < 400 and "\u2026" in err, err
        assert "\x1b" not in err


# --- integers ---------------------------------------------------------------------------


INT_FIELDS = ([("config", k) for k in CONFIG_BOUNDS]
              + [("request", k) for k in REQUEST_BOUNDS] + [("abort", "step"), ("top", "max_steps")])


def put(d, where, key, value):
    if where == "config":
        d["config"][key] = value
    elif where == "request":
        d["requests"][0][key] = value
        if key == "prefix_len":
            d["requests"][0]["prefix_group"] = "g"
    elif where == "abort":
        d["aborts"] = [{"id": "d0", "step": value}]
    else:
        d[key] = value


@pytest.mark.parametrize("where, key", INT_FIELDS)
@pytest.mark.parametrize("value", [4.0, 1e30, -0.0, True])
def test_integer_fields_take_integers_only(tmp_path, capsys, where, key, value):
    d = copy.deepcopy(BASE)
    put(d, where, key, value)
    err = error_of(capsys, write(tmp_path, d))
    assert "must be an integer" in err and key in err, err


def test_integral_floats_are_never_silently_converted():
    d = copy.deepcopy(BASE)
    d["requests"][0]["arrival_time"] = 3  # a number field: an integer is a number
    assert scenario_from_json(d).requests[0].arrival_time == 3.0
    d["requests"][0]["prompt_len"] = 1.0
    with pytest.raises(ScenarioError, match=r"requests\[0\]\.prompt_len: must be an integer, got 1\.0"):
        scenario_from_json(d)


# --- bounds -----------------------------------------------------------------------------


def _schema():
    return json.loads((SCHEMA_DIR / "scenario.schema.json").read_text())


def test_the_shipped_schema_is_the_generated_one():
    """scenario.schema.json's fields come from the tables of fields: the config's
    (spec/config.py) and the rest (reference/scenario_fields.py); scripts/write-scenario-schema.py
    writes it."""
    assert _schema() == published_schema(), "run scripts/write-scenario-schema.py"
    cfg = _schema()["properties"]["config"]["properties"]
    assert list(cfg) == list(CONFIG_TABLE)
    assert cfg["max_num_seqs"] == {"type": "integer", "maximum": 2**31 - 1}
    assert cfg["max_loras"]["type"] == ["integer", "null"] and cfg["watermark"] == {"type": "number"}


def test_the_bounds_table_is_the_generated_one():
    """docs/formats.md's bounds table is the one the tables of fields state
    (scripts/write-scenario-schema.py writes it)."""
    import runpy

    script = runpy.run_path(str(SCHEMA_DIR.parents[1] / "scripts" / "write-scenario-schema.py"))
    doc = (SCHEMA_DIR.parents[1] / "docs" / "formats.md").read_text()
    assert script["with_bounds_table"](doc) == doc, "run scripts/write-scenario-schema.py"
    assert "| `requests[].priority` | −2 147 483 648 (−2³¹) … 2 147 483 647 (2³¹ − 1) |" in doc
    assert "| `config.max_model_len` | [≥ 1] … 1 073 741 824 (2³⁰) |" in doc


def test_the_schema_states_the_bounds():
    """The bounds as the format fixes them (docs/formats.md), in the schema generated
    from the tables; a change to a bound is a change to the format."""
    s = _schema()
    cfg = s["properties"]["config"]["properties"]
    for name, (lo, hi) in CONFIG_BOUNDS.items():
        assert cfg[name]["maximum"] == hi and cfg[name].get("minimum") == lo, name
    req = s["properties"]["requests"]["items"]["properties"]
    bounds = {name: (req[name].get("minimum"), req[name].get("maximum")) for name in req}
    assert set(req) == {f.name for f in dataclasses.fields(RequestSpec)}
    assert {k: v for k, v in bounds.items() if v != (None, None)} == {
        "arrival_step": (0, 2**31 - 2), "prompt_len": (None, 2**30 - 1), "max_tokens": (None, 2**31 - 1),
        "output_len": (1, 2**31 - 1), "priority": (-2**31, 2**31 - 1), "arrival_time": (-2**53, 2**53),
        "prefix_len": (0, 2**30 - 1), "lora_int_id": (0, 2**31 - 1), "grammar_compile_steps": (0, 2**31 - 1),
        "kv_connector_tokens": (0, 2**30 - 1), "kv_connector_load_steps": (1, 2**31 - 1),
        "kv_connector_send_steps": (1, 2**31 - 1)}
    tok = req["prompt_token_ids"]["items"]
    assert (tok["minimum"], tok["maximum"]) == (0, 2**31 - 1)
    assert (req["num_draft_tokens"]["minItems"], req["num_draft_tokens"]["maxItems"]) == (1, 4096)
    step = s["properties"]["aborts"]["items"]["properties"]["step"]
    assert (step["minimum"], step["maximum"]) == (0, 2**31 - 1)
    ms = s["properties"]["max_steps"]
    assert (ms["minimum"], ms["maximum"]) == (1, 2**31 - 1)
    # every integer field of the schema has a maximum
    def walk(node, path):
        if isinstance(node, dict):
            types = node.get("type")
            if types == "integer" or (isinstance(types, list) and "integer" in types):
                assert "maximum" in node, path
            for k, v in node.items():
                walk(v, f"{path}.{k}")
    walk(s, "")


def test_bounds_are_documented():
    doc = (SCHEMA_DIR.parents[1] / "docs" / "formats.md").read_text()
    for text in ("2 147 483 647", "4 194 304", "1 073 741 824", "64 MiB", "must be an integer"):
        assert text in doc, text


@pytest.mark.parametrize("where, key", INT_FIELDS)
def test_one_above_a_bound_is_rejected(tmp_path, capsys, where, key):
    d = copy.deepcopy(BASE)
    hi = {"config": CONFIG_BOUNDS, "request": REQUEST_BOUNDS}.get(where, {}).get(key) or \
        OTHER_BOUNDS
    put(d, where, key, hi[1] + 1)
    err = error_of(capsys, write(tmp_path, d))
    assert f"must be <= {hi[1]}" in err and key in err, err


def test_at_the_bounds_run(tmp_path, capsys):
    """The largest values validate accepts run on the spec and the torch
    implementation, fast: a pool of 2**22 blocks is a count."""
    pytest.importorskip("torch")
    d = copy.deepcopy(BASE)
    d["config"].update(num_gpu_blocks=CONFIG_BOUNDS["num_gpu_blocks"][1], max_model_len=(2**22 - 1) * 16,
                       max_num_batched_tokens=2**31 - 1, max_num_scheduled_tokens=16,
                       max_num_seqs=2**31 - 1, block_size=16)
    d["requests"][0].update(max_tokens=2**31 - 1, output_len=2**31 - 1, priority=-2**31,
                            arrival_time=-float(ARRIVAL_TIME_BOUND))
    d["requests"][1].update(priority=2**31 - 1, arrival_time=float(ARRIVAL_TIME_BOUND))
    d["aborts"] = [{"id": "d0", "step": 2**31 - 1}]
    f = write(tmp_path, d)
    rc, _, err = cli(capsys, "validate", f)
    assert rc == 0, err
    for impl in ("spec", "torch"):
        for command in ("run", "check"):
            rc, _, err = cli(capsys, command, f, "--impl", impl, "--device", "cpu") if impl == "torch" \
                else cli(capsys, command, f, "--impl", impl)
            assert rc == 0 and "Traceback" not in err, err


def test_check_bounds_on_a_scenario_built_in_code():
    ok = Scenario("s", {}, (RequestSpec("a", 4),))
    check_bounds(ok)
    with pytest.raises(ScenarioError, match=r"^requests\[0\]\.priority: = 2147483648, must be <= 2147483647"):
        check_bounds(Scenario("s", {}, (RequestSpec("a", 4, priority=2**31),)))
    # The config meets the table's bounds when the scenario is built, from a dict or a config.
    with pytest.raises(ScenarioError, match=r"^config\.num_gpu_blocks: = an integer of about 401 digits, must be <="):
        Scenario("s", {"num_gpu_blocks": 10**400}, (RequestSpec("a", 4),))
    with pytest.raises(ScenarioError, match=r"^config\.max_num_seqs: must be an integer, got '4'"):
        Scenario("s", dataclasses.replace(ok.config, max_num_seqs="4"), (RequestSpec("a", 4),))
    with pytest.raises(ScenarioError, match=r"^config\.max_num_seq: unknown field; did you mean max_num_seqs\?"):
        Scenario("s", {"max_num_seq": 4}, (RequestSpec("a", 4),))
    with pytest.raises(ScenarioError, match=r"^requests\[0\]\.arrival_time: "):
        check_bounds(Scenario("s", {}, (RequestSpec("a", 4, arrival_time=float("nan")),)))
    # The same table as a file's: the encoder items too.
    with pytest.raises(ScenarioError, match=r"^requests\[0\]\.mm_features: holds 9 entries, must hold at most 8 "):
        check_bounds(Scenario("s", {}, (RequestSpec("a", 40, mm_features=((0, 1, "x"),) * 9),)))
    with pytest.raises(ScenarioError, match=r"^requests\[0\]\.num_draft_tokens\[1\]: = 1025, must be <= 1024 "):
        check_bounds(Scenario("s", {}, (RequestSpec("a", 4, num_draft_tokens=(1, 1025)),)))


def test_an_unknown_request_field_names_the_nearest():
    with pytest.raises(ScenarioError, match=r"^requests\[0\]\.promt_len: unknown field; did you mean prompt_len\?$"):
        scenario_from_json(mutated(lambda d: d["requests"][0].update(promt_len=4)))


# --- rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("max_steps", [None, 12])
def test_a_request_that_would_never_arrive_is_rejected(tmp_path, capsys, max_steps):
    d = copy.deepcopy(BASE)
    if max_steps is None:
        d.pop("max_steps")
    d["requests"][-1]["arrival_step"] = 10000 if max_steps is None else 12
    err = error_of(capsys, write(tmp_path, d))
    assert "requests[10].arrival_step" in err and "never arrive" in err, err
    assert ("the default" in err) == (max_steps is None)
    d["requests"][-1]["arrival_step"] = 9999 if max_steps is None else 11
    assert cli(capsys, "validate", write(tmp_path, d))[0] == 0


def test_an_abort_after_the_run_is_accepted_and_never_applied(tmp_path, capsys):
    d = mutated(lambda d: d.update(aborts=[{"id": "d0", "step": 50}]))
    f = write(tmp_path, d)
    rc, _, err = cli(capsys, "run", f, "--trace-out", tmp_path / "t.json")
    assert rc == 0, err
    trace = json.loads((tmp_path / "t.json").read_text())
    assert all(why != "aborted" for s in trace["steps"] for _, why in s["finished"])


@pytest.mark.parametrize("mutate, words", [
    (lambda r: r.update(prefix_len=1), ["requests[0].prefix_len", "prefix_group"]),
    (lambda r: r.update(prefix_group="g", prefix_len=2), ["requests[0].prefix_len", "prompt_len (1)"]),
    (lambda r: r.update(prefix_group="g", prefix_len=-1), ["requests[0].prefix_len", ">= 0"]),
    (lambda r: r.update(prefix_group=""), ["requests[0].prefix_group", "empty"]),
    (lambda r: r.update(prefix_group=3), ["requests[0].prefix_group", "string or null"]),
    (lambda r: r.update(prompt_token_ids=[1, 2]), ["requests[0].prompt_token_ids", "prompt_len (1)"]),
    (lambda r: r.update(prompt_token_ids=[-1]), ["requests[0].prompt_token_ids[0]", ">= 0"]),
    (lambda r: r.update(prompt_token_ids=[2**31]), ["requests[0].prompt_token_ids[0]", "<= 2147483647"]),
    (lambda r: r.update(prompt_token_ids=[1.0]), ["requests[0].prompt_token_ids[0]", "must be an integer"]),
    (lambda r: r.update(prompt_token_ids=[5], prefix_group="g"), ["requests[0].prompt_token_ids", "prefix_group"]),
])
def test_prefix_fields_rules(tmp_path, capsys, mutate, words):
    d = mutated(lambda d: mutate(d["requests"][0]))
    err = error_of(capsys, write(tmp_path, d))
    for w in words:
        assert w in err, err


def test_prefix_fields_round_trip(tmp_path):
    d = copy.deepcopy(BASE)
    d["requests"][0]["prompt_token_ids"] = [7]
    d["requests"][1].update(prefix_group="sys", prefix_len=1)
    d["requests"][2].update(prefix_group="sys", prefix_len=0, prompt_len=3)
    s = load_scenario(write(tmp_path, d))
    assert s.requests[0].prompt_token_ids == (7,) and s.requests[0].prefix_group is None
    assert (s.requests[1].prefix_group, s.requests[1].prefix_len) == ("sys", 1)
    assert s.requests[3] == RequestSpec("d3", 1, 0, 100, None, 0, 3.0)
    out = save_scenario(s, tmp_path / "again.json")
    again = json.loads(out.read_text())
    assert load_scenario(out) == s
    assert again["requests"][0]["prompt_token_ids"] == [7]
    assert again["requests"][2]["prefix_group"] == "sys" and "prefix_len" not in again["requests"][2]
    assert not {"prefix_group", "prefix_len", "prompt_token_ids"} & set(again["requests"][3])


def test_without_late_arrivals():
    s = Scenario("s", {}, (RequestSpec("a", 4), RequestSpec("b", 4, arrival_step=5)),
                 (Abort("a", 2), Abort("b", 6)), max_steps=5)
    t = s.without_late_arrivals()
    assert [r.id for r in t.requests] == ["a"] and t.aborts == (Abort("a", 2),)
    assert t.without_late_arrivals() is t


def test_shipped_examples_still_load():
    for f in sorted(EXAMPLES_DIR.glob("*.json")):
        s = load_scenario(f)
        assert re.fullmatch(r"[a-z0-9-]+", s.name)


def _first_schema_error(data):
    """jsonschema's first error on the published schema, in path order, as the reader
    worded it when jsonschema checked files: (path text, message) or None."""
    from schedspec.reference.strict_json import TYPE_WORDS, StrictValidator
    from schedspec.spec.config import excerpt, unknown_field

    errors = sorted(StrictValidator(published_schema()).iter_errors(data),
                    key=lambda e: [(0, p) if isinstance(p, int) else (1, str(p)) for p in e.absolute_path])
    if not errors:
        return None
    e = errors[0]
    path, v, want, got = tuple(e.absolute_path), e.validator, e.validator_value, e.instance
    if v == "type":
        kinds = want if isinstance(want, list) else [want]
        message = f"must be {' or '.join(TYPE_WORDS[k] for k in kinds)}, got {excerpt(got)}"
    elif v == "required":
        path, message = path + (next(k for k in want if k not in got),), "missing; this field is required"
    elif v == "additionalProperties":
        extra = next(k for k in got if k not in e.schema["properties"])
        path, message = path + (extra,), unknown_field(extra, e.schema["properties"])
    elif v == "minimum":
        message = f"= {excerpt(got)}, must be >= {want}"
    elif v == "maximum":
        message = f"= {excerpt(got)}, must be <= {want} (schedspec's bound, docs/formats.md)"
    elif v == "const":
        message = f"= {excerpt(got)}, must be {want!r}"
    elif v == "minLength":
        message = f"= {excerpt(got)}, must not be empty"
    else:
        message = None  # minItems, maxItems, maxLength: the tables word them (scenario_fields.py)
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "the top level"
    return text, message


BAD_STRUCTURES = [
    lambda d: d["requests"][0].update(prompt_len=1.0), lambda d: d["requests"][0].update(extra=1),
    lambda d: d["requests"][0].update(promt_len=1), lambda d: d.update(config=[]), lambda d: d.update(format="x"),
    lambda d: d["requests"][0].pop("id"), lambda d: d["requests"][3].update(priority=2**31, arrival_step=-1),
    lambda d: d["requests"][2].update(max_tokens="5"), lambda d: d["requests"][2].update(output_len=0),
    lambda d: d["requests"][1].update(arrival_time=2.0**60), lambda d: d["requests"][1].update(prefix_group=""),
    lambda d: d["requests"][1].update(prompt_token_ids=[1, -2]), lambda d: d["requests"][1].update(grammar_error=1),
    lambda d: d["requests"][1].update(num_draft_tokens=[]),
    lambda d: d["requests"][1].update(num_accepted_tokens=[0] * 4097),
    lambda d: d["requests"][1].update(num_draft_tokens=[1025]), lambda d: d["requests"][1].update(mm_features=[{}]),
    lambda d: d["requests"][1].update(mm_features=[{"offset": 0, "length": 0, "identifier": "x"}]),
    lambda d: d["requests"][1].update(mm_features=[{"offset": 0, "length": 1, "identifier": "x" * 257}]),
    lambda d: d["requests"][1].update(mm_features=[{"offset": 0, "length": 1, "identifier": "x"}] * 9),
    lambda d: d["requests"][1].update(grammar_compile_steps=None), lambda d: d.update(aborts=[{"id": "d0"}]),
    lambda d: d.update(aborts=[{"id": 3, "step": 2**31}]), lambda d: d.update(max_steps=0),
    lambda d: d.update(max_steps=True, name=""), lambda d: d.update(requests={}), lambda d: d.pop("requests"),
    lambda d: d.update(extra=1, name=1), lambda d: d["config"].update(max_num_seqs=2**31, policy=3),
    lambda d: (d["config"].update(max_num_seqs=2**31), d.update(aborts=[{"id": "d0", "step": -1}])),
    lambda d: (d["config"].update(max_num_sq=2), d.update(max_steps=1.5)),
]


@pytest.mark.parametrize("k", range(len(BAD_STRUCTURES)))
def test_the_tables_check_what_the_published_schema_says(k):
    """The reader's check by the tables refuses exactly what the published schema
    (generated from them) refuses, and names the field of the schema's first error,
    with the words the reader gave it when jsonschema checked files."""
    from schedspec.reference.scenario import check_structure

    check_structure(BASE)
    assert _first_schema_error(BASE) is None
    bad = mutated(BAD_STRUCTURES[k])
    with pytest.raises(ScenarioError) as got:
        check_structure(bad)
    where, message = _first_schema_error(bad)
    assert str(got.value).startswith(f"{where}: "), (str(got.value), where)
    if message is not None:
        assert str(got.value) == f"{where}: {message}"


def test_prompts_with_prefix_caching_are_bounded_in_total(tmp_path, capsys):
    from schedspec.reference.scenario import MAX_CACHED_PROMPT_TOKENS

    d = mutated(lambda d: d["config"].update(enable_prefix_caching=True, max_model_len=2**23,
                                             num_gpu_blocks=2**22, max_num_batched_tokens=2**23))
    d["requests"][0]["prompt_len"] = MAX_CACHED_PROMPT_TOKENS  # + 10 one-token prompts
    err = error_of(capsys, write(tmp_path, d))
    assert "requests[1].prompt_len" in err and "enable_prefix_caching" in err, err
    d["config"]["enable_prefix_caching"] = False  # counts only: accepted
    assert cli(capsys, "validate", write(tmp_path, d))[0] == 0


@pytest.mark.parametrize("extra", [{}, {"prefix_group": "g"}, {"prompt_token_ids": []}])
@pytest.mark.parametrize("prompt_len", [-1, -7, 0])
def test_a_prompt_len_below_one_is_reported_as_prompt_len(tmp_path, capsys, prompt_len, extra):
    """Not as an error of prefix_len (or prompt_token_ids), fields the request may not have."""
    d = mutated(lambda d: d["requests"][3].update(prompt_len=prompt_len, **extra))
    err = error_of(capsys, write(tmp_path, d))
    assert f"requests[3].prompt_len: = {prompt_len}" in err and "prefix_len" not in err, err
    assert "prompt_token_ids" not in err, err
    # The same words from the one validity check on a Scenario built in code.
    from schedspec.reference.scenario import scenario_problem

    s = scenario_from_json(d)
    assert err.endswith(f": {scenario_problem(s)}"), err


def test_scenario_problem_is_none_for_the_shipped_examples():
    from schedspec.reference.scenario import scenario_problem

    for f in sorted(EXAMPLES_DIR.glob("*.json")):
        assert scenario_problem(load_scenario(f)) is None, f


def test_synthetic_prompt_ids_avoid_every_explicit_id():
    # An explicit prompt equal to what the spec would pick for another request must
    # not make the two share a prefix: synthetic first ids skip the explicit ones.
    from schedspec.reference.prompts import prompt_token_ids

    config = {"max_num_batched_tokens": 16, "max_num_seqs": 4, "max_model_len": 16, "block_size": 2,
              "num_gpu_blocks": 20, "enable_prefix_caching": True}
    plain = Scenario("p", config, (RequestSpec("a", 4), RequestSpec("b", 4, prefix_group="g", prefix_len=4)),
                     max_steps=10)
    ids = prompt_token_ids(plain)
    # The same ids, given explicitly by a third request: the first two now get others.
    clash = dataclasses.replace(plain, requests=plain.requests + (
        RequestSpec("x", 4, prompt_token_ids=ids["a"]), RequestSpec("y", 4, prompt_token_ids=ids["b"])))
    got = prompt_token_ids(clash)
    assert got["x"] == ids["a"] and got["y"] == ids["b"]
    assert got["a"][0] not in {got["x"][0], got["y"][0]} and got["b"][0] not in {got["x"][0], got["y"][0]}
    # Without a clash the ids are the ones files have always had.
    assert ids["a"][0] == 1000 and ids["b"][0] == 200


@pytest.mark.parametrize("token", [2, 100])
def test_explicit_prompts_may_not_use_the_fake_models_output_ids(token, tmp_path):
    d = {"format": "schedspec.scenario/1", "name": "o",
         "config": {"max_num_batched_tokens": 16, "max_num_seqs": 4, "max_model_len": 16, "block_size": 2,
                    "num_gpu_blocks": 20, "enable_prefix_caching": True},
         "requests": [{"id": "a", "prompt_len": 3, "max_tokens": 2, "prompt_token_ids": [5, token, 6]}]}
    path = tmp_path / "o.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ScenarioError, match=rf"requests\[0\]\.prompt_token_ids\[1\]: = {token} is an id the fake"):
        load_scenario(path)
