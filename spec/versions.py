"""The vLLM releases the spec models, and every rule that differs between them as a
named version gate.

The spec is written for the newest modelled release, DEFAULT_RELEASE (docs/rules.md
cites its source lines).  A rule that changed at some release X is not a fork of the
spec: it is a `Gate` here, named, with X (`since`), what the rule is from X on and what
it was before, and the vLLM source lines on both sides; the rule function asks
`has(config, GATE)`, true when the config's release is X or later.  No release is
special: a gate at the newest release reads as one at any other.  A config models one
release (`SchedulerConfig.vllm_version`, default DEFAULT_RELEASE).  Config fields a
release lacks are in `FIELDS_SINCE` (spec/config.py `validate_config` refuses them);
features schedspec models only from some release on are in `FEATURES_SINCE`.

Adding a release: docs/releases.md (`schedspec keep-up X` reports which gates to add).
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

# Oldest first.  Only releases whose real scheduler the differential tester has run
# against the spec are listed (docs/vllm-releases.md).
RELEASES = ("0.20.0", "0.25.0", "0.28.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
DEFAULT_RELEASE = RELEASES[-1]  # the newest: what a config that names no release models


@lru_cache(maxsize=64)  # asked on every rule that has a gate: parse each release once
def release_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


@dataclass(frozen=True)
class Gate:
    """A rule that changed at release `since`: in force from `since` on."""

    name: str
    since: str  # the first release (of RELEASES) with the rule as stated
    rule: str  # what the releases from `since` on do, and what those before it did instead
    source: str  # the vLLM source lines: `since`'s (or the newest release's) and the release before


GATES: dict[str, Gate] = {}


def _gate(name: str, since: str, rule: str, source: str) -> str:
    assert since in RELEASES and name not in GATES
    GATES[name] = Gate(name, since, rule, source)
    return name


def version_of(config_or_version: Any) -> str:
    return config_or_version if isinstance(config_or_version, str) else config_or_version.vllm_version


def has(config_or_version: Any, gate: str) -> bool:
    """Does the modelled release apply rule `gate` as changed at its release?"""
    return release_key(version_of(config_or_version)) >= release_key(GATES[gate].since)


_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(.*)$")


def spec_release_for(version: str) -> str | None:
    """The modelled release a vLLM `version` is compared with: itself when modelled, else
    the newest modelled release at or below it (a pre-release or a development build of
    X.Y.Z, e.g. `0.35.0rc1` or `0.34.1.dev12+gabc`, is below X.Y.Z; a post-release or a
    local build of a release is at it); None when it is older than every one, or not a
    version."""
    if version in RELEASES:
        return version
    m = _VERSION.match(version or "")
    if not m:
        return None
    base = tuple(int(x) for x in m.group(1, 2, 3))
    suffix = m.group(4).lstrip(".-_").lower()
    pre = suffix.startswith(("a", "b", "c", "rc", "dev", "pre", "preview"))
    found = None
    for r in RELEASES:
        if release_key(r) < base or (release_key(r) == base and not pre):
            found = r
    return found


@contextmanager
def reverted(*names: str):
    """Within: the rules of gates `names` as the releases before theirs apply them, at
    every release.  A maintainer's tool (reference/changes.py): which of the gates of one
    release makes a difference on a scenario."""
    saved = {n: GATES[n] for n in names}
    try:
        for n in names:
            GATES[n] = replace(GATES[n], since=NEVER)
        yield
    finally:
        GATES.update(saved)


NEVER = "999999.0.0"  # a release after every one: a gate reverted is in force from it


def gates_between(a: str, b: str) -> list[Gate]:
    """The gates whose rule differs between releases `a` and `b`."""
    lo, hi = sorted((release_key(a), release_key(b)))
    return [g for g in GATES.values() if lo < release_key(g.since) <= hi]


# Config fields that do not exist before a release: field -> (release, the value
# that means what the older releases do, the source).
FIELDS_SINCE: dict[str, tuple[str, Any, str]] = {
    "cache_aware_admission_window": ("0.34.0", 0, "C:223; absent from 0.33.0 config/scheduler.py"),
    "cache_aware_admission_threshold": ("0.34.0", 0.5, "C:237; absent from 0.33.0 config/scheduler.py"),
    "max_num_active_seqs": ("0.31.0", None, "C:68; absent from 0.30.0 config/scheduler.py"),
    "watermark": ("0.25.0", 0.0, "C:208; absent from 0.20.0 config/scheduler.py"),
}


# Features schedspec models only from a release on: a config or request of an older
# release that asks for one is refused (spec/config.py, spec/input_processor.py), the
# generator draws it only there, and the proofs encode it only there.  The release is
# the oldest whose real scheduler the differential tests ran the feature against.
SPEC_DECODE = "speculative decoding"
LORA = "LoRA"
ADAPTIVE_THRESHOLD = "the adaptive long-prefill threshold"
PREFILL_THROTTLE = "prefill throttling"
HASH_LOOKAHEAD = "lookahead block hashes"
KV_CONNECTOR = "KV connectors"
STRUCTURED_OUTPUT = "structured output"
ENCODER_INPUTS = "encoder inputs"
FEATURES_SINCE: dict[str, str] = {
    SPEC_DECODE: "0.33.0", LORA: "0.33.0", ADAPTIVE_THRESHOLD: "0.33.0", PREFILL_THROTTLE: "0.33.0",
    HASH_LOOKAHEAD: "0.33.0", KV_CONNECTOR: "0.33.0", STRUCTURED_OUTPUT: "0.33.0", ENCODER_INPUTS: "0.33.0",
}


def models(config_or_version: Any, feature: str) -> bool:
    """Does schedspec model `feature` (FEATURES_SINCE) for the config's release?"""
    return release_key(version_of(config_or_version)) >= release_key(FEATURES_SINCE[feature])


def not_modelled(config_or_version: Any, feature: str) -> str:
    """The one-line reason a config of this release may not ask for `feature`."""
    return (f"schedspec models {feature} for vLLM {FEATURES_SINCE[feature]} and later, not "
            f"{version_of(config_or_version)}")


# --- the gates, newest rule change first -------------------------------------------------

LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL = _gate(
    "long_prefill_threshold_needs_chunked_prefill", "0.34.0",
    "The long-prefill threshold caps a grant only with chunked prefill on (docs/rules.md §2.3); "
    "before 0.34.0 it capped one with chunked prefill off too, so a long prompt was cut to the "
    "threshold.  From 0.34.0 an unchunked prompt longer than the step's budget is never "
    "scheduled (proofs/LIVENESS.md).",
    "S:775-779 (`if self.scheduler_config.enable_chunked_prefill and num_eligible_reqs > 1`); "
    "0.33.0 scheduler.py:759-763 (`if num_eligible_reqs > 1`)")

RESUMED_SENT_AS_NEW = _gate(
    "resumed_sent_as_new", "0.34.0",
    "A preempted request, when admitted again, is sent to the model runner in full among the "
    "new requests (`scheduled_new_reqs`): its blocks and worker state were dropped at "
    "preemption; no request is sent as resumed (docs/rules.md §4.6, docs/formats.md).  Before "
    "0.34.0 (the V1 model runner) it was sent among `scheduled_resumed_reqs`.",
    "S:1619-1626; O:139-147 (CachedRequestData without resumed_req_ids); 0.33.0 "
    "scheduler.py:1555-1562 (`scheduled_resumed_reqs.append(request)` for PREEMPTED)")

MM_CHUNK_INSIDE_ITEM_WAITS = _gate(
    "mm_chunk_inside_item_waits", "0.34.0",
    "Encoder inputs with disable_chunked_mm_input: a chunk that starts inside an item (after a "
    "prefix hit that ends inside it) and cannot cover the rest of it schedules nothing "
    "(docs/rules.md §20); before 0.34.0 the rule only looked at items the chunk starts at or "
    "before, so such a chunk went on to the encoder budget checks.",
    "S:2144-2158; 0.33.0 scheduler.py:2098-2110 (`and num_computed_tokens <= start_pos`)")

ENCODER_NEVER_SPLITS_UNCHUNKED_PROMPT = _gate(
    "encoder_never_splits_unchunked_prompt", "0.34.0",
    "Encoder inputs with chunked prefill off: when the encoder budget or cache would cut an "
    "admission's chunk short of the whole prompt, the request is skipped this step and the "
    "encoder cache references its plan took are released (docs/rules.md §20); before 0.34.0 "
    "the cut chunk was scheduled, chunked prefill or not.",
    "S:1444-1455; absent from 0.33.0 scheduler.py (after :1386)")

PRIORITY_SELF_PREEMPTION_CONTINUES = _gate(
    "priority_self_preemption_continues", "0.33.0",
    "Under PRIORITY, a running request that preempted itself (it was the lowest priority) "
    "lets the running loop go on to the requests after it; before 0.33.0 the loop ended "
    "there, as it does under FCFS (docs/rules.md §3.8).",
    "S:998-1010 (`continue` when PRIORITY and request.status == PREEMPTED); "
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
    # scheduled, 0.31.0 scheduler.py:582); 0.32.0 :55 and C:54 `ge=1`.
    "max_num_scheduled_tokens": (("0.25.0", 0), ("0.32.0", 1)),
    # 0.20.0 config/scheduler.py:80 `long_prefill_token_threshold: int = 0` (no bound; a
    # negative threshold never caps, as 0 does not); 0.25.0 :80 `ge=0`, as C:90.
    "long_prefill_token_threshold": (("0.25.0", 0),),
}

# Config checks between fields that a release added: name -> (release, source).
CHECKS_SINCE: dict[str, tuple[str, str]] = {
    # 0.34.0 dropped parallel drafting (P-EAGLE's K - 1 rows, PARD's K): a drafter adds 0
    # rows, or 1 for a draft model, to the target batch.
    "drafter_rows_at_most_one": (
        "0.34.0", "0.34.0 config/speculative.py:1743-1751 (the speculator's rows) and :1688-1698 "
        "(parallel_drafting deprecated); 0.33.0 config/speculative.py:2058-2098 (K - 1 or K when parallel)"),
    # 0.20.0 and 0.25.0 check it only with max_num_partial_prefills > 1 (0.25.0
    # config/scheduler.py verify_max_model_len), which schedspec never sets.
    "long_prefill_token_threshold_at_most_max_model_len": (
        "0.28.0", "C:399-404; 0.28.0 config/scheduler.py verify_max_model_len"),
}


def checks(config_or_version: Any, check: str) -> bool:
    return release_key(version_of(config_or_version)) >= release_key(CHECKS_SINCE[check][0])

LONG_PREFILL_THRESHOLD_NEEDS_TWO = _gate(
    "long_prefill_threshold_needs_two", "0.31.0",
    "The long-prefill threshold caps a grant only while more than one request is eligible "
    "(running + waiting > 1), counted at the start of the step (docs/rules.md §2.3); before "
    "0.31.0 it caps every grant, a lone request's too.",
    "S:773-779; 0.31.0 scheduler.py:611-620; 0.30.0 scheduler.py:661-662 (running loop) "
    "and :1066-1068 (waiting loop), `self.scheduler_config.long_prefill_token_threshold` unconditionally")

INPUT_BUDGET = _gate(
    "input_budget", "0.28.0",
    "Each step has two budgets, the token budget (max_num_scheduled_tokens) and the input "
    "budget (max_num_batched_tokens), and a grant takes from both (docs/rules.md §2.2); before "
    "0.28.0 there is only the token budget, so with max_num_scheduled_tokens above "
    "max_num_batched_tokens a step schedules more than max_num_batched_tokens tokens.",
    "S:735-738; 0.28.0 scheduler.py:496-499; 0.25.0 scheduler.py:416 (`token_budget` only)")

UNHASHED_FREE_BLOCKS_FIRST = _gate(
    "unhashed_free_blocks_first", "0.25.0",
    "Prefix caching: a freed block without a hash goes to the front of the free queue (reused "
    "first), a hashed one to the back (LRU) (docs/rules.md §6.5); in 0.20.0 every freed block "
    "goes to the back, in freeing order, so a hashed block can be evicted before an unhashed "
    "one freed later.",
    "P:799-839; 0.25.0 v1/core/block_pool.py:614-635 (prepend_n / append_n); 0.20.0 "
    "v1/core/block_pool.py:408-422 (append_n of every freed block)")
