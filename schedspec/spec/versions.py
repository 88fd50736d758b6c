"""The vLLM releases the spec models, and every rule that differs between them as a
named version gate.

The spec is written for vLLM 0.33.0 (docs/rules.md).  A rule that an earlier
release applies differently is not a fork of the spec: it is a `Gate` here, named,
with the release that brought 0.33.0's behaviour (`since`) and the vLLM source lines
on both sides, and the rule function asks `has(config, GATE)`.  A config models one
release (`SchedulerConfig.vllm_version`, default 0.33.0); `has` is true when that
release is `since` or later.  Config fields a release lacks are in `FIELDS_SINCE`
(spec/config.py `validate_config` refuses them).

Adding a release: add it to RELEASES, run `schedspec diff --impl vllm==X`, and for
each rule change its campaign finds add one Gate (and a scenario that shows it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# Oldest first.  Only releases whose real scheduler the differential tester has run
# against the spec are listed (README, "vLLM releases").
RELEASES = ("0.20.0", "0.25.0", "0.28.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")
DEFAULT_RELEASE = "0.33.0"


@lru_cache(maxsize=64)  # asked on every rule that has a gate: parse each release once
def release_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


@dataclass(frozen=True)
class Gate:
    """A rule as 0.33.0 applies it, in force from release `since` on."""

    name: str
    since: str  # the first release (of RELEASES) with 0.33.0's rule
    rule: str  # what 0.33.0 does, and what the releases before `since` do instead
    source: str  # the vLLM source lines, 0.33.0's and the older release's


GATES: dict[str, Gate] = {}


def _gate(name: str, since: str, rule: str, source: str) -> str:
    assert since in RELEASES and name not in GATES
    GATES[name] = Gate(name, since, rule, source)
    return name


def version_of(config_or_version: Any) -> str:
    return config_or_version if isinstance(config_or_version, str) else config_or_version.vllm_version


def has(config_or_version: Any, gate: str) -> bool:
    """Does the modelled release apply 0.33.0's rule `gate`?"""
    return release_key(version_of(config_or_version)) >= release_key(GATES[gate].since)


def gates_between(a: str, b: str) -> list[Gate]:
    """The gates whose rule differs between releases `a` and `b`."""
    lo, hi = sorted((release_key(a), release_key(b)))
    return [g for g in GATES.values() if lo < release_key(g.since) <= hi]


# Config fields that do not exist before a release: field -> (release, the value
# that means what the older releases do, the source).
FIELDS_SINCE: dict[str, tuple[str, Any, str]] = {
    "max_num_active_seqs": ("0.31.0", None, "C:69; absent from 0.30.0 config/scheduler.py"),
    "watermark": ("0.25.0", 0.0, "C:196; absent from 0.20.0 config/scheduler.py"),
}


# --- the gates, oldest rule change last -------------------------------------------------

PRIORITY_SELF_PREEMPTION_CONTINUES = _gate(
    "priority_self_preemption_continues", "0.33.0",
    "Under PRIORITY, a running request that preempted itself (it was the lowest priority) "
    "lets the running loop go on to the requests after it; before 0.33.0 the loop ended "
    "there, as it does under FCFS (docs/rules.md §3.8).",
    "0.33.0 S:982-994 (`continue` when PRIORITY and request.status == PREEMPTED); "
    "0.32.0 scheduler.py:846-848 (`if new_blocks is None: break`)")


def fields_lacking(version: str) -> frozenset[str]:
    """The config fields release `version` does not have."""
    return frozenset(f for f, (since, _, _) in FIELDS_SINCE.items() if release_key(version) < release_key(since))


def field_minimum(version: str, field: str, minimum: int) -> int | None:
    """The least value release `version` accepts for integer config field `field`
    (None: any integer), 0.33.0's being `minimum` (spec/config.py INT_FIELDS)."""
    steps = MINIMUM_SINCE.get(field)
    if steps is None:
        return minimum
    found = None
    for since, bound in steps:
        if release_key(version) >= release_key(since):
            found = bound
    return found


# Integer fields whose lower bound changed: field -> ((release, the bound from that
# release on), ...), oldest first; before the first release there is no bound.
MINIMUM_SINCE: dict[str, tuple[tuple[str, int], ...]] = {
    # 0.20.0 config/scheduler.py:56 `max_num_scheduled_tokens: int | None = None` (no bound);
    # 0.25.0 :56 and 0.31.0 :56 `ge=0` (0 is a token budget of 0: nothing is ever
    # scheduled, 0.31.0 scheduler.py:582); 0.32.0 :55 and 0.33.0 C:55 `ge=1`.
    "max_num_scheduled_tokens": (("0.25.0", 0), ("0.32.0", 1)),
    # 0.20.0 config/scheduler.py:80 `long_prefill_token_threshold: int = 0` (no bound; a
    # negative threshold never caps, as 0 does not); 0.25.0 :80 `ge=0`, as C:79.
    "long_prefill_token_threshold": (("0.25.0", 0),),
}

# Config checks between fields that a release added: name -> (release, source).
CHECKS_SINCE: dict[str, tuple[str, str]] = {
    # 0.20.0 and 0.25.0 check it only with max_num_partial_prefills > 1 (0.25.0
    # config/scheduler.py verify_max_model_len), which schedspec never sets.
    "long_prefill_token_threshold_at_most_max_model_len": (
        "0.28.0", "0.33.0 C:355-360; 0.28.0 config/scheduler.py verify_max_model_len"),
}


def checks(config_or_version: Any, check: str) -> bool:
    return release_key(version_of(config_or_version)) >= release_key(CHECKS_SINCE[check][0])

LONG_PREFILL_THRESHOLD_NEEDS_TWO = _gate(
    "long_prefill_threshold_needs_two", "0.31.0",
    "The long-prefill threshold caps a grant only while more than one request is eligible "
    "(running + waiting > 1), counted at the start of the step (docs/rules.md §2.3); before "
    "0.31.0 it caps every grant, a lone request's too.",
    "0.33.0 S:757-763; 0.31.0 scheduler.py:611-620; 0.30.0 scheduler.py:661-662 (running loop) "
    "and :1066-1068 (waiting loop), `self.scheduler_config.long_prefill_token_threshold` unconditionally")

INPUT_BUDGET = _gate(
    "input_budget", "0.28.0",
    "Each step has two budgets, the token budget (max_num_scheduled_tokens) and the input "
    "budget (max_num_batched_tokens), and a grant takes from both (docs/rules.md §2.2); before "
    "0.28.0 there is only the token budget, so with max_num_scheduled_tokens above "
    "max_num_batched_tokens a step schedules more than max_num_batched_tokens tokens.",
    "0.33.0 S:719-722; 0.28.0 scheduler.py:496-499; 0.25.0 scheduler.py:416 (`token_budget` only)")

UNHASHED_FREE_BLOCKS_FIRST = _gate(
    "unhashed_free_blocks_first", "0.25.0",
    "Prefix caching: a freed block without a hash goes to the front of the free queue (reused "
    "first), a hashed one to the back (LRU) (docs/rules.md §6.5); in 0.20.0 every freed block "
    "goes to the back, in freeing order, so a hashed block can be evicted before an unhashed "
    "one freed later.",
    "0.33.0 P:816-849; 0.25.0 v1/core/block_pool.py:614-635 (prepend_n / append_n); 0.20.0 "
    "v1/core/block_pool.py:408-422 (append_n of every freed block)")
