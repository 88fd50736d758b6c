"""The token chart: who got what each step, including who got nothing; large runs binned; our marker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import cli
from schedspec.reference.baselines import run_baseline
from schedspec.reference.engine import run_scenario
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.plot import MAX_GRID_COLS, MAX_GRID_ROWS, PlotData, build_figure, draw, plot_budget
from schedspec.reference.scenario import RequestSpec, Scenario, load_scenario

from schedspec.reference.outputs import PLOT_MARKER, is_schedspec_plot

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "reference" / "examples"


def _example(name):
    sc = load_scenario(EXAMPLES / f"{name}.json")
    return sc, run_scenario(sc, SpecScheduler())


def test_a_request_that_gets_nothing_has_a_row_of_zeros():
    # group-b: the decodes take the whole budget, the prompt gets 0 tokens every step
    sc, trace = _example("group-b")
    g = PlotData.from_trace(trace, sc).grid()
    row = [r.id for r in sc.requests].index("prompt")
    arrival = sc.requests[row].arrival_step
    assert g["row_bin"] == 1 and g["col_bin"] == 1
    assert g["tokens"][row].sum() == 0
    # present (arrived, not finished) and empty in every step from its arrival: drawn pale red
    assert g["present"][row, arrival - g["first"]:].all()
    assert not g["present"][row, :arrival - g["first"]].any()
    # the decodes got their 1 token in every step
    assert (g["tokens"][:row] == 1).all()


def test_without_the_scenario_rows_come_from_the_trace():
    sc, trace = _example("group-b")
    data = PlotData.from_trace(trace)
    assert "prompt" in data.ids  # seen waiting, although never scheduled
    g = data.grid()
    i = data.ids.index("prompt")
    assert g["tokens"][i].sum() == 0 and g["present"][i].sum() == len(trace["steps"]) - 1


def test_the_y_axis_fits_the_steps_not_a_far_budget():
    # static-waste: 4 requests, at most 32 tokens a step, a 2048-token budget
    sc, trace = _example("static-waste")
    fig = build_figure(PlotData.from_trace(trace, sc), token_budget=2048)
    top = fig.axes[0]
    assert top.get_ylim()[1] < 100
    assert any("2048" in t.get_text() for t in top.get_legend().get_texts())
    # a budget near the tallest step is drawn as a line
    sc, trace = _example("table3-b16")
    fig = build_figure(PlotData.from_trace(trace, sc), token_budget=16)
    assert any(line.get_ydata()[0] == 16 for line in fig.axes[0].get_lines())


def test_small_grid_writes_every_number_including_zero():
    sc, trace = _example("group-b")
    fig = build_figure(PlotData.from_trace(trace, sc), token_budget=16)
    texts = [t.get_text() for t in fig.axes[1].texts]
    present = PlotData.from_trace(trace, sc).grid()["present"]
    assert len(texts) == present.sum() and texts.count("0") == len(trace["steps"]) - 1


@pytest.mark.parametrize("suffix", [".png", ".pdf", ".svg"])
def test_written_plots_carry_the_marker(tmp_path, suffix):
    sc, trace = _example("preemption")
    out = plot_budget(trace, tmp_path / f"p{suffix}", token_budget=160, scenario=sc)
    assert out == tmp_path / f"p{suffix}" and is_schedspec_plot(out)
    assert PLOT_MARKER.encode() in out.read_bytes()


def test_a_large_run_is_binned_and_drawn(tmp_path):
    n = 1500
    reqs = tuple(RequestSpec(id=f"r{i}", prompt_len=40 + i % 200, arrival_step=i // 5, max_tokens=30,
                             arrival_time=float(i)) for i in range(n))
    sc = Scenario(name="big", config={"max_num_batched_tokens": 512, "max_num_seqs": 64}, requests=reqs,
                  max_steps=100_000)
    data = PlotData(sc)
    run_scenario(sc, SpecScheduler(), sink=data)
    g = data.grid()
    assert g["tokens"].shape[0] <= MAX_GRID_ROWS and g["tokens"].shape[1] <= MAX_GRID_COLS
    assert g["row_bin"] > 1
    assert g["tokens"].sum() == sum(data.grant_tokens)  # binning loses no token
    assert (g["present"] & (g["tokens"] == 0)).any()  # queues built up: someone waited
    calls = []
    out = draw(data, tmp_path / "big.png", token_budget=512, progress=lambda d, t: calls.append(d))
    assert out.read_bytes()[:4] == b"\x89PNG" and is_schedspec_plot(out)
    assert calls[0] == 0 and calls[-1] == 4


def test_baseline_and_error_traces():
    sc = load_scenario(EXAMPLES / "static-waste.json")
    g = PlotData.from_trace(run_baseline(sc, "static"), sc).grid()
    assert np.array_equal(g["tokens"].sum(axis=1), [8 + 9, 8 + 49, 8 + 199, 8 + 199])
    with pytest.raises(ValueError, match="error trace"):
        plot_budget({"format": "schedspec.trace/1", "error": "no", "steps": []}, "x.png")


def test_run_plot_replaces_only_its_own_plot(tmp_path, capsys):
    out = tmp_path / "p.png"
    rc, stdout, err = cli(capsys, "run", "group-b", "--plot", out)
    assert rc == 0, err
    assert f"plot written to {out}" in stdout
    rc, _, err = cli(capsys, "run", "group-b", "--plot", out)
    assert rc == 0, err
    foreign = tmp_path / "report.png"
    foreign.write_bytes(b"\x89PNG not ours")
    rc, _, err = cli(capsys, "run", "group-b", "--plot", foreign)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "not overwriting" in err
    assert foreign.read_bytes() == b"\x89PNG not ours"
