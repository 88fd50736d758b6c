"""Trace comparison: the first place two traces differ, field by field, step by step.

`compare_traces(a, b)` is the one assertion of every differential check: the
CLI's `diff`, the batched torch campaigns and the catalogue tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# Fields of a trace step in the order a divergence is looked for.
STEP_FIELDS = ("step", "scheduled", "new", "resumed", "preempted", "finished", "running",
               "waiting", "num_computed_tokens", "num_free_blocks")


@dataclass(frozen=True)
class Divergence:
    """The first place two traces differ."""

    field: str  # "error", "steps", a step field (maybe "num_computed_tokens.r3"), or "summary.…"
    a: Any
    b: Any
    step: int | None = None  # the engine step, when the difference is inside a step
    a_name: str = "a"
    b_name: str = "b"

    @property
    def kind(self) -> str:
        return self.field if self.field in ("error", "crash") else "trace"

    def describe(self) -> str:
        where = f"step {self.step}, " if self.step is not None else ""
        return (f"{where}field {self.field}\n"
                f"  {self.a_name}: {json.dumps(self.a)}\n"
                f"  {self.b_name}: {json.dumps(self.b)}")

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "field": self.field, self.a_name: self.a, self.b_name: self.b}


def _first_difference(field: str, x: Any, y: Any) -> tuple[str, Any, Any]:
    """Narrow a differing dict value down to its first differing key."""
    if isinstance(x, dict) and isinstance(y, dict):
        for k in list(x) + [k for k in y if k not in x]:
            if k not in x:
                return f"{field}.{k}", "<absent>", y[k]
            if k not in y:
                return f"{field}.{k}", x[k], "<absent>"
            if x[k] != y[k]:
                return _first_difference(f"{field}.{k}", x[k], y[k])
    return field, x, y


def _ordered_common(x: dict, y: dict, first: tuple[str, ...] = ()) -> list[str]:
    keys = [k for k in first if k in x and k in y]
    keys += sorted(k for k in x if k in y and k not in keys)
    return keys


def compare_traces(a: dict[str, Any], b: dict[str, Any]) -> Divergence | None:
    """The first difference between two traces, comparing every field both
    report, step by step, then the summary; None when they agree.  Two error
    traces agree (messages are not compared); an error trace and a run do not;
    a trace that ends early or runs longer is a divergence."""
    an, bn = a.get("implementation", "a"), b.get("implementation", "b")
    if an == bn:
        an, bn = f"{an} (a)", f"{bn} (b)"
    mk = lambda field, x, y, step=None: Divergence(field, x, y, step, an, bn)  # noqa: E731
    ea, eb = "error" in a, "error" in b
    if ea and eb:
        return None
    if ea or eb:
        return mk("error", a.get("error", "<accepts the scenario>"), b.get("error", "<accepts the scenario>"))
    sa, sb = a.get("steps", []), b.get("steps", [])
    for x, y in zip(sa, sb):
        for k in _ordered_common(x, y, STEP_FIELDS):
            if x[k] != y[k]:
                field, vx, vy = _first_difference(k, x[k], y[k])
                return mk(field, vx, vy, x.get("step"))
    if len(sa) != len(sb):
        at = min(len(sa), len(sb))
        last = (sa or sb)[at - 1].get("step", at - 1) + 1 if at else 0
        return mk("steps", f"{len(sa)} steps", f"{len(sb)} steps", last)
    ma, mb = a.get("summary"), b.get("summary")
    if isinstance(ma, dict) and isinstance(mb, dict):
        for k in _ordered_common(ma, mb, ("steps", "finished", "unfinished", "requests")):
            if ma[k] != mb[k]:
                field, vx, vy = _first_difference(f"summary.{k}", ma[k], mb[k])
                return mk(field, vx, vy)
    elif (ma is None) != (mb is None):
        return mk("summary", ma, mb)
    return None


def compare_runs(a: dict[str, Any], b: dict[str, Any], a_name: str = "a", b_name: str = "b") -> Divergence | None:
    """compare_traces, where a crash trace (reference/campaign.py `crash_trace`)
    on either side is a divergence of field "crash" between `a_name` and `b_name`,
    unless both raised the same exception type in the same engine step: the spec
    models vLLM's own assertions (spec/spec_decode.py), so raising alike agrees."""
    if "crash" in a and "crash" in b and a.get("crash_type") == b.get("crash_type") \
            and a.get("crash_step") is not None and a.get("crash_step") == b.get("crash_step"):
        return None
    if "crash" in a or "crash" in b:
        return Divergence("crash", a.get("crash", "<no crash>"), b.get("crash", "<no crash>"), None, a_name, b_name)
    return compare_traces(a, b)


__all__ = ["STEP_FIELDS", "Divergence", "compare_runs", "compare_traces"]
