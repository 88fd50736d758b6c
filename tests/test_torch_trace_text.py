"""Torch traces as text (gpu/trace_text.py): written byte for byte as
reference/trace_io.py writes the same trace, valid against the trace schema,
equal to the spec's trace, and compared with the spec as text in campaigns
(gpu/campaign.py `compare_with_spec`), with the same divergence report as the
field-by-field comparison where they differ."""

import copy
import dataclasses
import gzip
import importlib
import json
import os
import random
import shutil
import sys
import warnings
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from schedspec.gpu import trace_native
from schedspec.gpu.batch import run_batch_traces
from schedspec.gpu.campaign import TORCH_FLAGS, compare_with_spec
from schedspec.gpu.trace_text import TorchTrace, dumps
from schedspec.reference.compare import compare_runs, compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import generate_scenario, scenario_rng
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import scenario_from_json
from schedspec.reference.trace_io import read_trace, write_trace
from schedspec.spec.config import config_as_given

SCHEMA = json.loads((__import__("pathlib").Path(__import__("schedspec.reference").reference.__file__).parent
                     / "schemas" / "trace.schema.json").read_text())


def _use_renderer(mp, name: str) -> None:
    """Run the trace text through renderer `name` (gpu/trace_native.py): the
    native one (the C extension) must be built wherever a C compiler is on PATH."""
    mp.setenv(trace_native.RENDERER_ENV, name)
    trace_native.reset()
    if name == "native":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # reported below
            here = trace_native.available()
        if not here and any(shutil.which(c) for c in ("cc", "gcc", "clang")):
            pytest.fail(f"the native trace renderer is not built: {trace_native.why_not()}; "
                        f"{trace_native.HOW_TO_BUILD}")
        if not here:
            pytest.skip(f"no native trace renderer here: {trace_native.why_not()}")


@pytest.fixture(scope="module", params=["native", "numpy"])
def renderer(request):
    mp = pytest.MonkeyPatch()
    _use_renderer(mp, request.param)
    yield request.param
    mp.undo()
    trace_native.reset()


@pytest.fixture(scope="module")
def campaign(renderer):
    scenarios = [generate_scenario(scenario_rng(11, i), i, TORCH_FLAGS) for i in range(80)]
    return scenarios, run_batch_traces(scenarios, device="cpu"), [run_scenario(s, SpecScheduler()) for s in scenarios]


def test_written_as_trace_io_writes_it(campaign, tmp_path):
    _scenarios, traces, _spec = campaign
    for i, t in enumerate(traces):
        a, b = tmp_path / f"a{i}.json", tmp_path / f"b{i}.json"
        t.write(a)
        write_trace(t.to_dict(), b)
        assert a.read_bytes() == b.read_bytes()
        jsonschema.validate(json.loads(a.read_text()), SCHEMA)
        assert read_trace(a) == t.to_dict()
    traces[0].write(tmp_path / "z.json.gz")
    assert gzip.open(tmp_path / "z.json.gz").read() == (tmp_path / "a0.json").read_bytes()


def test_text_comparison_agrees_without_parsing(campaign):
    _scenarios, traces, spec = campaign
    for t, s in zip(traces, spec):
        assert compare_traces(s, t.to_dict()) is None
        assert compare_with_spec(t, s, True, "torch", "spec") == (None, False)
        assert compare_with_spec(t, s, False, "spec", "torch") == (None, False)


def _broken(trace):
    t = copy.deepcopy(trace)
    for st in t["steps"][len(t["steps"]) // 2:]:
        st["num_free_blocks"] += 1
    return t


def test_a_difference_gets_the_field_by_field_report(campaign):
    _scenarios, traces, spec = campaign
    checked = 0
    for t, s in zip(traces, spec):
        if not t.num_steps:
            continue
        broken = _broken(t.to_dict())
        # held as text, as run_batch_traces holds it
        bad = TorchTrace(broken["scenario"], "torch", [",\n" + ",\n".join(map(dumps, broken["steps"]))],
                         len(broken["steps"]), broken["summary"])
        assert bad.is_text and bad.to_dict() == broken
        for torch_is_a in (True, False):
            names = ("torch", "spec") if torch_is_a else ("spec", "torch")
            pair = (bad.to_dict(), s) if torch_is_a else (s, bad.to_dict())
            d, parsed = compare_with_spec(bad, s, torch_is_a, *names)
            assert parsed and d is not None and d == compare_runs(*pair, *names)
        checked += 1
    assert checked > 40
    # a summary difference alone is found on the text path
    t, s = next((t, s) for t, s in zip(traces, spec) if t.is_run)
    other = copy.deepcopy(s)
    other["summary"]["steps"] += 1
    d, parsed = compare_with_spec(t, other, True, "torch", "spec")
    assert not parsed and d == compare_runs(t.to_dict(), other, "torch", "spec")


def _scenario(config, requests, max_steps=60, aborts=()):
    return scenario_from_json({"format": "schedspec.scenario/1", "name": "text", "config": config,
                               "requests": requests, "aborts": list(aborts), "max_steps": max_steps})


@pytest.mark.parametrize("flags", TORCH_FLAGS)
def test_odd_ids_large_numbers_and_idle_gaps(flags, renderer):
    """Ids that JSON escapes, numbers past the text tables (a pool of 2**20
    blocks), aborts, and an idle gap between two bursts."""
    pc, asy = flags
    config = {"max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 256, "block_size": 4,
              "num_gpu_blocks": 2**20, "enable_prefix_caching": pc, "async_scheduling": asy}
    ids = ['a"b', "\u00e9t\u00e9", "back\\slash", "tab\tid", "r10", "r2", "\u2603", "x" * 40]
    reqs = [{"id": rid, "prompt_len": 5 + 3 * i, "max_tokens": 6 + i, "arrival_step": 0 if i < 4 else 30 + i,
             "arrival_time": float(i)} for i, rid in enumerate(ids)]
    sc = _scenario(config, reqs, aborts=[{"id": "r10", "step": 36}, {"id": 'a"b', "step": 1}])
    small = dataclasses.replace(sc, config={**config, "num_gpu_blocks": 90}, name="text-small")
    for s in (sc, small):
        spec = run_scenario(s, SpecScheduler())
        t = run_batch_traces([s], device="cpu")[0]
        assert t.is_run and t.num_steps > 20
        assert compare_traces(spec, t.to_dict()) is None
        assert compare_with_spec(t, spec, True, "torch", "spec") == (None, False)


def test_gather_moves_each_piece_in_order():
    """gpu/trace_text.py `_gather` (16-byte words written in order) against a
    plain byte-by-byte join, pieces of 0 to 40 bytes."""
    import numpy as np
    from schedspec.gpu.trace_text import _WORD, _gather

    rng = np.random.default_rng(5)
    raw = rng.integers(33, 127, 5000, dtype=np.uint8).tobytes()
    pool = np.frombuffer(raw + bytes(_WORD), dtype=np.uint8)
    for top in (1, _WORD, 41):
        lens = rng.integers(0, top, 3000)
        offs = rng.integers(0, len(raw) - 41, 3000)
        text, ends = _gather(pool, offs, lens)
        assert text.tobytes() == b"".join(raw[o:o + n] for o, n in zip(offs.tolist(), lens.tolist()))
        assert ends.tolist() == np.cumsum(lens).tolist()


def _decode(n: int, pc: bool, asy: bool) -> list:
    """Steady decode scenarios: 32 requests each (four arriving per step), decoding
    for all 200 steps, so that every step lists 32 grants and 32 computed counts."""
    out = []
    for i in range(n):
        rng = random.Random(f"render/{i}")
        config = {"max_num_batched_tokens": 1024, "max_num_seqs": 64, "max_model_len": 2048, "block_size": 16,
                  "num_gpu_blocks": 8192, "policy": rng.choice(["fcfs", "priority"]),
                  "enable_prefix_caching": pc, "async_scheduling": asy}
        reqs = [{"id": f"r{j}", "prompt_len": rng.randint(16, 256), "max_tokens": 1000, "arrival_step": j // 4,
                 "arrival_time": float(j)} for j in range(32)]
        out.append(dataclasses.replace(_scenario(config, reqs, max_steps=200), name=f"decode-{i}"))
    return out


def _texts(scenarios, mp, name):
    _use_renderer(mp, name)
    return [t.steps_text() for t in run_batch_traces(scenarios, device="cpu")]


def test_native_renderer_writes_the_numpy_renderers_text(monkeypatch):
    """gpu/trace_render.c against gpu/trace_text.py's numpy renderer, byte for
    byte: generator scenarios of the four flag combinations (aborts,
    preemptions, stops, idle steps), decode scenarios of 32 requests, and ids
    JSON escapes with numbers past the numpy renderer's tables."""
    scenarios = [generate_scenario(scenario_rng(17, i), i, TORCH_FLAGS) for i in range(120)]
    scenarios += _decode(3, True, True) + _decode(2, False, False)
    config = {"max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 256, "block_size": 4,
              "num_gpu_blocks": 2**20, "enable_prefix_caching": True, "async_scheduling": True}
    scenarios.append(_scenario(config, [{"id": rid, "prompt_len": 7 + i, "max_tokens": 5, "arrival_time": float(i)}
                                        for i, rid in enumerate(['q"1', "\u00e9", "y" * 30, "s\\t"])],
                               aborts=[{"id": "y" * 30, "step": 2}]))
    native = _texts(scenarios, monkeypatch, "native")
    numpy_ = _texts(scenarios, monkeypatch, "numpy")
    trace_native.reset()
    assert sum(map(len, native)) > 1_000_000
    assert [i for i, (a, b) in enumerate(zip(native, numpy_)) if a != b] == []


def test_renderer_choice(monkeypatch):
    """SCHEDSPEC_TRACE_RENDERER: numpy turns the native renderer off (quietly),
    an unknown value is an error naming the variable, and a missing extension
    leaves the numpy renderer running under auto, with one warning saying how
    much slower and how to build it, and is an error under native."""
    try:
        monkeypatch.setenv(trace_native.RENDERER_ENV, "numpy")
        trace_native.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert not trace_native.available() and "numpy" in trace_native.why_not()
        monkeypatch.setenv(trace_native.RENDERER_ENV, "fast")
        trace_native.reset()
        with pytest.raises(ValueError, match=trace_native.RENDERER_ENV):
            trace_native.available()
        monkeypatch.setitem(sys.modules, trace_native.EXTENSION, None)  # the import fails: not built
        for choice in ("auto", "native"):
            monkeypatch.setenv(trace_native.RENDERER_ENV, choice)
            trace_native.reset()
            if choice == "auto":
                with pytest.warns(RuntimeWarning, match=rf"{trace_native.SLOWDOWN}x slower.*pip install -e \.") as w:
                    assert not trace_native.available() and "not built" in trace_native.why_not()
                    assert not trace_native.available()  # asked again: no second warning
                assert len(w) == 1
            else:
                with pytest.raises(RuntimeError, match="cannot be had.*not built"):
                    trace_native.available()
    finally:
        monkeypatch.undo()
        trace_native.reset()


def test_an_edited_source_warns_that_the_old_build_runs(monkeypatch, tmp_path):
    """trace_render.c newer than the built extension (edited since `pip install
    -e .`): the old build still renders, with a warning to rebuild it."""
    _use_renderer(monkeypatch, "native")
    edited = tmp_path / "trace_render.c"
    edited.write_text("/* edited */")
    built = Path(importlib.import_module(trace_native.EXTENSION).__file__)
    later = built.stat().st_mtime + 60
    os.utime(edited, (later, later))
    monkeypatch.setattr(trace_native, "SOURCE", edited)
    trace_native.reset()
    try:
        with pytest.warns(RuntimeWarning, match="newer than the built.*rebuild"):
            assert trace_native.available()
    finally:
        trace_native.reset()


def test_native_renderer_checks_its_arguments(monkeypatch):
    """The extension's functions check their arguments against the C code's
    types and every array against its shape, format and bounds: a call that
    does not match is a TypeError or ValueError naming the argument."""
    _use_renderer(monkeypatch, "native")
    lib = importlib.import_module(trace_native.EXTENSION)
    T, S, R = 2, 3, 4
    i64 = np.int64
    good = dict(columns=tuple(np.zeros((T, S, R), np.int8) for _ in trace_native.FIELDS[:9]) + (None, None, None),
                scal=np.zeros((T, S, 3), i64), tt=np.array([0, 1], i64), ss=np.array([2, 0], i64),
                abort_rank=np.zeros((S, R), i64), prefix_rows=np.zeros(S, np.uint8),
                async_rows=np.zeros(S, np.uint8), id_pool=np.frombuffer(b'"a"' * (S * R) + bytes(16), np.uint8),
                id_off=3 * np.arange(S * R, dtype=i64), id_len=np.full(S * R, 3, i64), first_step=5,
                codes=(0, 1, 2, 3, 4), out=np.zeros(2 * lib.record_bound(R, 3), np.uint8), ends=np.zeros(2, i64))
    n = lib.render(**good)  # status 0: every slot waiting
    steps = json.loads("[" + bytes(good["out"][2:n]).decode() + "]")
    assert [(x["step"], x["waiting"]) for x in steps] == [(5, ["a"] * R), (6, ["a"] * R)]
    assert good["ends"].tolist() == [n // 2, n]
    bad = [("columns", good["columns"][:-1], "columns"),
           ("columns", (np.zeros((T, S, R + 1), np.int8),) + good["columns"][1:], "grant: dimension 2"),
           ("columns", (np.zeros((T, S, R), np.uint16),) * 12, "grant"),
           ("scal", np.zeros((T, S, 3), np.int32), "scal"),
           ("tt", np.array([0, 2], i64), "tt, ss"),
           ("ss", np.array([0], i64), "ss"),
           ("id_off", 3 * np.arange(S * R, dtype=i64) + 1, "id_off"),
           ("out", np.zeros(10, np.uint8), "out"),
           ("out", np.zeros(2 * lib.record_bound(R, 3), np.uint8)[::-1], "out"),
           ("codes", (0, 1, 2), None),
           ("first_step", "0", None)]
    for name, value, says in bad:
        with pytest.raises((TypeError, ValueError), match=says) as e:
            lib.render(**{**good, name: value})
        assert says is not None or e.type is TypeError
    with pytest.raises(TypeError):
        lib.render(*good.values(), 0)  # one argument too many
    with pytest.raises(TypeError):
        lib.record_bound(R)


def test_batch_written_as_it_runs_equals_each_trace_written(campaign, tmp_path, monkeypatch):
    """write_batch_traces writes each file byte for byte as TorchTrace.write does,
    a rejected scenario's error trace and a gzip name included; with too few file
    descriptors to spare, the scenarios without one keep their text and are
    written as they end, to the same bytes.  Small chunks: the renderer's buffer
    is reused many times in each run."""
    import schedspec.gpu.batch as batch_mod

    monkeypatch.setattr(batch_mod, "_CHUNK_BYTES", 1 << 14)
    scenarios, traces, _spec = campaign
    bad = dataclasses.replace(scenarios[3], config={**config_as_given(scenarios[3].config), "block_size": 0})
    scenarios = scenarios[:3] + [bad] + scenarios[4:]
    for spare in (None, 5):
        if spare is not None:
            monkeypatch.setattr(batch_mod, "_free_descriptors", lambda: spare)
        out = tmp_path / f"spare-{spare}"
        out.mkdir()
        paths = [out / (f"t{i}.json.gz" if i == 7 else f"t{i}.json") for i in range(len(scenarios))]
        got = batch_mod.write_batch_traces(scenarios, paths, device="cpu")
        assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in paths)  # no temporary file left
        for i, (path, (steps, error)) in enumerate(zip(paths, got)):
            want = TorchTrace.from_dict(run_scenario(bad, SpecScheduler()) | {"implementation": "torch"}) \
                if i == 3 else traces[i]
            ref = tmp_path / "ref.json"
            want.write(ref)
            data = gzip.open(path).read() if i == 7 else path.read_bytes()
            assert data == ref.read_bytes(), f"scenario {i} (spare descriptors: {spare})"
            assert (steps, error) == ((0, want.error) if i == 3 else (want.num_steps, None))
        assert got[3][1] and "block_size" in got[3][1]


def test_batch_written_as_it_runs_leaves_nothing_half_written(tmp_path):
    """An exception in the middle of write_batch_traces removes every file not
    finished (a path that held a file keeps it), and a wrong number of paths is
    refused before anything runs."""
    from schedspec.gpu.batch import write_batch_traces

    scenarios = [generate_scenario(scenario_rng(5, i), i) for i in range(12)]
    scenarios = [dataclasses.replace(s, max_steps=40) for s in scenarios]
    paths = [tmp_path / f"t{i}.json" for i in range(len(scenarios))]
    paths[0].write_text("kept")

    def stop(step, total):
        if step == 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_batch_traces(scenarios, paths, device="cpu", progress=stop)
    assert [p.name for p in tmp_path.iterdir()] == ["t0.json"] and paths[0].read_text() == "kept"
    with pytest.raises(ValueError, match="11 paths for 12 scenarios"):
        write_batch_traces(scenarios, paths[:11], device="cpu")
