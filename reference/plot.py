"""Who got how many tokens in each step: the seed's token-budget chart, from any trace.

Two panels share the step axis.

* Top, tokens per step.  Small runs: one column per step, one block per
  scheduled request, stacked in grant order and as tall as its tokens, each
  request in its own colour.  Larger runs: the step's total as a filled curve
  (per column of the grid below when steps are binned: the largest total and
  the mean).  The y-axis fits the tallest step; the token budget is a dashed
  line when it is near that height, and a note otherwise, so that a run of
  4-token steps under a 2 048-token budget is not drawn as a flat line.
* Bottom, the grant grid: one row per request (scenario order), one column per
  step.  A cell is coloured by the tokens the request got (log scale, so a
  1-token decode is as visible as an 800-token prefill), pale red when the
  request had arrived and not finished but got nothing (waiting, preempted, or
  running and left out), and white when it was not there (not arrived yet, or
  finished).  Small grids write the number in every cell, 0 included.  Large
  runs bin requests and steps (each cell then sums the tokens of a block of
  requests over a block of steps; pale red means none of them got any), so
  drawing costs the same for 20 000 requests as for 20.

`PlotData` collects what the chart needs while a run streams (a sink for
reference/engine.py's run_scenario): three integers per grant and two per
request, never the trace's lists.  `plot_budget(trace, path)` draws a trace
dict; `draw(data, path)` draws collected data.  Written files carry
schedspec's marker in their metadata (reference/outputs.py), by which a later
run recognises a plot it may replace.
"""

from __future__ import annotations

import math
from array import array
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LinearSegmentedColormap, LogNorm, to_rgba  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

# Above these the top panel draws a curve instead of one block per grant, and
# the grid bins requests and steps.
MAX_BAR_GRANTS = 4000
MAX_BAR_STEPS = 400
MAX_GRID_ROWS = 600
MAX_GRID_COLS = 1600
# Up to these, every cell of the grid carries its number.
MAX_TEXT_ROWS = 40
MAX_TEXT_COLS = 80

NOTHING = "#f4a6a6"  # arrived, not finished, got no token
ABSENT = "#ffffff"
TOKENS_CMAP = LinearSegmentedColormap.from_list("schedspec_tokens", ["#9ecae1", "#4292c6", "#08306b"])


def _colours(n: int) -> list:
    cmap = plt.get_cmap("tab20")
    # tab20 pairs a dark and a light shade; take the dark ones first so that
    # neighbouring requests differ in hue, then the light ones.
    order = list(range(0, 20, 2)) + list(range(1, 20, 2))
    return [cmap(order[i % 20]) for i in range(n)]


class PlotData:
    """What the chart needs from a run, kept compactly; a trace sink
    (begin(header), step(record), end(trace)).

    With the scenario, rows follow its request order and a request is present
    from its arrival_step; without it, from the first step it appears in
    (scheduled, running, waiting or finished), in order of appearance."""

    def __init__(self, scenario=None):
        self.header: dict[str, Any] = {}
        self.error: str | None = None
        self.ids: list[str] = []
        self._index: dict[str, int] = {}
        self.arrival = array("q")
        self.finish = array("q")  # -1: never finished
        self.grant_step = array("q")
        self.grant_req = array("q")
        self.grant_tokens = array("q")
        self.listed = array("q")  # the steps the trace lists
        self.num_steps = 0
        self._scan = scenario is None
        if scenario is not None:
            for r in scenario.requests:
                self._add(r.id, r.arrival_step)

    def _add(self, rid: str, arrival: int) -> int:
        i = self._index.get(rid)
        if i is None:
            i = self._index[rid] = len(self.ids)
            self.ids.append(rid)
            self.arrival.append(arrival)
            self.finish.append(-1)
        return i

    def begin(self, header: dict[str, Any]) -> None:
        self.header = dict(header)

    def step(self, st: dict[str, Any]) -> None:
        k = st["step"]
        self.listed.append(k)
        for rid, n in st["scheduled"]:
            self.grant_step.append(k)
            self.grant_req.append(self._add(rid, k))
            self.grant_tokens.append(n)
        if self._scan:
            for rid in st["running"]:
                self._add(rid, k)
            for rid in st["waiting"]:
                self._add(rid, k)
        for rid, _ in st["finished"]:
            self.finish[self._add(rid, k)] = k
        self.num_steps = max(self.num_steps, k + 1)

    def end(self, trace: dict[str, Any]) -> None:
        self.error = trace.get("error")
        for key in ("scenario", "implementation"):
            if key in trace:
                self.header[key] = trace[key]
        summary = trace.get("summary")
        if isinstance(summary, dict) and isinstance(summary.get("steps"), int):
            self.num_steps = max(self.num_steps, summary["steps"])

    @classmethod
    def from_trace(cls, trace: dict[str, Any], scenario=None) -> PlotData:
        data = cls(scenario)
        data.begin(trace)
        for st in trace.get("steps", ()):
            data.step(st)
        data.end(trace)
        return data

    def grid(self) -> dict[str, Any]:
        """The bottom panel's cells: `tokens` and `present` (rows x cols),
        with the binning used (`row_bin` requests, `col_bin` steps per cell)
        and the first step shown."""
        listed = np.frombuffer(self.listed, dtype=np.int64) if len(self.listed) else np.zeros(0, np.int64)
        first = int(listed[0]) if len(listed) else 0
        last = int(listed[-1]) if len(listed) else 0
        span = last - first + 1
        n = max(len(self.ids), 1)
        row_bin = max(1, math.ceil(n / MAX_GRID_ROWS))
        col_bin = max(1, math.ceil(span / MAX_GRID_COLS))
        rows, cols = math.ceil(n / row_bin), math.ceil(span / col_bin)
        tokens = np.zeros(rows * cols, dtype=np.int64)
        if len(self.grant_step):
            gs = np.frombuffer(self.grant_step, dtype=np.int64)
            gr = np.frombuffer(self.grant_req, dtype=np.int64)
            gt = np.frombuffer(self.grant_tokens, dtype=np.int64)
            cell = (gr // row_bin) * cols + (gs - first) // col_bin
            tokens = np.bincount(cell, weights=gt, minlength=rows * cols).astype(np.int64)
        tokens = tokens.reshape(rows, cols)
        # Presence as intervals [arrival, finish or last step]: a request is held
        # by the scheduler in every step between, so no per-step lists are needed.
        diff = np.zeros((rows, cols + 1), dtype=np.int64)
        if self.ids:
            arr = np.frombuffer(self.arrival, dtype=np.int64)
            fin = np.frombuffer(self.finish, dtype=np.int64)
            end = np.where(fin >= 0, fin, last)
            start = np.maximum(arr, first)
            ok = (start <= end) & (start <= last)
            r = np.arange(len(self.ids))[ok] // row_bin
            c0 = (start[ok] - first) // col_bin
            c1 = (np.minimum(end[ok], last) - first) // col_bin + 1
            np.add.at(diff, (r, c0), 1)
            np.add.at(diff, (r, c1), -1)
        present = np.cumsum(diff, axis=1)[:, :cols] > 0
        return {"tokens": tokens, "present": present | (tokens > 0), "row_bin": row_bin,
                "col_bin": col_bin, "first": first, "last": last}

    def step_totals(self) -> tuple[np.ndarray, np.ndarray]:
        """(listed steps, tokens scheduled in each)."""
        listed = np.frombuffer(self.listed, dtype=np.int64) if len(self.listed) else np.zeros(0, np.int64)
        if not len(self.grant_step):
            return listed, np.zeros(len(listed), dtype=np.int64)
        pos = np.searchsorted(listed, np.frombuffer(self.grant_step, dtype=np.int64))
        totals = np.bincount(pos, weights=np.frombuffer(self.grant_tokens, dtype=np.int64),
                             minlength=len(listed)).astype(np.int64)
        return listed, totals


def _text_colour(rgba) -> str:
    light = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] > 0.6
    return "black" if light else "white"


def _draw_bars(ax, data: PlotData, max_legend: int) -> tuple[int, list]:
    """One block per grant; returns the tallest step and the legend handles."""
    order: list[int] = []
    seen: set[int] = set()
    for i in data.grant_req:
        if i not in seen:
            seen.add(i)
            order.append(i)
    colour = dict(zip(order, _colours(len(order))))
    blocks: dict[int, tuple[list, list, list]] = {i: ([], [], []) for i in order}
    labels = []
    n_steps = len(data.listed)
    thin = n_steps > 60  # many columns: no gaps or edges, they would drown the colours
    per_step: dict[int, int] = {}
    counts: dict[int, int] = {}
    for k in data.grant_step:
        counts[k] = counts.get(k, 0) + 1
    for k, i, n in zip(data.grant_step, data.grant_req, data.grant_tokens):
        bottom = per_step.get(k, 0)
        xs, hs, bs = blocks[i]
        xs.append(k)
        hs.append(n)
        bs.append(bottom)
        per_step[k] = bottom + n
        if not thin and counts[k] <= 12:
            labels.append((k, bottom, n, colour[i]))
    peak = max(per_step.values(), default=0)
    for i in order:  # one bar() call per request, not per block
        xs, hs, bs = blocks[i]
        ax.bar(xs, hs, bottom=bs, width=1.0 if thin else 0.8, color=colour[i],
               edgecolor="none" if thin else "white", linewidth=0.0 if thin else 0.6)
    for x, bottom, n, rgba in labels:
        if n >= 0.06 * max(peak, 1):  # the grid below gives every number; label what fits
            ax.text(x, bottom + n / 2, str(n), ha="center", va="center", fontsize=7, color=_text_colour(rgba))
    handles = [Patch(facecolor=colour[i], label=data.ids[i]) for i in order[:max_legend]]
    if len(order) > max_legend:
        handles.append(Patch(facecolor="none", edgecolor="none", label=f"... {len(order) - max_legend} more"))
    return peak, handles


def _draw_curve(ax, data: PlotData, col_bin: int, first: int) -> int:
    steps, totals = data.step_totals()
    if not len(steps):
        return 0
    if col_bin == 1:
        ax.fill_between(steps, totals, step="mid", color="#4292c6", alpha=0.8, linewidth=0)
        return int(totals.max())
    col = (steps - first) // col_bin
    cols = int(col.max()) + 1
    peak = np.zeros(cols, dtype=np.int64)
    np.maximum.at(peak, col, totals)
    mean = np.bincount(col, weights=totals, minlength=cols) / np.maximum(np.bincount(col, minlength=cols), 1)
    x = first + (np.arange(cols) + 0.5) * col_bin - 0.5
    ax.fill_between(x, peak, step="mid", color="#9ecae1", linewidth=0, label=f"largest step per {col_bin} steps")
    ax.plot(x, mean, drawstyle="steps-mid", color="#08306b", linewidth=0.8, label="mean of those steps")
    return int(peak.max())


def _draw_grid(ax, data: PlotData, g: dict[str, Any]):
    tokens, present = g["tokens"], g["present"]
    rows, cols = tokens.shape
    rb, cb, first = g["row_bin"], g["col_bin"], g["first"]
    top = max(int(tokens.max()), 1) if tokens.size else 1
    norm = LogNorm(vmin=1, vmax=max(top, 2))
    img = np.empty((rows, cols, 4))
    img[:] = to_rgba(ABSENT)
    img[present & (tokens == 0)] = to_rgba(NOTHING)
    got = tokens > 0
    img[got] = TOKENS_CMAP(norm(tokens[got]))
    x0, x1 = first - 0.5, first + cols * cb - 0.5
    ax.imshow(img, aspect="auto", interpolation="nearest", extent=(x0, x1, rows - 0.5, -0.5))
    if rb == 1 and cb == 1 and rows <= MAX_TEXT_ROWS and cols <= MAX_TEXT_COLS:
        for r, c in zip(*np.nonzero(present)):
            ax.text(first + c, r, str(tokens[r, c]), ha="center", va="center", fontsize=6.5,
                    color=_text_colour(img[r, c]) if tokens[r, c] else "#7a1f1f")
        ax.set_xticks(np.arange(first, first + cols + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(rows + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="#dddddd", linewidth=0.5)
        ax.tick_params(which="minor", length=0)
    if rb == 1 and rows <= 60:
        ax.set_yticks(range(rows))
        ax.set_yticklabels(data.ids, fontsize=7 if rows <= 30 else 5)
        ax.set_ylabel("request")
    else:
        ticks = ax.get_yticks()
        ax.set_yticks([t for t in ticks if 0 <= t < rows])
        ax.set_yticklabels([str(int(t) * rb) for t in ticks if 0 <= t < rows])
        ax.set_ylabel(f"request (scenario order){f', {rb} per row' if rb > 1 else ''}")
    return norm


def build_figure(data: PlotData, token_budget: int | None = None, title: str | None = None,
                 max_legend: int = 16, progress: Callable[[int, int], None] | None = None):
    """The matplotlib figure of the chart (two axes: tokens per step, the grant grid)."""
    if data.error is not None:
        raise ValueError(f"cannot plot an error trace: {data.error}")
    tick = progress or (lambda done, total: None)
    tick(0, 4)
    g = data.grid()
    rows, cols = g["tokens"].shape
    bars = (len(data.grant_step) <= MAX_BAR_GRANTS and g["last"] - g["first"] < MAX_BAR_STEPS
            and g["col_bin"] == 1)
    text = g["row_bin"] == 1 and g["col_bin"] == 1 and rows <= MAX_TEXT_ROWS and cols <= MAX_TEXT_COLS
    tick(1, 4)

    width = min(max(7.0, 0.3 * cols + 3.5), 16.0) if text else (12.0 if cols > 60 else 9.0)
    grid_h = min(max(1.6, (0.24 if text else 0.12) * rows + 0.8), 8.0)
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(width, 3.2 + grid_h), dpi=110,
                                      gridspec_kw={"height_ratios": [3.0, grid_h]})
    if bars:
        peak, handles = _draw_bars(top, data, max_legend)
    else:
        peak, handles = _draw_curve(top, data, g["col_bin"], g["first"]), []
    if token_budget is not None:
        if token_budget <= 1.5 * max(peak, 1):
            top.axhline(token_budget, color="black", linestyle="--", linewidth=1.2)
            handles.append(plt.Line2D([], [], color="black", linestyle="--", label=f"token budget {token_budget}"))
            peak = max(peak, token_budget)
        else:
            handles.append(Patch(facecolor="none", edgecolor="none",
                                 label=f"token budget {token_budget}\n(far above: not drawn)"))
    top.set_ylim(0, max(peak, 1) * 1.12)
    top.set_ylabel("tokens scheduled")
    top.grid(axis="y", alpha=0.3)
    top.set_axisbelow(True)
    top.set_title(title or f"{data.header.get('scenario', '?')} on {data.header.get('implementation', '?')}: "
                  "tokens per step")
    if not bars and g["col_bin"] > 1:
        handles = top.get_legend_handles_labels()[0] + handles
    if handles:
        top.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
                   frameon=False, title="request" if bars else None, title_fontsize=8,
                   ncol=1 if len(handles) <= 10 else 2)
    tick(2, 4)

    norm = _draw_grid(bottom, data, g)
    bottom.set_xlabel("step" if g["col_bin"] == 1 else f"step ({g['col_bin']} steps per column)")
    bottom.set_xlim(g["first"] - 0.6, g["first"] + cols * g["col_bin"] - 0.4)
    if text and cols <= 40:
        bottom.set_xticks(range(g["first"], g["first"] + cols))
    # The colour bar sits in an inset, so that both panels keep the same width
    # and their step columns line up.
    cax = bottom.inset_axes([1.01, 0.0, 0.015, 1.0])
    sm = plt.cm.ScalarMappable(norm=norm, cmap=TOKENS_CMAP)
    cbar = fig.colorbar(sm, cax=cax)
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
                         100000, 200000, 500000, 1000000) if t <= norm.vmax]
    cbar.set_ticks(ticks)
    cbar.set_ticklabels([str(t) for t in ticks])
    cbar.minorticks_off()
    cbar.set_label("tokens" + (" per cell" if g["row_bin"] > 1 or g["col_bin"] > 1 else ""), fontsize=8)
    cbar.ax.tick_params(labelsize=7)
    bottom.legend(handles=[Patch(facecolor=NOTHING, label="arrived, got 0 tokens\n(waiting, preempted\nor left out)"),
                           Patch(facecolor=ABSENT, edgecolor="#999999", label="not arrived yet,\nor finished")],
                  loc="upper left", bbox_to_anchor=(1.10, 1.0), fontsize=7, frameon=False)
    if g["row_bin"] > 1 or g["col_bin"] > 1:
        rb, cb = g["row_bin"], g["col_bin"]
        bottom.set_title(f"tokens per request and step (each cell: {rb} request{'s' if rb > 1 else ''} x "
                         f"{cb} step{'s' if cb > 1 else ''})", fontsize=9)
    else:
        bottom.set_title("tokens per request and step", fontsize=9)
    tick(3, 4)
    return fig


def draw(data: PlotData, path: str | Path, token_budget: int | None = None, title: str | None = None,
         max_legend: int = 16, progress: Callable[[int, int], None] | None = None) -> Path:
    """Write the chart of `data` to `path` under exactly that name; the format
    follows the suffix (.png, .pdf, .svg; PNG without one).  `progress(done, 4)`
    is called as the drawing goes."""
    tick = progress or (lambda done, total: None)
    fig = build_figure(data, token_budget, title, max_legend, progress)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fmt = out.suffix.lower().lstrip(".") or "png"
    kwargs: dict[str, Any] = {"format": fmt}
    try:
        from .outputs import PLOT_FORMATS, plot_metadata

        if fmt in PLOT_FORMATS:
            kwargs["metadata"] = plot_metadata(fmt)
    except ImportError:  # an older checkout without outputs.py: an unmarked plot
        pass
    fig.savefig(out, bbox_inches="tight", **kwargs)
    plt.close(fig)
    tick(4, 4)
    return out


def plot_budget(trace: dict[str, Any], path: str | Path, token_budget: int | None = None,
                title: str | None = None, max_legend: int = 16, scenario=None,
                progress: Callable[[int, int], None] | None = None) -> Path:
    """Write the chart of `trace` to `path`; return the path.  With `scenario`,
    rows follow its request order, and requests that never appear in the
    trace still get a row."""
    if trace.get("error") is not None:
        raise ValueError(f"cannot plot an error trace: {trace['error']}")
    return draw(PlotData.from_trace(trace, scenario), path, token_budget, title, max_legend, progress)


__all__ = ["PlotData", "build_figure", "draw", "plot_budget"]
