"""`schedspec sweep`: a workload x a config grid in one torch batch."""

import dataclasses
import json

import pytest
from schedspec.reference.engine import run_scenario
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.metrics import compute_metrics
from schedspec.reference.scenario import load_scenario

from schedspec.reference.example_files import EXAMPLES_DIR
from schedspec.spec.config import config_as_given

from helpers import assert_one_line_error, cli

GRID = ("--set", "max_num_scheduled_tokens=8,16", "--set", "max_num_seqs=16,64")


def test_sweep_table_plot_and_rejected_point(capsys, tmp_path):
    from PIL import Image

    plot = tmp_path / "sweep.png"
    rc, out, err = cli(capsys, "sweep", "table3-b16", *GRID, "--plot", plot, "--device", "cpu")
    assert rc == 0, err
    lines = out.splitlines()
    assert "4 grid points, 4 scenarios in one torch batch on cpu" in lines[0]
    rows = [l.split() for l in lines if l.strip() and l.split()[0] in ("8", "16")]
    assert [r[:2] for r in rows] == [["8", "16"], ["8", "64"], ["16", "16"], ["16", "64"]]
    # table3-b16 has max_num_batched_tokens 32: max_num_seqs 64 is rejected, with vLLM's reason.
    assert [r[2] for r in rows if r[1] == "64"] == ["rejected", "rejected"]
    assert "rejected max_num_scheduled_tokens=8,max_num_seqs=64: config.max_num_batched_tokens" in out
    assert f"plot written to {plot}" in out
    with Image.open(plot) as im:
        assert im.format == "PNG" and im.size[0] > 400
    # A second sweep may replace our own plot ...
    rc, out, err = cli(capsys, "sweep", "table3-b16", "--set", "max_num_seqs=16", "--plot", plot)
    assert rc == 0, err
    # ... never a file schedspec did not write.
    foreign = tmp_path / "mine.png"
    foreign.write_bytes(b"not ours")
    rc, out, err = cli(capsys, "sweep", "table3-b16", "--set", "max_num_seqs=16", "--plot", foreign)
    assert_one_line_error(rc, err, "not a schedspec plot")
    assert foreign.read_bytes() == b"not ours"


@pytest.mark.parametrize("token_ms", [0.0, 0.5])  # 0.5: step durations depend on the step's tokens
def test_sweep_figures_are_the_specs_metrics(capsys, token_ms):
    """Each row's figures equal reference/metrics.py on the spec's run of the same
    grid point, so the batch neither mixes up grid points nor computes them wrongly."""
    rc, out, err = cli(capsys, "sweep", "group-b", "--set", "max_num_scheduled_tokens=4,16,64",
                       "--set", "policy=fcfs,priority", "--token-ms", token_ms, "--json")
    assert rc == 0, err
    result = json.loads(out)
    base = load_scenario(EXAMPLES_DIR / "group-b.json")
    assert len(result["rows"]) == 6
    distinct, lat_seen = set(), []
    for row in result["rows"]:
        s = dataclasses.replace(base, config={**config_as_given(base.config), **row["config"]})
        trace = run_scenario(s, SpecScheduler())
        if "error" in trace:
            assert row["status"] == "rejected"
            continue
        m = compute_metrics(s, trace, token_ms=token_ms)
        o = m["overall"]
        assert row["status"] == "ok"
        assert row["steps"] == o["steps"] and row["output_tokens"] == o["output_tokens"]
        assert row["throughput_tok_per_step"] == pytest.approx(o["throughput_tok_per_step"])
        for q in ("p50", "p99"):
            assert row[f"ttft_steps_{q}"] == pytest.approx(o[f"ttft_steps_{q}"])
            assert row[f"ttft_ms_{q}"] == pytest.approx(o[f"ttft_ms_{q}"])
        assert row["preemptions"] == o["preemptions"]
        assert row["unfinished"] == len(o["unfinished"])
        done = [r for r in m["requests"].values() if r["finish_reason"] in ("stopped", "length")]
        lat = sorted(r["finish_step"] - r["arrival_step"] + 1 for r in done)
        median = (lat[(len(lat) - 1) // 2] + lat[len(lat) // 2]) / 2 if lat else None
        assert row["latency_steps_p50"] == pytest.approx(median)
        lat_seen.append(median)
        distinct.add((row["steps"], row["throughput_tok_per_step"], row["ttft_ms_p99"]))
    assert len(distinct) > 1, "the grid points should not all behave alike"
    assert any(x is not None for x in lat_seen), "some grid point should finish requests"


def test_sweep_random_workload_pools_the_accepting_workloads(capsys):
    """--seed N --scenarios K: generator scenarios with their own configs; a grid
    point pools the workloads that accept it and counts the others."""
    from schedspec.reference.generator import generate_scenario, scenario_rng

    rc, out, err = cli(capsys, "sweep", "--seed", "7", "--scenarios", "6", "--set", "max_num_seqs=1,8", "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert result["scenarios"] == 12 and result["workloads"] == [f"random-s7-{i}" for i in range(6)]
    partly = 0
    for row in result["rows"]:
        tokens, rejected = 0, 0
        for i in range(6):
            w = generate_scenario(scenario_rng(7, i), i)
            trace = run_scenario(dataclasses.replace(w, config={**config_as_given(w.config), **row["config"]}), SpecScheduler())
            if "error" in trace:
                rejected += 1
            else:
                tokens += sum(r["num_output_tokens"] for r in trace["summary"]["requests"].values())
        assert row["status"] == "ok" and row["rejected_workloads"] == rejected
        assert row["output_tokens"] == tokens
        partly += 0 < rejected
    assert partly, "seed 7 should have a workload that rejects one grid point"
    rc, out, err = cli(capsys, "sweep", "--seed", "7", "--scenarios", "6", "--set", "max_num_seqs=1,8")
    assert "partly rejected max_num_seqs=1" in out


@pytest.mark.parametrize("args, words", [
    (("--set", "max_num_seqs"), ["FIELD=V1,V2"]),
    (("--set", "no_such_field=1,2"), ["no_such_field", "unknown config field"]),
    (("--set", "max_num_seqs=8,x"), ["max_num_seqs", "integer"]),
    (("--set", "max_num_seqs=8,,16"), ["max_num_seqs", "empty value"]),
    (("--set", "max_num_seqs=8", "--set", "max_num_seqs=16"), ["max_num_seqs", "given twice"]),
    (("--set", "enable_chunked_prefill=1"), ["enable_chunked_prefill", "true or false"]),
    ((), ["--set"]),
])
def test_sweep_bad_set_is_one_line_exit_2(capsys, args, words):
    rc, _out, err = cli(capsys, "sweep", "table3-b16", *args)
    assert_one_line_error(rc, err, *words)


def test_sweep_workload_errors(capsys, tmp_path):
    rc, _out, err = cli(capsys, "sweep", "--set", "max_num_seqs=8")
    assert_one_line_error(rc, err, "no workload")
    rc, _out, err = cli(capsys, "sweep", "table3-b16", "--seed", "1", "--set", "max_num_seqs=8")
    assert_one_line_error(rc, err, "not both")
    rc, _out, err = cli(capsys, "sweep", tmp_path / "missing.json", "--set", "max_num_seqs=8")
    assert_one_line_error(rc, err, "missing.json")


def test_sweep_on_the_spec_gives_torch_s_table_whatever_the_workers():
    """`--impl spec` runs the grid one scenario at a time on worker processes:
    the rows are torch's (two implementations agree), and the same at 1 and 2 workers."""
    from schedspec.gpu.sweep import parse_set, run_sweep
    from schedspec.reference.generator import generate_scenario, scenario_rng

    workloads = [generate_scenario(scenario_rng(7, i), i) for i in range(6)]
    axes = parse_set(["max_num_seqs=2,8", "max_num_batched_tokens=32,128"])
    torch_rows = run_sweep(workloads, axes)["rows"]
    one = run_sweep(workloads, axes, impl="spec", workers=1)
    two = run_sweep(workloads, axes, impl="spec", workers=2)
    assert one["rows"] == torch_rows and two["rows"] == torch_rows
    assert any(r["status"] == "ok" and r["output_tokens"] > 0 for r in torch_rows)
    assert two["implementation"] == "spec" and two["workers"] == 2


def test_sweep_flags_say_which_implementation_they_belong_to(capsys):
    for argv, words in ((["sweep", "--seed", "1", "--set", "max_num_seqs=2", "--workers", "2"], "--workers: torch"),
                        (["sweep", "--seed", "1", "--set", "max_num_seqs=2", "--impl", "spec", "--device", "cpu"],
                         "--device is for --impl torch")):
        rc, _, err = cli(capsys, *argv)
        assert_one_line_error(rc, err, words)
