"""Latency, throughput and slot-waste figures from a trace and its scenario.

Works on any `schedspec.trace/1` trace (the spec, vLLM, a baseline from
reference/baselines.py, a user's scheduler).

Time model: step k lasts `step_ms + token_ms * T_k` milliseconds, where T_k is
the number of tokens scheduled in step k (the sum over `scheduled`).  The seed's
worked example uses step_ms = 20, token_ms = 0.  A step the trace does not list
counts as an empty step: engines leave out the idle steps in which the
scheduler held no request (docs/formats.md, Trace), and `steps` is then the
trace's `summary.steps`, which counts them.

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

import bisect
from array import array
from typing import Any, Iterable

from .scenario import Scenario


def percentile(values: list[float], q: float) -> float | None:
    """The `q`-th percentile (0..100) of `values`, linearly interpolated between
    the closest ranks (numpy's default); None for no values."""
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
    return {f"{prefix}_mean": _mean(values), f"{prefix}_p50": percentile(values, 50),
            f"{prefix}_p99": percentile(values, 99)}


class MetricsAccumulator:
    """compute_metrics, one step at a time: a sink for run_scenario
    (reference/trace_io.py's protocol), so that a long run's figures need no
    trace in memory.  What it keeps grows with the requests and their tokens
    (one number per inter-token gap, for the percentiles), not with the
    trace's lists.  `result()` gives compute_metrics' dict.

    Step durations are summed once, in step order; a span of steps is the
    difference of two running totals (exact for whole-millisecond durations,
    such as the default time model)."""

    def __init__(self, scenario: Scenario, step_ms: float = 20.0, token_ms: float = 0.0):
        self.scenario = scenario
        self.step_ms = step_ms
        self.token_ms = token_ms
        self.header: dict[str, Any] = {}
        self.summary: dict[str, Any] | None = None
        self.error: str | None = None
        self._prompt = {r.id: r.prompt_len for r in scenario.requests}
        self._outputs: dict[str, int] = {}  # for rebuilding `sampled`
        self._derived: list[str] = []
        # Listed steps, and the total duration of all steps before each.
        self._listed = array("q")
        self._before = array("d")
        self._durs = array("d")
        self._total = 0.0  # duration of the steps before `_next`
        self._next = 0  # the step after the last one seen
        self._listed_ms = 0.0  # summed durations of the listed steps, in order
        self._tokens: dict[str, list] = {}  # id -> [first step, last step, count, T(last + 1), itl sums]
        self._itl_steps = array("d")
        self._itl_ms = array("d")
        self._preemptions: dict[str, int] = {r.id: 0 for r in scenario.requests}
        self._finish: dict[str, tuple[int, str]] = {}
        self._held = 0
        self._useful = 0
        self._held_ms = 0.0
        self._useful_ms = 0.0

    # -- the sink protocol --
    def begin(self, header: dict[str, Any]) -> None:
        self.header = dict(header)

    def end(self, trace: dict[str, Any]) -> None:
        self.summary = trace.get("summary")
        self.error = trace.get("error")
        for k in ("scenario", "implementation"):
            if k in trace:
                self.header[k] = trace[k]

    def _time_before(self, k: int) -> float:
        """Summed durations of steps 0 .. k-1 (a step the trace does not list lasts step_ms)."""
        i = bisect.bisect_left(self._listed, k)  # listed steps before k
        if i == 0:
            return self.step_ms * k
        last = self._listed[i - 1]
        return self._before[i - 1] + self._durs[i - 1] + self.step_ms * (k - last - 1)

    def step(self, st: dict[str, Any]) -> None:
        k = st["step"]
        scheduled = st["scheduled"]
        tokens = sum(n for _, n in scheduled)
        dur = self.step_ms + self.token_ms * tokens
        if k > self._next:  # steps the trace does not list last step_ms each
            self._total += self.step_ms * (k - self._next)
        self._listed.append(k)
        self._before.append(self._total)
        self._durs.append(dur)
        self._total += dur
        self._next = k + 1
        self._listed_ms += dur

        if "sampled" in st:
            got = st["sampled"]
        else:
            got = self._rebuild_sampled(st)
            if "sampled" not in self._derived:
                self._derived.append("sampled")
        # Speculative decoding: a step may add several tokens (`new_tokens`), else one.
        counts = st.get("new_tokens", {})
        for rid in got:
            self._outputs[rid] = self._outputs.get(rid, 0) + counts.get(rid, 1)
        if "slots_held" in st:
            held = st["slots_held"]
        else:
            held = len(set(st["running"]) | {rid for rid, _ in scheduled})
            if "slots_held" not in self._derived:
                self._derived.append("slots_held")
        useful = len(scheduled)
        self._held += held
        self._useful += useful
        self._held_ms += held * dur
        self._useful_ms += useful * dur

        t_after = self._total  # T(k + 1)
        for rid in got:
            rec = self._tokens.get(rid)
            if rec is None:
                self._tokens[rid] = [k, k, counts.get(rid, 1), t_after, 0, 0.0]
            else:
                gap, gap_ms = k - rec[1], t_after - rec[3]
                self._itl_steps.append(gap)
                self._itl_ms.append(gap_ms)
                rec[1], rec[2], rec[3] = k, rec[2] + counts.get(rid, 1), t_after
                rec[4] += gap
                rec[5] += gap_ms
        for rid in st["preempted"]:
            self._preemptions[rid] = self._preemptions.get(rid, 0) + 1
        for rid, reason in st["finished"]:
            self._finish[rid] = (k, reason)

    def _rebuild_sampled(self, st: dict[str, Any]) -> list[str]:
        """Which ids sampled in this step, replaying formats.md's fake model."""
        ended = {rid for rid, reason in st["finished"] if reason in ("stopped", "length")}
        ncc = st["num_computed_tokens"]
        got = []
        for rid, _ in st["scheduled"]:
            if rid in ended or (rid in ncc and ncc[rid] >= self._prompt.get(rid, 0) + self._outputs.get(rid, 0)):
                got.append(rid)
        return got

    # -- the figures --
    def result(self) -> dict[str, Any]:
        if self.error is not None:
            raise ValueError(f"trace of {self.header.get('implementation', '?')} is an error trace "
                             f"(the scenario was rejected): {self.error}")
        num_listed = len(self._listed)
        num_steps = num_listed
        if isinstance(self.summary, dict) and isinstance(self.summary.get("steps"), int):
            num_steps = max(self.summary["steps"], num_listed)
        step_ms = self.step_ms

        per_request: dict[str, dict[str, Any]] = {}
        all_ttft_steps, all_ttft_ms = [], []
        no_first_token = []
        for r in self.scenario.requests:
            rec = self._tokens.get(r.id)
            m: dict[str, Any] = {
                "arrival_step": r.arrival_step,
                "first_token_step": rec[0] if rec else None,
                "finish_step": self._finish[r.id][0] if r.id in self._finish else None,
                "finish_reason": self._finish[r.id][1] if r.id in self._finish else None,
                "output_tokens": rec[2] if rec else 0,
                "preemptions": self._preemptions.get(r.id, 0),
                "ttft_steps": None, "ttft_ms": None, "itl_steps": None, "itl_ms": None,
            }
            if rec:
                m["ttft_steps"] = rec[0] - r.arrival_step + 1
                m["ttft_ms"] = self._time_before(rec[0] + 1) - self._time_before(r.arrival_step)
                all_ttft_steps.append(m["ttft_steps"])
                all_ttft_ms.append(m["ttft_ms"])
            else:
                no_first_token.append(r.id)
            if rec and rec[2] >= 2:
                m["itl_steps"] = rec[4] / (rec[2] - 1)
                m["itl_ms"] = rec[5] / (rec[2] - 1)
            per_request[r.id] = m

        total_ms = self._listed_ms + (step_ms * (num_steps - num_listed) if num_steps > num_listed else 0)
        output_tokens = sum(m["output_tokens"] for m in per_request.values())
        held_ms, useful_ms = self._held_ms, self._useful_ms
        overall: dict[str, Any] = {
            "steps": num_steps,
            "total_ms": total_ms,
            "output_tokens": output_tokens,
            "throughput_tok_per_step": output_tokens / num_steps if num_steps else None,
            "throughput_tok_per_s": output_tokens / (total_ms / 1000.0) if total_ms > 0 else None,
        }
        overall.update(_stats("ttft_steps", all_ttft_steps))
        overall.update(_stats("ttft_ms", all_ttft_ms))
        overall.update(_stats("itl_steps", self._itl_steps))
        overall.update(_stats("itl_ms", self._itl_ms))
        overall.update({
            "no_first_token": no_first_token,
            "unfinished": [r.id for r in self.scenario.requests if r.id not in self._finish],
            "preemptions": sum(self._preemptions.values()),
            "slot_steps_held": self._held,
            "slot_steps_useful": self._useful,
            "slot_steps_wasted": self._held - self._useful,
            "held_ms": held_ms,
            "useful_ms": useful_ms,
            "wasted_ms": held_ms - useful_ms,
            "waste_fraction": (held_ms - useful_ms) / held_ms if held_ms > 0 else None,
        })
        return {
            "scenario": self.header.get("scenario", self.scenario.name),
            "implementation": self.header.get("implementation"),
            "step_ms": self.step_ms,
            "token_ms": self.token_ms,
            "derived": list(self._derived),
            "overall": overall,
            "requests": per_request,
        }


def compute_metrics(scenario: Scenario, trace: dict[str, Any], step_ms: float = 20.0,
                    token_ms: float = 0.0) -> dict[str, Any]:
    """The figures of the module docstring for `trace`, a run of `scenario`."""
    if trace.get("error") is not None:
        raise ValueError(f"trace of {trace.get('implementation', '?')} is an error trace "
                         f"(the scenario was rejected): {trace['error']}")
    acc = MetricsAccumulator(scenario, step_ms, token_ms)
    acc.begin({k: v for k, v in trace.items() if k in ("scenario", "implementation")})
    for st in trace["steps"]:
        acc.step(st)
    acc.end({k: v for k, v in trace.items() if k != "steps"})
    return acc.result()


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
    from .errors import shown  # ids and names are the user's text: escaped

    m = metrics["overall"]
    time_model = f"{_fmt(metrics['step_ms'])} ms/step"
    if metrics["token_ms"]:
        time_model += f" + {_fmt(metrics['token_ms'], digits=3)} ms/token"
    lines = [
        f"{shown(metrics['scenario'])} on {metrics['implementation']}  ({time_model})",
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
        lines.append(f"  no first token: {', '.join(shown(r, 40) for r in m['no_first_token'])}")
    if m["unfinished"]:
        lines.append(f"  unfinished: {', '.join(shown(r, 40) for r in m['unfinished'])}")
    if metrics["derived"]:
        lines.append(f"  (rebuilt from the trace: {', '.join(metrics['derived'])})")
    reqs = list(metrics["requests"].items())
    rows = [["request", "arrive", "first", "finish", "TTFT st", "TTFT ms", "ITL st", "ITL ms",
             "out", "pre", "reason"]]
    for rid, r in reqs[:max_requests]:
        rows.append([shown(rid, 40), _fmt(r["arrival_step"]), _fmt(r["first_token_step"]), _fmt(r["finish_step"]),
                     _fmt(r["ttft_steps"]), _fmt(r["ttft_ms"]), _fmt(r["itl_steps"], digits=2),
                     _fmt(r["itl_ms"], digits=2), str(r["output_tokens"]), str(r["preemptions"]),
                     r["finish_reason"] or "-"])
    lines += _table(rows)
    if len(reqs) > max_requests:
        lines.append(f"  ... {len(reqs) - max_requests} more requests")
    return "\n".join(lines)


__all__ = ["MetricsAccumulator", "compute_metrics", "format_metrics", "percentile"]
