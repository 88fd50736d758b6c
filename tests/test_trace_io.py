"""Trace files: the streamed layout, gzip, header-only reads, and the run command's outputs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import jsonschema
import pytest
from helpers import cli
from schedspec.reference.baselines import run_baseline
from schedspec.reference.engine import run_scenario
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.metrics import MetricsAccumulator, compute_metrics
from schedspec.reference.scenario import load_scenario
from schedspec.reference.trace_io import HEADER_BYTES, Tee, TraceWriter, read_trace, read_trace_header, write_trace

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "reference" / "examples"
TRACE_SCHEMA = json.loads((ROOT / "reference" / "schemas" / "trace.schema.json").read_text())


def _trace(name: str = "preemption") -> dict:
    return run_scenario(load_scenario(EXAMPLES / f"{name}.json"), SpecScheduler())


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_round_trip(tmp_path, suffix):
    trace = _trace()
    path = write_trace(trace, tmp_path / f"t{suffix}")
    assert read_trace(path) == trace
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == (suffix == ".json.gz")
    if suffix == ".json.gz":
        assert len(raw) < len(json.dumps(trace)) / 3  # compressed for real


def test_streamed_layout_is_the_same_document_as_json_dump(tmp_path):
    trace = _trace("group-b")
    path = write_trace(trace, tmp_path / "t.json")
    text = path.read_text()
    assert json.loads(text) == json.loads(json.dumps(trace, indent=1))
    lines = text.splitlines()
    # header first (format its first key), then one step per line
    assert lines[0].startswith('{"format": "schedspec.trace/1"')
    assert lines[1] == '"steps": ['
    step_lines = lines[2:2 + len(trace["steps"])]
    assert [json.loads(line.rstrip(",")) for line in step_lines] == trace["steps"]
    jsonschema.validate(json.loads(text), TRACE_SCHEMA)


def test_writer_as_a_sink_keeps_no_steps_and_writes_them_all(tmp_path):
    sc = load_scenario(EXAMPLES / "preemption.json")
    full = run_scenario(sc, SpecScheduler())
    acc = MetricsAccumulator(sc)
    with TraceWriter(tmp_path / "t.json.gz") as w:
        streamed = run_scenario(sc, SpecScheduler(), sink=Tee(w, acc))
    assert streamed["steps"] == [] and streamed["summary"] == full["summary"]
    assert read_trace(tmp_path / "t.json.gz") == full
    assert acc.result() == compute_metrics(sc, full)


def test_baseline_streams_the_same_trace(tmp_path):
    sc = load_scenario(EXAMPLES / "static-waste.json")
    with TraceWriter(tmp_path / "b.json") as w:
        run_baseline(sc, "static", sink=w)
    assert read_trace(tmp_path / "b.json") == run_baseline(sc, "static")


def test_a_failed_run_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "t.json"
    write_trace(_trace(), path)
    before = path.read_bytes()
    with pytest.raises(RuntimeError):
        with TraceWriter(path) as w:
            w.begin({"format": "schedspec.trace/1", "scenario": "x", "implementation": "y"})
            w.step({"step": 0})
            raise RuntimeError("the run broke")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_error_trace_round_trip(tmp_path):
    trace = {"format": "schedspec.trace/1", "scenario": "s", "implementation": "spec",
             "error": "config.max_num_seqs: must be at least 1", "steps": []}
    path = write_trace(trace, tmp_path / "e.json")
    assert read_trace(path) == trace
    assert read_trace_header(path)["error"] == trace["error"]


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_header_reads_only_the_start(tmp_path, suffix):
    path = write_trace(_trace(), tmp_path / f"t{suffix}")
    assert read_trace_header(path) == {"format": "schedspec.trace/1", "scenario": "preemption",
                                       "implementation": "spec"}
    # A huge file that is not a trace: the header read stops after HEADER_BYTES.
    junk = tmp_path / f"junk{suffix}"
    body = b'{"format": "other", "x": "' + b"a" * (50 * HEADER_BYTES) + b'"}'
    junk.write_bytes(gzip.compress(body) if suffix == ".json.gz" else body)
    assert read_trace_header(junk) == {"format": "other"}
    (tmp_path / "empty").write_bytes(b"")
    assert read_trace_header(tmp_path / "empty") == {}


def test_read_trace_refuses_what_is_not_a_trace(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"format": "schedspec.scenario/1"}))
    with pytest.raises(ValueError):
        read_trace(p)


# --- the run command ------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_run_trace_out_writes_the_engine_trace(tmp_path, capsys, suffix):
    out = tmp_path / f"t{suffix}"
    rc, _, err = cli(capsys, "run", "group-b", "--trace-out", out)
    assert rc == 0, err
    assert read_trace(out) == _trace("group-b")
    # a second run may replace its own earlier output, compressed or not
    rc, _, err = cli(capsys, "run", "group-b", "--trace-out", out)
    assert rc == 0, err


def test_run_prints_the_same_timeline_and_metrics_as_from_the_whole_trace(capsys):
    from schedspec.reference.metrics import format_metrics

    from schedspec.cli.main import format_step

    sc = load_scenario(EXAMPLES / "static-waste.json")
    trace = run_scenario(sc, SpecScheduler())
    rc, out, err = cli(capsys, "run", "static-waste", "--timeline", "all")
    assert rc == 0, err
    lines = out.splitlines()
    assert [format_step(st) for st in trace["steps"]] == lines[2:2 + len(trace["steps"])]
    assert format_metrics(compute_metrics(sc, trace)) in out
    rc, out, err = cli(capsys, "run", "static-waste")
    assert "... 140 more steps (--timeline all shows them)" in out


def test_rejected_scenario_writes_no_trace(tmp_path, capsys):
    data = json.loads((EXAMPLES / "group-a.json").read_text())
    data["config"]["max_num_batched_tokens"] = 8
    sc = tmp_path / "bad.json"
    sc.write_text(json.dumps(data))
    out = tmp_path / "t.json.gz"
    rc, _, err = cli(capsys, "run", sc, "--trace-out", out)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


class NoDrafts:
    """The spec behind the protocol, without update_draft_token_ids."""

    name = "no-drafts"

    def __init__(self):
        from schedspec.reference.impl import SpecScheduler

        self.inner = SpecScheduler()
        for method in ("reset", "add_request", "finish_requests", "schedule", "update_from_output", "observe"):
            setattr(self, method, getattr(self.inner, method))


def test_a_refused_run_writes_one_header(tmp_path):
    """tests/regressions/engine-drafts-refused-one-header.json: the refusal comes
    before the trace file is begun, so the file holds the error trace once."""
    from schedspec.reference.engine import run_scenario
    from schedspec.reference.scenario import load_scenario
    from schedspec.reference.trace_io import TraceWriter, read_trace

    scenario = load_scenario(Path(__file__).parent / "regressions" / "engine-drafts-refused-one-header.json")
    path = tmp_path / "t.trace.json"
    with TraceWriter(path) as sink:
        trace = run_scenario(scenario, NoDrafts(), sink=sink)
    assert "update_draft_token_ids" in trace["error"]
    back = read_trace(path)
    assert back["error"] == trace["error"] and back["steps"] == []
