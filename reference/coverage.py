"""Coverage of a differential campaign: which scheduler situations the agreeing
traces exercised (preemptions, resumptions, aborts by queue, finish reasons)."""

from __future__ import annotations

from .scenario import Scenario


def add_coverage(scenario: Scenario, trace: dict, cov: dict[str, int]) -> None:
    if "error" in trace:
        cov["rejected scenarios"] = cov.get("rejected scenarios", 0) + 1
        return
    L = scenario.config.get("max_model_len", 8192)
    specs = {r.id: r for r in scenario.requests}
    preempted_waiting: set[str] = set()
    prev_running: list[str] = []

    def bump(key: str, n: int = 1) -> None:
        cov[key] = cov.get(key, 0) + n

    for st in trace["steps"]:
        for rid, reason in st["finished"]:
            if reason == "aborted":
                if rid in prev_running:
                    bump("aborts of running requests")
                elif rid in preempted_waiting:
                    bump("aborts of preempted requests")
                else:
                    bump("aborts of waiting requests")
        if st["preempted"]:
            bump("steps with preemption")
            bump("preemptions", len(st["preempted"]))
            if any(rid in st["preempted"] for rid, _ in st["scheduled"]):
                bump("preempted and rescheduled in one step")
        preempted_waiting |= set(st["preempted"])
        preempted_waiting -= set(st["resumed"])
        if st["resumed"]:
            bump("resumptions", len(st["resumed"]))
        prev_running = st["running"]
    for rid, s in trace["summary"]["requests"].items():
        reason = s["finish_reason"]
        if reason == "length":
            r = specs[rid]
            if r.prompt_len + s["num_output_tokens"] >= L and (r.max_tokens is None or s["num_output_tokens"] < r.max_tokens):
                bump("finished: max_model_len")
            else:
                bump("finished: max_tokens")
        elif reason:
            bump(f"finished: {reason}")
        else:
            bump("unfinished at max_steps")
