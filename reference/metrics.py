"""Latency, throughput and slot-waste figures from a trace and its scenario.

Works on any `schedspec.trace/1` trace (the spec, vLLM, a baseline from
reference/baselines.py, a user's scheduler).

Time model: step k lasts `step_ms + token_ms * T_k` milliseconds, where T_k is
the number of tokens scheduled in step k (the sum over `scheduled`).  The seed's
worked example uses step_ms = 20, token_ms = 0.  A step the trace does not list
(there should be none) counts as an empty step.

Per request (`metrics["requests"][id]`):

* `ttft_steps` = first_token_step - arrival_step + 1 (the arrival step counts);
  `ttft_ms` = the summed durations of the steps arrival_step .. first_token_step.
  Both are None for a request that never produced a token.
* `itl_steps` / `itl_ms`: the mean gap between consecutive sampled tokens of the
  request (in steps; in ms, the summed durations of the steps after one token up
  to and including the next, averaged).  None with fewer than two tokens.
* `output_tokens`, `preemptions`, `finish_reason` (None if it never finished),
  `first_token_step`, `finish_step`.

Overall (`metrics["overall"]`):

* `steps`, `total_ms`; `output_tokens`; `throughput_tok_per_step` and
  `throughput_tok_per_s` (output tokens over total steps / total seconds).
* `ttft_*` and `itl_*` (mean, p50, p99; linearly interpolated percentiles, as
  numpy's default): TTFT over the requests that produced a token; ITL over every
  inter-token gap of every request (token-weighted, as vLLM's benchmark does).
  None when there is nothing to average.  `no_first_token` lists the requests
  that never produced a token.
* `preemptions`: preemptions in the trace.
* Slots: `slot_steps_held` = sum of `slots_held`; `slot_steps_useful` = sum of
  len(scheduled) (a slot whose holder received tokens in the step);
  `slot_steps_wasted` = held - useful; `held_ms` / `useful_ms` / `wasted_ms`
  weight each step's slots by its duration; `waste_fraction` = wasted_ms /
  held_ms (None when no slot was held).

Traces without the optional extension fields: `sampled` is rebuilt by replaying
the fake model of formats.md (a scheduled request samples when its
num_computed_tokens after the step reaches prompt_len + its outputs so far, or
when it finishes as "stopped"/"length" in the step); `slots_held` is taken as the
number of requests in `running` after the step or scheduled in it.
`metrics["derived"]` names the fields that were rebuilt.  The top level also
carries `scenario`, `implementation`, `step_ms` and `token_ms`.
"""

from __future__ import annotations

from typing import Any, Iterable

from .scenario import Scenario


def _percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _stats(prefix: str, values: list[float]) -> dict[str, float | None]:
    return {f"{prefix}_mean": _mean(values), f"{prefix}_p50": _percentile(values, 50),
            f"{prefix}_p99": _percentile(values, 99)}


def _rebuild_sampled(scenario: Scenario, steps: list[dict[str, Any]]) -> list[list[str]]:
    """Which ids sampled in each step, replaying formats.md's fake model."""
    prompt = {r.id: r.prompt_len for r in scenario.requests}
    outputs = {r.id: 0 for r in scenario.requests}
    result = []
    for st in steps:
        ended = {rid for rid, reason in st["finished"] if reason in ("stopped", "length")}
        ncc = st["num_computed_tokens"]
        got = []
        for rid, _ in st["scheduled"]:
            if rid in ended or (rid in ncc and ncc[rid] >= prompt.get(rid, 0) + outputs.get(rid, 0)):
                got.append(rid)
                outputs[rid] = outputs.get(rid, 0) + 1
        result.append(got)
    return result


def compute_metrics(scenario: Scenario, trace: dict[str, Any], step_ms: float = 20.0,
                    token_ms: float = 0.0) -> dict[str, Any]:
    """The figures of the module docstring for `trace`, a run of `scenario`."""
    if trace.get("error") is not None:
        raise ValueError(f"trace of {trace.get('implementation', '?')} is an error trace "
                         f"(the scenario was rejected): {trace['error']}")
    steps = trace["steps"]
    derived = []
    if all("sampled" in st for st in steps):
        sampled = [list(st["sampled"]) for st in steps]
    else:
        sampled = _rebuild_sampled(scenario, steps)
        derived.append("sampled")
    if all("slots_held" in st for st in steps):
        held = [st["slots_held"] for st in steps]
    else:
        held = [len(set(st["running"]) | {rid for rid, _ in st["scheduled"]}) for st in steps]
        derived.append("slots_held")

    duration: dict[int, float] = {}
    for st in steps:
        tokens = sum(n for _, n in st["scheduled"])
        duration[st["step"]] = step_ms + token_ms * tokens

    def span_ms(first: int, last: int) -> float:
        """Summed durations of steps first .. last inclusive."""
        return sum(duration.get(k, step_ms) for k in range(first, last + 1))

    token_steps: dict[str, list[int]] = {r.id: [] for r in scenario.requests}
    preemptions: dict[str, int] = {r.id: 0 for r in scenario.requests}
    finish: dict[str, tuple[int, str]] = {}
    for st, got in zip(steps, sampled):
        for rid in got:
            token_steps.setdefault(rid, []).append(st["step"])
        for rid in st["preempted"]:
            preemptions[rid] = preemptions.get(rid, 0) + 1
        for rid, reason in st["finished"]:
            finish[rid] = (st["step"], reason)

    per_request: dict[str, dict[str, Any]] = {}
    all_ttft_steps, all_ttft_ms, all_itl_steps, all_itl_ms = [], [], [], []
    no_first_token = []
    for r in scenario.requests:
        ts = token_steps.get(r.id, [])
        m: dict[str, Any] = {
            "arrival_step": r.arrival_step,
            "first_token_step": ts[0] if ts else None,
            "finish_step": finish[r.id][0] if r.id in finish else None,
            "finish_reason": finish[r.id][1] if r.id in finish else None,
            "output_tokens": len(ts),
            "preemptions": preemptions.get(r.id, 0),
            "ttft_steps": None, "ttft_ms": None, "itl_steps": None, "itl_ms": None,
        }
        if ts:
            m["ttft_steps"] = ts[0] - r.arrival_step + 1
            m["ttft_ms"] = span_ms(r.arrival_step, ts[0])
            all_ttft_steps.append(m["ttft_steps"])
            all_ttft_ms.append(m["ttft_ms"])
        else:
            no_first_token.append(r.id)
        if len(ts) >= 2:
            gaps = [b - a for a, b in zip(ts, ts[1:])]
            gaps_ms = [span_ms(a + 1, b) for a, b in zip(ts, ts[1:])]
            m["itl_steps"] = sum(gaps) / len(gaps)
            m["itl_ms"] = sum(gaps_ms) / len(gaps_ms)
            all_itl_steps += gaps
            all_itl_ms += gaps_ms
        per_request[r.id] = m

    total_ms = sum(duration.values())
    output_tokens = sum(m["output_tokens"] for m in per_request.values())
    useful = [len(st["scheduled"]) for st in steps]
    durs = [duration[st["step"]] for st in steps]
    held_ms = sum(h * d for h, d in zip(held, durs))
    useful_ms = sum(u * d for u, d in zip(useful, durs))

    overall: dict[str, Any] = {
        "steps": len(steps),
        "total_ms": total_ms,
        "output_tokens": output_tokens,
        "throughput_tok_per_step": output_tokens / len(steps) if steps else None,
        "throughput_tok_per_s": output_tokens / (total_ms / 1000.0) if total_ms > 0 else None,
    }
    overall.update(_stats("ttft_steps", all_ttft_steps))
    overall.update(_stats("ttft_ms", all_ttft_ms))
    overall.update(_stats("itl_steps", all_itl_steps))
    overall.update(_stats("itl_ms", all_itl_ms))
    overall.update({
        "no_first_token": no_first_token,
        "unfinished": [r.id for r in scenario.requests if r.id not in finish],
        "preemptions": sum(preemptions.values()),
        "slot_steps_held": sum(held),
        "slot_steps_useful": sum(useful),
        "slot_steps_wasted": sum(held) - sum(useful),
        "held_ms": held_ms,
        "useful_ms": useful_ms,
        "wasted_ms": held_ms - useful_ms,
        "waste_fraction": (held_ms - useful_ms) / held_ms if held_ms > 0 else None,
    })
    return {
        "scenario": trace.get("scenario", scenario.name),
        "implementation": trace.get("implementation"),
        "step_ms": step_ms,
        "token_ms": token_ms,
        "derived": derived,
        "overall": overall,
        "requests": per_request,
    }


def _fmt(x: Any, unit: str = "", digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:.{digits}f}{unit}"
    return f"{int(x)}{unit}" if isinstance(x, (int, float)) else f"{x}{unit}"


def _table(rows: Iterable[list[str]]) -> list[str]:
    rows = list(rows)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip()
            for row in rows]


def format_metrics(metrics: dict[str, Any], max_requests: int = 20) -> str:
    """A readable text block; the per-request table lists at most `max_requests`."""
    m = metrics["overall"]
    time_model = f"{_fmt(metrics['step_ms'])} ms/step"
    if metrics["token_ms"]:
        time_model += f" + {_fmt(metrics['token_ms'], digits=3)} ms/token"
    lines = [
        f"{metrics['scenario']} on {metrics['implementation']}  ({time_model})",
        f"  steps {m['steps']}, {_fmt(m['total_ms'])} ms; output tokens {m['output_tokens']}; "
        f"throughput {_fmt(m['throughput_tok_per_step'], digits=2)} tok/step, "
        f"{_fmt(m['throughput_tok_per_s'], digits=1)} tok/s",
        f"  TTFT steps mean {_fmt(m['ttft_steps_mean'], digits=2)} p50 {_fmt(m['ttft_steps_p50'])} "
        f"p99 {_fmt(m['ttft_steps_p99'])}; ms mean {_fmt(m['ttft_ms_mean'])} "
        f"p50 {_fmt(m['ttft_ms_p50'])} p99 {_fmt(m['ttft_ms_p99'])}",
        f"  ITL  steps mean {_fmt(m['itl_steps_mean'], digits=3)} p50 {_fmt(m['itl_steps_p50'])} "
        f"p99 {_fmt(m['itl_steps_p99'])}; ms mean {_fmt(m['itl_ms_mean'], digits=2)} "
        f"p50 {_fmt(m['itl_ms_p50'])} p99 {_fmt(m['itl_ms_p99'])}",
        f"  preemptions {m['preemptions']}",
        f"  slot-steps held {m['slot_steps_held']}, useful {m['slot_steps_useful']}, "
        f"wasted {m['slot_steps_wasted']}",
        f"  slot time held {_fmt(m['held_ms'])} ms, useful {_fmt(m['useful_ms'])} ms, "
        f"wasted {_fmt(m['wasted_ms'])} ms"
        + (f" = {m['waste_fraction'] * 100:.1f} %" if m["waste_fraction"] is not None else ""),
    ]
    if m["no_first_token"]:
        lines.append(f"  no first token: {', '.join(m['no_first_token'])}")
    if m["unfinished"]:
        lines.append(f"  unfinished: {', '.join(m['unfinished'])}")
    if metrics["derived"]:
        lines.append(f"  (rebuilt from the trace: {', '.join(metrics['derived'])})")
    reqs = list(metrics["requests"].items())
    rows = [["request", "arrive", "first", "finish", "TTFT st", "TTFT ms", "ITL st", "ITL ms",
             "out", "pre", "reason"]]
    for rid, r in reqs[:max_requests]:
        rows.append([rid, _fmt(r["arrival_step"]), _fmt(r["first_token_step"]), _fmt(r["finish_step"]),
                     _fmt(r["ttft_steps"]), _fmt(r["ttft_ms"]), _fmt(r["itl_steps"], digits=2),
                     _fmt(r["itl_ms"], digits=2), str(r["output_tokens"]), str(r["preemptions"]),
                     r["finish_reason"] or "-"])
    lines += _table(rows)
    if len(reqs) > max_requests:
        lines.append(f"  ... {len(reqs) - max_requests} more requests")
    return "\n".join(lines)


__all__ = ["compute_metrics", "format_metrics"]
