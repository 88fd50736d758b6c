"""Fuzz the scenario reader through the command line, in-process.

Two sources of input: scenarios drawn from the published JSON Schema
(hypothesis-jsonschema), and byte-level mutations of the shipped examples
(truncations, bit flips, inserted bytes, deep nesting, huge and special
numbers, duplicate keys, other encodings).  For each file, `validate` must end
with exit 0, or exit 2 and exactly one line on stderr; never an exception.  A
file `validate` accepts must run: `run` and `check` on the spec and on the
torch implementation, without an exception, `run` with exit 0.

Sizes are kept small (max_steps <= 30 for drawn scenarios, <= 100 for mutated
ones) so that the whole file takes well under a minute.
"""

from __future__ import annotations

import copy
import json
import os
import re

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis_jsonschema import from_schema

from helpers import cli
from schedspec.reference.example_files import EXAMPLES_DIR
from schedspec.reference.scenario import (SCHEMA_DIR, ScenarioError, check_structure, load_scenario,
                                          parse_scenario_bytes, published_schema)
from schedspec.reference.strict_json import StrictValidator


def _mend_hypothesis_jsonschema() -> None:
    """hypothesis-jsonschema 0.23.1 (the latest) draws objects with
    `cu.many(...).more()`, a private Hypothesis API that newer Hypothesis
    replaced by `with many(...) as e: for _ in e:`.  Give it the old call on top
    of the new one; a no-op where the old API still exists."""
    import types

    import hypothesis_jsonschema._from_schema as fs
    from hypothesis.internal.conjecture import utils as cu

    if hasattr(cu.many, "more"):
        return

    class _Many:
        def __init__(self, data, **kw):
            self._many = cu.many(data, **kw)
            self._many.__enter__()
            self._it = iter(self._many)

        def more(self) -> bool:
            if next(self._it, self) is self:  # the loop has ended
                self._many.__exit__(None)
                return False
            return True

        def reject(self, why=None) -> None:
            self._many.reject(why)

    fs.cu = types.SimpleNamespace(**{**vars(cu), "many": _Many})


_mend_hypothesis_jsonschema()

SCHEMA = json.loads((SCHEMA_DIR / "scenario.schema.json").read_text())
# SCHEDSPEC_FUZZ_EXAMPLES=5000 for a longer campaign by hand.
FUZZ = settings(deadline=None, max_examples=int(os.environ.get("SCHEDSPEC_FUZZ_EXAMPLES", "100")),
                database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])

try:
    import torch  # noqa: F401

    IMPLS = (("spec",), ("torch", "--device", "cpu"))
except ImportError:  # the torch extra is optional
    IMPLS = (("spec",),)

# --- the oracle -------------------------------------------------------------------------


def _note(what: str) -> None:
    """Count outcomes for --hypothesis-show-statistics (outside a test, nothing)."""
    try:
        event(what)
    except InvalidArgument:
        pass


def assert_no_crash(capsys, path, run_steps_limit: int) -> int:
    """validate, and run/check when valid and small; return validate's status."""
    rc, _, err = cli(capsys, "validate", path)
    if rc == 0:
        assert err == "", err
    else:
        assert rc == 2, (rc, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("schedspec: error: "), err
        assert "Traceback" not in err and len(err) < 1000, err
        _note("rejected")
        return rc
    if load_scenario(path).max_steps > run_steps_limit:
        _note("valid, too long to run")
        return rc
    _note("valid, ran")
    for impl in IMPLS:
        for command, ok in (("run", (0,)), ("check", (0, 1))):  # check: 1 = a property violated
            rc2, _, err = cli(capsys, command, path, "--impl", *impl)
            if rc2 == 2 and impl[0] != "spec":
                # The spec accepts what vLLM accepts; another implementation may
                # support less (torch: no prefix caching, no async), and says so.
                assert len(err.strip().splitlines()) == 1 and f"{impl[0]} rejects" in err, (impl, err)
                _note(f"{impl[0]} rejects")
                continue
            assert rc2 in ok and "Traceback" not in err, (command, impl, err)
    return rc


PUBLISHED = StrictValidator(published_schema())


def assert_table_check_agrees(data) -> None:
    """The reader's check by the tables of fields says yes exactly when the JSON
    Schema generated from them does."""
    try:
        check_structure(data)
        ok = True
    except ScenarioError:
        ok = False
    assert ok == PUBLISHED.is_valid(data)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "scenario.json"


# --- scenarios drawn from the schema ----------------------------------------------------


def _sized(schema: dict, friendly: bool) -> dict:
    """The published schema with small arrays and strings and max_steps <= 30;
    `friendly` also narrows the numbers so that many drawn configs are valid."""
    s = copy.deepcopy(schema)
    props = s["properties"]
    props["name"]["maxLength"] = 6
    props["description"]["maxLength"] = 6
    props["max_steps"]["maximum"] = 30
    props["requests"]["maxItems"] = 4
    props["aborts"]["maxItems"] = 2
    req = props["requests"]["items"]["properties"]
    req["id"]["maxLength"] = 4
    req["prefix_group"]["maxLength"] = 2
    req["prompt_token_ids"]["maxItems"] = 4
    props["aborts"]["items"]["properties"]["id"]["maxLength"] = 4
    if friendly:
        cfg = props["config"]["properties"]
        for name, (lo, hi) in {"max_num_batched_tokens": (8, 64), "max_num_scheduled_tokens": (1, 64),
                               "max_num_seqs": (1, 8), "max_num_active_seqs": (1, 1), "max_model_len": (8, 64),
                               "long_prefill_token_threshold": (0, 2), "block_size": (1, 16),
                               "num_gpu_blocks": (66, 200)}.items():
            cfg[name].update(minimum=lo, maximum=hi)
        cfg["watermark"].update(minimum=0, maximum=0.5)
        cfg["policy"] = {"enum": ["fcfs", "priority"]}
        cfg["enable_prefix_caching"] = {"const": False}
        cfg["async_scheduling"] = {"const": False}
        for name, (lo, hi) in {"prompt_len": (1, 6), "max_tokens": (1, 6), "output_len": (1, 6),
                               "prefix_len": (0, 0), "arrival_step": (0, 0), "priority": (-2, 2)}.items():
            req[name].update(minimum=lo, maximum=hi)
        req["prompt_token_ids"] = {"type": "null"}
        # A failing grammar needs grammar_compile_steps (a rule the schema does not say).
        req["grammar_error"] = {"const": False}
        req["grammar_compile_steps"].update(minimum=0, maximum=3)
        # Fields whose rules tie them to others (drafts, a drafter's rows, lookahead, block drop to num_speculative_tokens,
        # a load to held tokens), left out: each new optional field made valid draws rarer.
        cfg["max_num_new_slots_for_drafting"] = {"const": 0}
        cfg["use_eagle_block_drop"] = {"const": False}
        cfg["num_prefill_lookahead_tokens"] = {"const": 0}
        req["kv_connector_load_steps"] = req["num_draft_tokens"] = req["num_accepted_tokens"] = False
        cfg["enable_chunked_prefill"] = {"const": True}
        props["aborts"]["maxItems"] = 0
        s["required"] = ["format", "name", "requests", "config", "max_steps"]
        props["requests"]["minItems"] = 1
    return s


@FUZZ
@given(data=st.one_of(from_schema(_sized(SCHEMA, False)), from_schema(_sized(SCHEMA, True))))
def test_schema_drawn_scenarios(capsys, scratch, data):
    assert_table_check_agrees(data)
    scratch.write_text(json.dumps(data))
    assert_no_crash(capsys, scratch, run_steps_limit=30)


def test_friendly_draws_reach_run_and_check():
    """Not vacuous: the narrowed schema does produce scenarios that validate."""
    from hypothesis import find

    from schedspec.reference.scenario import scenario_from_json, validate_scenario
    from schedspec.spec.config import ConfigError

    def valid(d):
        try:
            validate_scenario(scenario_from_json(d))
        except (ScenarioError, ConfigError):
            return False
        return len(d["requests"]) >= 2

    # derandomized: an unseeded search of 200 draws missed now and then (one
    # fresh-clone run in many), a flake rather than a finding
    find(from_schema(_sized(SCHEMA, True)), valid,
         settings=settings(max_examples=200, database=None, phases=[Phase.generate], derandomize=True))


# --- byte-level mutations of the shipped examples ---------------------------------------


def _base(path) -> bytes:
    d = json.loads(path.read_text())
    d["max_steps"] = min(d.get("max_steps", 10000), 40)
    return json.dumps(d, indent=1).encode()


BASES = {p.stem: _base(p) for p in sorted(EXAMPLES_DIR.glob("*.json"))}
NUMBER = re.compile(rb"(?<=: )-?\d+(\.\d+)?")
KEY = re.compile(rb'"([a-z_]+)": ')
STRING_VALUE = re.compile(rb'(?<=: )"[^"]*"')

SPECIAL_NUMBERS = [b"0", b"-1", b"4.0", b"1e30", b"-0.0", b"-0", b"NaN", b"Infinity", b"-Infinity", b"1e999",
                   b"9" * 5000, b"9" * 21, b"2147483647", b"2147483648", b"1073741824", b"4194305", b"4194304",
                   b"9007199254740993", b"true", b"null", b'"7"', b"[]", b"{}", b"1.5"]
INSERTS = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"{", b"[", b"]", b"}", b'"', b",", b":", b"\\", b"-",
           b"\\ud800", b"\\u0000", b"\n\x1b[31m", b"\xef\xbb\xbf"]
STRINGS = [b'""', b'"' + b"x" * 50_000 + b'"', b'"\\n\\u001b[2J"', b'"\\ud800"', b'"\\udfff\\ud800"',
           b'"\xc3\xa9"', b'"\xe9"', b'"../x"', b'"a\\u0000b"']


@st.composite
def mutated_example(draw) -> bytes:
    raw = bytearray(BASES[draw(st.sampled_from(sorted(BASES)))])
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "number", "deep", "duplicate", "encoding",
                                 "string"]))
    if kind == "truncate":
        del raw[draw(st.integers(0, len(raw) - 1)):]
    elif kind == "flip":
        for _ in range(draw(st.integers(1, 3))):
            raw[draw(st.integers(0, len(raw) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif kind == "insert":
        at = draw(st.integers(0, len(raw)))
        raw[at:at] = draw(st.one_of(st.sampled_from(INSERTS), st.binary(min_size=1, max_size=4)))
    elif kind in ("number", "deep"):
        spots = list(NUMBER.finditer(raw))
        m = spots[draw(st.integers(0, len(spots) - 1))]
        if kind == "number":
            new = draw(st.sampled_from(SPECIAL_NUMBERS))
        else:
            depth = draw(st.sampled_from([1, 3, 15, 16, 17, 1000, 100_000]))
            new = b"[" * depth + m.group() + b"]" * depth
        raw[m.start():m.end()] = new
    elif kind == "duplicate":
        spots = list(KEY.finditer(raw))
        m = spots[draw(st.integers(0, len(spots) - 1))]
        raw[m.start():m.start()] = m.group() + draw(st.sampled_from([b"1", b'"x"', b"null"])) + b", "
    elif kind == "encoding":
        text = raw.decode().replace('"name": "', '"name": "\u00e9\u2028', 1)
        raw = bytearray(text.encode(draw(st.sampled_from(["utf-16", "utf-16-le", "utf-32", "latin-1",
                                                           "utf-8-sig", "utf-8"])), "backslashreplace"))
    else:
        spots = list(STRING_VALUE.finditer(raw))
        m = spots[draw(st.integers(0, len(spots) - 1))]
        raw[m.start():m.end()] = draw(st.sampled_from(STRINGS))
    return bytes(raw)


@FUZZ
@given(raw=mutated_example())
def test_mutated_examples(capsys, scratch, raw):
    try:
        assert_table_check_agrees(parse_scenario_bytes(raw))
    except ScenarioError:
        pass
    scratch.write_bytes(raw)
    assert_no_crash(capsys, scratch, run_steps_limit=100)


@pytest.mark.parametrize("name", sorted(BASES))
def test_unmutated_bases_are_valid(capsys, scratch, name):
    """The mutations start from valid files (so a mutation is what breaks them)."""
    scratch.write_bytes(BASES[name])
    assert assert_no_crash(capsys, scratch, run_steps_limit=100) == 0
