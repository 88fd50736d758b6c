"""The one shrinker: greedy delta debugging of a scenario, parameterised by
its predicate.

`shrink_while(scenario, still_fails, found, last_step=...)` keeps a candidate
only if it is valid (scenario.py `scenario_problem`), smaller in
`scenario_size` order, and `still_fails` still returns a finding for it.  Its
callers supply the predicate:

- `schedspec diff` (reference/campaign.py, through `shrink` below): the two
  implementations still diverge the same way (error vs trace);
- `schedspec counterexample` (proofs/search/counterexample.py): the goal is still
  reached.

Phases, repeated until none helps or the budget runs out:

1. fewer requests: halves, then quarters, ..., then one at a time;
2. fewer steps: aborts dropped, every arrival and abort earlier by the first
   arrival step;
3. smaller numbers, request by request (arrival_step, prompt_len, max_tokens,
   output_len, priority towards 0, prefix group and length, arrival_time to its
   list index), keeping prefix_len and prompt_token_ids consistent with
   prompt_len;
4. aborts earlier;
5. a simpler config (unless `fix_config`): optional fields dropped, sizes
   lowered.

After every kept candidate, max_steps is cut to the finding's last step + 1
(and arrivals at or after it dropped, as a file must).  Last, the ids are
renamed r0, r1, ... in list order if the predicate still holds.  Candidates
are tried in a fixed order, so the result depends on the scenario and the
predicate only, unless the budget ends the shrinking first.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from schedspec.spec.config import CONFIG_TABLE, config_as_given

from .compare import Divergence, compare_traces
from .engine import run_scenario
from .scenario import RequestSpec, Scenario, scenario_problem

F = TypeVar("F")

# Config fields every scenario keeps (the start-up sizes); the others may be dropped.
_KEPT_CONFIG = ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "block_size", "num_gpu_blocks")
# Config sizes lowered, each with its lowest value.
_LOWERED_CONFIG = (("max_model_len", 2), ("num_gpu_blocks", 2), ("max_num_batched_tokens", 1),
                   ("max_num_seqs", 1), ("max_num_scheduled_tokens", 1), ("max_num_active_seqs", 1),
                   ("long_prefill_token_threshold", 1), ("block_size", 1))


@dataclass
class ShrinkStats:
    runs: int = 0  # calls of the predicate
    accepted: int = 0  # candidates kept
    seconds: float = 0.0


def _config_given(s: Scenario) -> dict[str, Any]:
    """The config fields the shrinker counts and may drop: the start-up sizes, and the
    others that differ from their defaults; never the release, which it keeps."""
    given = {**{k: getattr(s.config, k) for k in _KEPT_CONFIG}, **config_as_given(s.config)}
    given.pop("vllm_version", None)
    return given


def scenario_size(s: Scenario) -> tuple:
    """The shrinker's order: requests, then steps, then aborts, then config
    fields, then the sum of the numbers."""
    L = s.config.max_model_len
    given = _config_given(s)
    nums: float = 0
    for i, r in enumerate(s.requests):
        max_tokens = r.max_tokens if r.max_tokens is not None else max(L - r.prompt_len, 1)
        nums += (r.prompt_len + max_tokens + (r.output_len or 0) + abs(r.priority) + r.arrival_step
                 + r.prefix_len + (r.prefix_group is not None))
        # An arrival time other than the list index counts a little, so the default order wins ties.
        nums += min(abs(r.arrival_time - i), 1.0) / 2
    nums += sum(a.step for a in s.aborts)
    nums += sum(v for v in given.values() if isinstance(v, int) and not isinstance(v, bool))
    return (len(s.requests), s.max_steps, len(s.aborts), len(given), nums)


def _smaller(v: int, lo: int) -> list[int]:
    """Candidates below v down to lo, boldest first."""
    out: list[int] = []
    for c in (lo, (lo + v) // 2, v - 1):
        if lo <= c < v and c not in out:
            out.append(c)
    return out


# Request fields made smaller, in the order they are tried.
_REQUEST_FIELDS = ("arrival_step", "prompt_len", "max_tokens", "output_len", "priority", "prefix_group",
                   "prefix_len", "arrival_time")


def _smaller_values(s: Scenario, i: int, field: str) -> list[Any]:
    """Smaller values of request i's `field`, boldest first."""
    r = s.requests[i]
    v = getattr(r, field)
    if field == "arrival_step":  # not before the request listed before it: arrivals stay in list order
        return _smaller(v, s.requests[i - 1].arrival_step if i > 0 else 0)
    if field == "max_tokens" and v is None:  # a bound is smaller than the default, max_model_len - prompt_len
        return [1] + ([r.prompt_len] if r.prompt_len > 1 else [])
    if field == "output_len":
        return [None] + _smaller(v, 1) if v is not None else []
    if field == "priority":  # towards 0
        return _smaller(v, 0) if v >= 0 else [-c for c in _smaller(-v, 0)]
    if field == "prefix_group":
        return [None] if v is not None else []
    if field == "arrival_time":
        return [float(i)] if v != float(i) else []
    return _smaller(v, 0 if field == "prefix_len" else 1)


def _with_field(r: RequestSpec, field: str, value: Any) -> RequestSpec:
    """`r` with one field changed, the prefix fields kept consistent with it."""
    changes: dict[str, Any] = {field: value}
    if field == "prefix_group" and value is None:  # no group, no shared prefix
        changes["prefix_len"] = 0
    if field == "prompt_len":
        changes["prefix_len"] = min(r.prefix_len, value)
        if r.prompt_token_ids is not None:
            changes["prompt_token_ids"] = r.prompt_token_ids[:value]
    return dataclasses.replace(r, **changes)


def _replace_requests(s: Scenario, requests, aborts=None) -> Scenario:
    return dataclasses.replace(s, requests=tuple(requests), aborts=tuple(s.aborts if aborts is None else aborts))


class _Shrinker:
    """One shrink: the smallest scenario kept so far (`best`) and its finding, the
    predicate, and the budget.  Each phase method tries its candidates in a fixed
    order and says whether it kept one."""

    def __init__(self, scenario: Scenario, still_fails: Callable[[Scenario], Any], found: Any,
                 last_step: Callable[[Any], int | None], deadline: float, max_runs: int):
        self.best, self.best_found = scenario, found
        self.still_fails, self.last_step = still_fails, last_step
        self.deadline, self.max_runs = deadline, max_runs
        self.stats = ShrinkStats()

    def in_budget(self) -> bool:
        return time.monotonic() < self.deadline and self.stats.runs < self.max_runs

    def cut(self, s: Scenario, f: Any) -> Scenario:
        step = self.last_step(f)
        if step is not None and s.max_steps > step + 1:
            s = dataclasses.replace(s, max_steps=step + 1)
        # a file with an arrival at or after max_steps does not load (formats.md)
        return s.without_late_arrivals()

    def run(self, s: Scenario) -> Any:
        self.stats.runs += 1
        try:
            return self.still_fails(s)
        except Exception:  # noqa: BLE001 - an implementation crash is not the finding we shrink
            return None

    def attempt(self, s: Scenario) -> bool:
        """Keeps `s` (cut) when it is valid, smaller than the best and still fails."""
        if self.stats.runs >= self.max_runs or time.monotonic() > self.deadline:
            return False
        if not s.requests or scenario_size(s) >= scenario_size(self.best) or scenario_problem(s) is not None:
            return False
        f = self.run(s)
        if f is None:
            return False
        self.best, self.best_found = self.cut(s, f), f
        self.stats.accepted += 1
        return True

    def fewer_requests(self) -> bool:
        """Phase 1: halves of the requests dropped, then quarters, ..., then one at a time."""
        changed = False
        chunk = max(1, len(self.best.requests) // 2)
        while chunk >= 1 and len(self.best.requests) > 1:
            best = self.best
            ids = [r.id for r in best.requests]
            if any(self.attempt(_replace_requests(best, (r for r in best.requests if r.id not in drop),
                                                  (a for a in best.aborts if a.id not in drop)))
                   for drop in (set(ids[i:i + chunk]) for i in range(0, len(ids), chunk)) if len(drop) < len(ids)):
                changed = True
            else:
                chunk //= 2
        return changed

    def fewer_steps(self) -> bool:
        """Phase 2: no aborts, every arrival earlier so the condition comes sooner."""
        changed = False
        for a in list(self.best.aborts):
            changed |= self.attempt(dataclasses.replace(self.best, aborts=tuple(x for x in self.best.aborts if x != a)))
        best = self.best
        shift = min((r.arrival_step for r in best.requests), default=0)
        if shift:
            changed |= self.attempt(_replace_requests(
                best, (dataclasses.replace(r, arrival_step=r.arrival_step - shift) for r in best.requests),
                (dataclasses.replace(a, step=a.step - shift) for a in best.aborts)))
        return changed

    def smaller_numbers(self) -> bool:
        """Phase 3: smaller numbers, request by request (by id: a cut of max_steps may drop late requests)."""
        changed = False
        for rid in [r.id for r in self.best.requests]:
            for field in _REQUEST_FIELDS:
                while True:
                    best = self.best
                    i = next((j for j, r in enumerate(best.requests) if r.id == rid), None)
                    if i is None:
                        break
                    reqs = list(best.requests)
                    if not any(self.attempt(_replace_requests(best, reqs[:i] + [_with_field(reqs[i], field, v)]
                                                              + reqs[i + 1:]))
                               for v in _smaller_values(best, i, field)):
                        break
                    changed = True
        return changed

    def earlier_aborts(self) -> bool:
        """Phase 4: each abort earlier, not before its request's arrival step + 1."""
        changed = False
        for k in range(len(self.best.aborts)):
            best = self.best
            if k >= len(best.aborts):
                break
            ab = best.aborts[k]
            arrival = next(r.arrival_step for r in best.requests if r.id == ab.id)
            aborts = list(best.aborts)
            changed |= any(self.attempt(dataclasses.replace(
                best, aborts=tuple(aborts[:k] + [dataclasses.replace(ab, step=step)] + aborts[k + 1:])))
                for step in _smaller(ab.step, arrival + 1))
        return changed

    def simpler_config(self) -> bool:
        """Phase 5: optional config fields dropped, then sizes lowered."""
        changed = False
        for key in sorted(_config_given(self.best)):
            if key not in _KEPT_CONFIG:  # back to its default
                changed |= self.attempt(dataclasses.replace(
                    self.best, config=dataclasses.replace(self.best.config, **{key: CONFIG_TABLE[key].default})))
        for key, lo in _LOWERED_CONFIG:
            while isinstance(getattr(self.best.config, key), int) and any(
                    self.attempt(dataclasses.replace(self.best, config=dataclasses.replace(self.best.config, **{key: v})))
                    for v in _smaller(getattr(self.best.config, key), lo)):
                changed = True
        return changed

    def rename(self) -> None:
        """Plain ids r0, r1, ... in list order; kept only if the predicate still holds, since
        the priority queue breaks (priority, arrival_time) ties by id."""
        best = self.best
        names = {r.id: f"r{i}" for i, r in enumerate(best.requests)}
        if any(k != v for k, v in names.items()):
            renamed = _replace_requests(best, (dataclasses.replace(r, id=names[r.id]) for r in best.requests),
                                        (dataclasses.replace(a, id=names[a.id]) for a in best.aborts))
            f = self.run(renamed)
            if f is not None:
                self.best, self.best_found = renamed, f


def shrink_while(scenario: Scenario, still_fails: Callable[[Scenario], F | None], found: F, *,
                 last_step: Callable[[F], int | None], fix_config: bool = False, budget_s: float = 20.0,
                 max_runs: int = 4000) -> tuple[Scenario, F, ShrinkStats]:
    """Shrink `scenario` while `still_fails` returns a finding for it.

    `found` is the finding of `scenario` itself; `last_step(finding)` the last
    step the finding needs (None: the whole run), where max_steps is cut.  An
    exception in `still_fails` counts as "no longer fails" (a crash is not the
    finding being shrunk).  Returns the smallest scenario kept, its finding, and
    how many runs it took."""
    t0 = time.monotonic()
    sh = _Shrinker(scenario, still_fails, found, last_step, t0 + budget_s, max_runs)
    sh.attempt(sh.cut(sh.best, sh.best_found))
    changed = True
    while changed and sh.in_budget():
        # Every phase runs, in this order, each from the best the one before left.
        changed = sh.fewer_requests()
        changed |= sh.fewer_steps()
        changed |= sh.smaller_numbers()
        changed |= sh.earlier_aborts()
        if not fix_config:
            changed |= sh.simpler_config()
    sh.rename()
    sh.stats.seconds = time.monotonic() - t0
    return sh.best, sh.best_found, sh.stats


# --- `schedspec diff`: shrink while two implementations diverge ----------------------------


def run_pair(scenario: Scenario, a, b) -> tuple[dict, dict, Divergence | None]:
    ta = run_scenario(scenario, a)
    tb = run_scenario(scenario, b)
    return ta, tb, compare_traces(ta, tb)


def diverges_like(a, b, divergence: Divergence) -> Callable[[Scenario], Divergence | None]:
    """The diff's predicate: `a` and `b` still diverge, the same way (error vs trace)."""

    def diverges(s: Scenario) -> Divergence | None:
        _, _, d = run_pair(s, a, b)
        return d if d is not None and d.kind == divergence.kind else None

    return diverges


def shrink(scenario: Scenario, a, b, divergence: Divergence, *, budget_s: float = 120.0,
           max_runs: int = 3000) -> tuple[Scenario, Divergence]:
    """The smallest scenario found on which `a` and `b` still diverge the same
    way, and that divergence (max_steps cut to the diverging step + 1)."""
    small, d, _ = shrink_while(scenario, diverges_like(a, b, divergence), divergence,
                               last_step=lambda d: d.step, budget_s=budget_s, max_runs=max_runs)
    return small, d
