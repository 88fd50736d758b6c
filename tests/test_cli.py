"""The command line as a user meets it: outputs, exit codes, one-line errors."""

import json
import subprocess
import sys

import jsonschema
import pytest

from schedspec.reference.example_files import EXAMPLES_DIR
from schedspec.reference.scenario import SCHEMA_DIR


def schedspec(*args, cwd=None):
    p = subprocess.run([sys.executable, "-m", "schedspec", *map(str, args)], capture_output=True, text=True,
                       cwd=cwd, timeout=300)
    return p.returncode, p.stdout, p.stderr


def assert_one_line_error(rc, out, err, *words):
    assert rc == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err


def test_run_table3_b8_prompt_starves():
    rc, out, err = schedspec("run", "table3-b8")
    assert rc == 0, err
    steps = [l for l in out.splitlines() if l.startswith("step")]
    assert steps and all("prompt:" not in l for l in steps)
    assert all("d8:" not in l and "d9:" not in l for l in steps)  # 2 of the 10 decodes get none


def test_run_table3_b16_prompt_gets_six():
    rc, out, err = schedspec("run", EXAMPLES_DIR / "table3-b16.json")
    assert rc == 0, err
    assert sum(1 for l in out.splitlines() if " prompt:6" in l) == 4


def test_static_waste_is_42_5_percent(tmp_path):
    rc, out, err = schedspec("run", "static-waste", "--policy-baseline", "static")
    assert rc == 0, err
    assert "6800" in out and "16000" in out and "42.5" in out


def test_examples_command():
    rc, out, err = schedspec("examples")
    assert rc == 0, err
    assert "table3-b8" in out and "42.5 %" in out


def test_check_reports_every_property():
    from schedspec.spec.properties import PROPERTIES

    rc, out, err = schedspec("check", "preemption")
    assert rc == 0, err
    for name in PROPERTIES:
        assert name in out
    assert "0 violated" in out


def test_trace_out_and_plot(tmp_path):
    trace, plot = tmp_path / "t.trace.json", tmp_path / "p.png"
    rc, out, err = schedspec("run", "preemption", "--trace-out", trace, "--plot", plot)
    assert rc == 0, err
    data = json.loads(trace.read_text())
    jsonschema.validate(data, json.loads((SCHEMA_DIR / "trace.schema.json").read_text()))
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_trace_out_never_overwrites_an_input_or_a_foreign_file(tmp_path):
    scenario = tmp_path / "s.json"
    scenario.write_text((EXAMPLES_DIR / "group-a.json").read_text())
    before = scenario.read_text()
    assert_one_line_error(*schedspec("run", scenario, "--trace-out", scenario), "input")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert_one_line_error(*schedspec("run", scenario, "--trace-out", notes), "not overwriting")
    assert scenario.read_text() == before and notes.read_text() == "mine"


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d["config"].update(max_num_batched_tokens=8), ["max_num_batched_tokens", "max_num_seqs"]),
    (lambda d: d["config"].update(watermark=1.0), ["watermark"]),
    (lambda d: d["config"].update(policy="lifo"), ["policy"]),
    (lambda d: d["config"].update(num_gpu_blocks=2), ["num_gpu_blocks"]),
    (lambda d: d["config"].update(max_num_active_seqs=99), ["max_num_active_seqs"]),
    (lambda d: d["config"].update(long_prefill_token_threshold=9000), ["long_prefill_token_threshold"]),
    (lambda d: d["config"].update(enable_chunked_prefill=False, max_model_len=4096), ["max_model_len"]),
    (lambda d: d["requests"][0].update(prompt_len=8192), ["prompt_len", "max_model_len"]),
    (lambda d: d["requests"][0].update(prompt_len="ten"), ["prompt_len"]),
    (lambda d: d["requests"][1].update(id="d0"), ["duplicate"]),
    (lambda d: d.update(aborts=[{"id": "nobody", "step": 3}]), ["nobody"]),
    (lambda d: d["config"].update(max_num_seqs=0), ["max_num_seqs"]),
])
@pytest.mark.parametrize("command", ["validate", "run", "check"])
def test_invalid_scenarios_one_line_exit_2(tmp_path, mutate, words, command):
    data = json.loads((EXAMPLES_DIR / "group-a.json").read_text())
    mutate(data)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(data))
    assert_one_line_error(*schedspec(command, f), *words)


def test_malformed_json_and_missing_file(tmp_path):
    f = tmp_path / "broken.json"
    f.write_text("{ not json")
    assert_one_line_error(*schedspec("validate", f), "not valid JSON")
    assert_one_line_error(*schedspec("run", tmp_path / "missing.json"), "cannot read")


def test_unknown_impl_is_a_usage_error():
    assert_one_line_error(*schedspec("run", "group-a", "--impl", "nosuch"), "nosuch")
