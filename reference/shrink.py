"""Shrinking a diverging scenario: greedy delta debugging that keeps any
simplification still diverging the same way (fewer requests, then fewer steps,
then smaller numbers)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from .compare import Divergence, compare_traces
from .engine import run_scenario
from .scenario import Abort, RequestSpec, Scenario


def run_pair(scenario: Scenario, a, b) -> tuple[dict, dict, "Divergence | None"]:
    ta = run_scenario(scenario, a)
    tb = run_scenario(scenario, b)
    return ta, tb, compare_traces(ta, tb)


def _valid_structure(s: Scenario) -> bool:
    last = 0
    ids = {}
    for r in s.requests:
        if r.arrival_step < last or r.id in ids or r.prompt_len < 1:
            return False
        if r.max_tokens is not None and r.max_tokens < 1:
            return False
        if r.output_len is not None and r.output_len < 1:
            return False
        if not 0 <= getattr(r, "prefix_len", 0) <= r.prompt_len:
            return False
        last = r.arrival_step
        ids[r.id] = r
    return all(a.id in ids and a.step > ids[a.id].arrival_step for a in s.aborts) and s.max_steps >= 1


def _smaller(v: int, lo: int) -> list[int]:
    out = []
    for c in (lo, (lo + v) // 2, v - 1):
        if lo <= c < v and c not in out:
            out.append(c)
    return out


def shrink(scenario: Scenario, a, b, divergence: Divergence, *, budget_s: float = 120.0,
           max_runs: int = 3000) -> tuple[Scenario, Divergence]:
    """Greedy delta debugging: keep any simplification that still diverges the
    same way (error vs trace), until none helps or the budget runs out."""
    deadline = time.monotonic() + budget_s
    runs = 0
    best, best_div = scenario, divergence

    def diverges(s: Scenario) -> Divergence | None:
        nonlocal runs
        if not _valid_structure(s) or runs >= max_runs or time.monotonic() > deadline:
            return None
        runs += 1
        try:
            _, _, d = run_pair(s, a, b)
        except Exception:  # noqa: BLE001 - a crash is not the divergence we shrink
            return None
        return d if d is not None and d.kind == divergence.kind else None

    def attempt(s: Scenario) -> bool:
        nonlocal best, best_div
        if s == best:
            return False
        d = diverges(s)
        if d is None:
            return False
        best, best_div = s, d
        if d.step is not None and best.max_steps > d.step + 1:
            best = dataclasses.replace(best, max_steps=d.step + 1)
        # a file with an arrival at or after max_steps does not load (formats.md)
        best = best.without_late_arrivals()
        return True

    def without_requests(s: Scenario, drop: set[str]) -> Scenario:
        return dataclasses.replace(
            s, requests=tuple(r for r in s.requests if r.id not in drop),
            aborts=tuple(x for x in s.aborts if x.id not in drop))

    if best_div.step is not None and best.max_steps > best_div.step + 1:
        attempt(dataclasses.replace(best, max_steps=best_div.step + 1))

    changed = True
    while changed and time.monotonic() < deadline and runs < max_runs:
        changed = False
        # 1. drop requests, in chunks, then one by one
        n = len(best.requests)
        chunk = max(1, n // 2)
        while chunk >= 1 and len(best.requests) > 1:
            ids = [r.id for r in best.requests]
            progressed = False
            for i in range(0, len(ids), chunk):
                drop = set(ids[i:i + chunk])
                if len(drop) < len(ids) and attempt(without_requests(best, drop)):
                    changed = progressed = True
                    break
            if not progressed:
                chunk //= 2
        # 2. drop aborts
        for ab in list(best.aborts):
            if ab in best.aborts:
                changed |= attempt(dataclasses.replace(
                    best, aborts=tuple(x for x in best.aborts if x != ab)))
        # 3. simplify requests
        for idx in range(len(best.requests)):
            for make in _request_edits(best, idx):
                while True:
                    cand = make(best)
                    if cand is None or not attempt(cand):
                        break
                    changed = True
        # 4. abort steps earlier
        for k in range(len(best.aborts)):
            ab = best.aborts[k]
            arrival = next(r.arrival_step for r in best.requests if r.id == ab.id)
            for step in _smaller(ab.step, arrival + 1):
                aborts = list(best.aborts)
                aborts[k] = Abort(ab.id, step)
                if attempt(dataclasses.replace(best, aborts=tuple(aborts))):
                    changed = True
                    break
        # 5. simplify the config
        for key in list(best.config):
            if key in ("max_model_len", "num_gpu_blocks", "max_num_batched_tokens", "max_num_seqs", "block_size"):
                continue
            cfg = {k: v for k, v in best.config.items() if k != key}
            changed |= attempt(dataclasses.replace(best, config=cfg))
        for key, lo in (("max_model_len", 2), ("num_gpu_blocks", 2), ("max_num_batched_tokens", 1),
                        ("max_num_seqs", 1), ("max_num_scheduled_tokens", 1), ("max_num_active_seqs", 1),
                        ("long_prefill_token_threshold", 1), ("block_size", 1)):
            while isinstance(best.config.get(key), int):
                for v in _smaller(best.config[key], lo):
                    if attempt(dataclasses.replace(best, config={**best.config, key: v})):
                        changed = True
                        break
                else:
                    break
    return best, best_div


def _request_edits(s: Scenario, idx: int) -> list[Callable[[Scenario], Scenario | None]]:
    """Edits of request `idx` that make it simpler, each returning None when
    there is nothing left to do."""
    rid = s.requests[idx].id

    def edit(field: str, values: Callable[[RequestSpec, Scenario, int], list[Any]]):
        def make(cur: Scenario) -> Scenario | None:
            reqs = list(cur.requests)
            i = next((j for j, r in enumerate(reqs) if r.id == rid), None)
            if i is None:
                return None
            for v in values(reqs[i], cur, i):
                reqs2 = list(reqs)
                changes = {field: v}
                if field == "prefix_group":  # no group, no shared prefix
                    changes["prefix_len"] = 0
                if field == "prompt_len":  # keep the prefix fields consistent with the prompt
                    changes["prefix_len"] = min(getattr(reqs[i], "prefix_len", 0), v)
                    if getattr(reqs[i], "prompt_token_ids", None) is not None:
                        changes["prompt_token_ids"] = reqs[i].prompt_token_ids[:v]
                reqs2[i] = dataclasses.replace(reqs[i], **changes)
                cand = dataclasses.replace(cur, requests=tuple(reqs2))
                if cand != cur:
                    return cand
            return None
        return make

    def ints(attr: str, lo: int):
        def values(r: RequestSpec, cur: Scenario, i: int) -> list[Any]:
            v = getattr(r, attr)
            return _smaller(v, lo)[:1] if isinstance(v, int) else []
        return values

    def halving(attr: str, lo: int):
        def values(r: RequestSpec, cur: Scenario, i: int) -> list[Any]:
            v = getattr(r, attr)
            if not isinstance(v, int) or v <= lo:
                return []
            return [max(lo, v // 2)] if v // 2 >= lo and v // 2 < v else [v - 1]
        return values

    def minus_one(attr: str, lo: int):
        def values(r: RequestSpec, cur: Scenario, i: int) -> list[Any]:
            v = getattr(r, attr)
            return [v - 1] if isinstance(v, int) and v - 1 >= lo else []
        return values

    def earlier_arrival(r: RequestSpec, cur: Scenario, i: int) -> list[Any]:
        # As early as the request listed before it (arrivals stay in list order).
        floor = cur.requests[i - 1].arrival_step if i > 0 else 0
        return [floor] if floor < r.arrival_step else []

    return [
        edit("output_len", lambda r, cur, i: [None] if r.output_len is not None else []),
        edit("priority", lambda r, cur, i: [0] if r.priority else []),
        edit("arrival_time", lambda r, cur, i: [float(i)] if r.arrival_time != float(i) else []),
        edit("prefix_group", lambda r, cur, i: [None] if getattr(r, "prefix_group", None) is not None else []),
        edit("prefix_len", halving("prefix_len", 0)),
        edit("prompt_len", ints("prompt_len", 1)),
        edit("prompt_len", halving("prompt_len", 1)),
        edit("prompt_len", minus_one("prompt_len", 1)),
        edit("max_tokens", ints("max_tokens", 1)),
        edit("max_tokens", halving("max_tokens", 1)),
        edit("max_tokens", minus_one("max_tokens", 1)),
        edit("output_len", halving("output_len", 1)),
        edit("output_len", minus_one("output_len", 1)),
        edit("arrival_step", earlier_arrival),
    ]
