"""The seed's per-step token-budget chart, drawn from any trace.

One column per step; in it, one block per scheduled request, stacked in the
order the scheduler granted them and as tall as the tokens it got; a dashed
line marks the token budget when it is given.  A request keeps its colour in
every column (colours follow the order in which requests are first scheduled,
cycling through a 20-colour palette).  The legend lists at most
`max_legend` requests and says how many it left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402


def _colours(n: int) -> list:
    cmap = plt.get_cmap("tab20")
    # tab20 pairs a dark and a light shade; take the dark ones first so that
    # neighbouring requests differ in hue, then the light ones.
    order = list(range(0, 20, 2)) + list(range(1, 20, 2))
    return [cmap(order[i % 20]) for i in range(n)]


def plot_budget(trace: dict[str, Any], path: str | Path, token_budget: int | None = None,
                title: str | None = None, max_legend: int = 16) -> Path:
    """Write the chart of `trace` to `path` (PNG, or any format matplotlib
    infers from the suffix); return the path."""
    if trace.get("error") is not None:
        raise ValueError(f"cannot plot an error trace: {trace['error']}")
    steps = trace["steps"]
    ids: list[str] = []
    seen: set[str] = set()
    for st in steps:
        for rid, _ in st["scheduled"]:
            if rid not in seen:
                seen.add(rid)
                ids.append(rid)
    colour = dict(zip(ids, _colours(len(ids))))

    n_steps = max(len(steps), 1)
    width_in = min(max(6.0, 0.35 * n_steps + 2.5), 14.0)
    fig, ax = plt.subplots(figsize=(width_in, 4.8), dpi=110)
    thin = n_steps > 60  # many columns: no gaps or edges, they would drown the colours
    bar_width = 1.0 if thin else 0.8
    # One bar() call per request (not per block): fast on long traces.
    blocks: dict[str, tuple[list, list, list]] = {rid: ([], [], []) for rid in ids}
    labels = []
    peak = 0
    for st in steps:
        bottom = 0
        for rid, n in st["scheduled"]:
            xs, hs, bs = blocks[rid]
            xs.append(st["step"])
            hs.append(n)
            bs.append(bottom)
            if not thin and n >= 3 and len(st["scheduled"]) <= 12:
                labels.append((st["step"], bottom + n / 2, str(n), colour[rid]))
            bottom += n
        peak = max(peak, bottom)
    for rid in ids:
        xs, hs, bs = blocks[rid]
        ax.bar(xs, hs, bottom=bs, width=bar_width, color=colour[rid],
               edgecolor="none" if thin else "white", linewidth=0.0 if thin else 0.6)
    for x, y, text, rgba in labels:
        light = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] > 0.6
        ax.text(x, y, text, ha="center", va="center", fontsize=7,
                color="black" if light else "white")

    handles = [Patch(facecolor=colour[rid], label=rid) for rid in ids[:max_legend]]
    if len(ids) > max_legend:
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label=f"... {len(ids) - max_legend} more"))
    if token_budget is not None:
        ax.axhline(token_budget, color="black", linestyle="--", linewidth=1.2)
        handles.append(plt.Line2D([], [], color="black", linestyle="--",
                                  label=f"token budget {token_budget}"))
        peak = max(peak, token_budget)

    ax.set_xlabel("step")
    ax.set_ylabel("tokens scheduled")
    ax.set_ylim(0, max(peak, 1) * 1.12)
    if steps:
        ax.set_xlim(steps[0]["step"] - 0.6, steps[-1]["step"] + 0.6)
    if n_steps <= 40:
        ax.set_xticks([st["step"] for st in steps])
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(title or f"{trace.get('scenario', '?')} on {trace.get('implementation', '?')}: "
                 "tokens per step")
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  fontsize=8, frameon=False, title="request", title_fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


__all__ = ["plot_budget"]
