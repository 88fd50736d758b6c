"""What the spec must learn from a vLLM release it does not model yet (`schedspec keep-up`).

A differential campaign of the new release X against the spec at the newest modelled
release at or below X finds divergences; each was shrunk by the campaign.  Here they
are grouped by rule: a group is the first differing field together with the config
features the divergence needs.  A feature is *needed* when switching it off (to the
value that means "not used", `FEATURES`) makes the divergence go away on the shrunk
scenario.  One shrunk scenario per group, the smallest, is the candidate for a new
version gate (spec/versions.py) and its docs/changes/<gate>.json.

The grouping takes the comparison as a function (`diverges`), so it is tested on
recorded divergences without vLLM (tests/test_keep_up.py), and run by the command in
the process that has vLLM X (cli/keep_up.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

from schedspec.spec.config import config_as_given

from .compare import Divergence
from .scenario import RequestSpec, Scenario, scenario_problem


def _config_off(**values: Any) -> Callable[[Scenario], Scenario]:
    return lambda s: dataclasses.replace(s, config=dataclasses.replace(s.config, **values))


def _requests_off(**values: Any) -> Callable[[Scenario], Scenario]:
    return lambda s: dataclasses.replace(s, requests=tuple(dataclasses.replace(r, **values) for r in s.requests))


def _both(*steps: Callable[[Scenario], Scenario]) -> Callable[[Scenario], Scenario]:
    def apply(s: Scenario) -> Scenario:
        for step in steps:
            s = step(s)
        return s
    return apply


def _uses(key: str, off: Any) -> Callable[[Scenario], bool]:
    return lambda s: getattr(s.config, key) != off


def _any_request(pred: Callable[[RequestSpec], bool]) -> Callable[[Scenario], bool]:
    return lambda s: any(pred(r) for r in s.requests)


# name -> (does the scenario use it, the scenario without it).  The "off" values are
# the configs' defaults (docs/formats.md), so the scenario without a feature is the one
# a user who never set it runs.
FEATURES: dict[str, tuple[Callable[[Scenario], bool], Callable[[Scenario], Scenario]]] = {
    "chunked prefill off": (lambda s: not s.config.enable_chunked_prefill,
                            _config_off(enable_chunked_prefill=True)),
    "prefix caching": (_uses("enable_prefix_caching", False), _config_off(enable_prefix_caching=False)),
    "async scheduling": (_uses("async_scheduling", False), _config_off(async_scheduling=False)),
    "priority policy": (lambda s: s.config.policy == "priority", _config_off(policy="fcfs")),
    "long-prefill threshold": (_uses("long_prefill_token_threshold", 0),
                               _config_off(long_prefill_token_threshold=0, long_prefill_token_threshold_adaptive=False)),
    "token budget below the input budget": (_uses("max_num_scheduled_tokens", None),
                                            _config_off(max_num_scheduled_tokens=None)),
    "max_num_active_seqs": (_uses("max_num_active_seqs", None), _config_off(max_num_active_seqs=None)),
    "watermark": (_uses("watermark", 0.0), _config_off(watermark=0.0)),
    "full-ISL gate off": (lambda s: not s.config.scheduler_reserve_full_isl,
                          _config_off(scheduler_reserve_full_isl=True)),
    "speculative decoding": (_uses("num_speculative_tokens", 0), _both(
        _config_off(num_speculative_tokens=0, num_lookahead_tokens=0, num_prefill_lookahead_tokens=0,
                    max_num_new_slots_for_drafting=0, use_eagle_block_drop=False),
        _requests_off(num_draft_tokens=None, num_accepted_tokens=None))),
    "LoRA": (_uses("max_loras", None), _both(_config_off(max_loras=None), _requests_off(lora_int_id=0))),
    "structured output": (_any_request(lambda r: r.grammar_compile_steps is not None),
                          _requests_off(grammar_compile_steps=None, grammar_error=False)),
    "prefill throttling": (_uses("prefill_schedule_interval", 1), _config_off(prefill_schedule_interval=1)),
    "KV connector": (lambda s: s.config.requires_kv_delivery or any(
        r.kv_connector_tokens or r.kv_connector_send_steps is not None for r in s.requests), _both(
        _config_off(requires_kv_delivery=False),
        _requests_off(kv_connector_tokens=0, kv_connector_load_steps=None, kv_connector_send_steps=None))),
    "lookahead block hashes": (_uses("num_hash_lookahead_tokens", 0), _config_off(num_hash_lookahead_tokens=0)),
    "encoder inputs": (_any_request(lambda r: bool(r.mm_features)), _requests_off(mm_features=())),
    "cache-aware admission": (_uses("cache_aware_admission_window", 0), _config_off(cache_aware_admission_window=0)),
    "aborts": (lambda s: bool(s.aborts), lambda s: dataclasses.replace(s, aborts=())),
}


def features_used(s: Scenario) -> list[str]:
    return [name for name, (used, _) in FEATURES.items() if used(s)]


def without(s: Scenario, feature: str) -> Scenario | None:
    """`s` with `feature` off, or None when that scenario is not one a file may hold
    (a feature another one needs, e.g. chunked prefill on for a small budget)."""
    candidate = FEATURES[feature][1](s)
    return candidate if scenario_problem(candidate) is None else None


def needed_features(s: Scenario, d: Divergence, diverges: Callable[[Scenario], Divergence | None]) -> list[str]:
    """The features of `s` the divergence `d` needs: those without which the two
    implementations no longer diverge at the same field."""
    needed = []
    for name in features_used(s):
        other = without(s, name)
        if other is None:
            continue  # cannot be switched off alone: not told apart
        found = diverges(other)
        if found is None or found.field != d.field:
            needed.append(name)
    return needed


def field_group(field: str) -> str:
    """A differing field with its request id left out: `num_computed_tokens.r3` and
    `.r0` are one rule."""
    return field.split(".", 1)[0]


@dataclasses.dataclass
class Group:
    field: str
    features: tuple[str, ...]
    count: int
    scenario: Scenario  # the smallest shrunk scenario of the group
    divergence: Divergence
    file: str | None  # where the campaign wrote it

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        return self.field, self.features


def size(s: Scenario) -> tuple[int, int, int]:
    return len(s.requests), s.max_steps, sum(r.prompt_len for r in s.requests)


def group_divergences(found: Sequence[tuple[Scenario, Divergence, str | None]],
                      diverges: Callable[[Scenario], Divergence | None],
                      progress: Callable[[int, int], None] | None = None) -> list[Group]:
    """Group shrunk diverging scenarios by rule: (field, needed features); the
    groups in the order first found, each keeping its smallest scenario."""
    groups: dict[tuple[str, tuple[str, ...]], Group] = {}
    for k, (s, d, file) in enumerate(found):
        if progress:
            progress(k, len(found))
        key = (field_group(d.field), tuple(needed_features(s, d, diverges)))
        g = groups.get(key)
        if g is None:
            groups[key] = Group(key[0], key[1], 1, s, d, file)
            continue
        g.count += 1
        if size(s) < size(g.scenario):
            g.scenario, g.divergence, g.file = s, d, file
    return fold_supersets(list(groups.values()))


def fold_supersets(groups: list[Group]) -> list[Group]:
    """A group whose features include all of another group's at the same field is that
    rule reached through more features (the feature led to the state where the rule
    shows): its scenarios count to the smaller group, which keeps the smallest scenario."""
    kept: list[Group] = []
    for g in sorted(groups, key=lambda g: (len(g.features), groups.index(g))):
        into = next((k for k in kept if k.field == g.field and set(k.features) <= set(g.features)), None)
        if into is None:
            kept.append(g)
            continue
        into.count += g.count
        if size(g.scenario) < size(into.scenario):
            into.scenario, into.divergence, into.file = g.scenario, g.divergence, g.file
    return sorted(kept, key=groups.index)


def render_report(release: str, spec_release: str, groups: Sequence[Group], campaign: dict[str, Any],
                  peer: dict[str, Any] | None) -> str:
    """The report in Markdown: what was run, then one section per group with the gate
    to add, then the peer tests' verdict."""
    lines = [f"# vLLM {release} against the spec at {spec_release}: what the spec must learn", ""]
    div = len(campaign.get("divergences", []))
    lines += [f"Campaign: {campaign.get('scenarios', 0)} random scenarios (every engine flag and every feature "
              f"the spec models at {spec_release} drawn), {campaign.get('steps_compared', 0)} steps compared, "
              f"{div} diverging scenario(s), {len(campaign.get('failures', []))} worker failure(s), "
              f"{len(campaign.get('rejected', []) or [])} config(s) one side refused.", ""]
    if not groups:
        lines += [f"No divergence: the spec's rules at {spec_release} are vLLM {release}'s on these scenarios.  "
                  f"Add {release} to spec/versions.py RELEASES with no gate (docs/releases.md).", ""]
    for n, g in enumerate(sorted(groups, key=lambda g: -g.count), 1):
        feats = ", ".join(g.features) if g.features else "none (any scenario that reaches the field)"
        where = f"step {g.divergence.step}" if g.divergence.step is not None else "before any step"
        lines += [f"## {n}. `{g.field}` with {feats}", "",
                  f"{g.count} diverging scenario(s).  Smallest: {len(g.scenario.requests)} request(s), "
                  f"{g.scenario.max_steps} step(s)" + (f", `{g.file}`" if g.file else "") + ".", "",
                  f"First difference at {where}, field `{g.divergence.field}`: "
                  f"spec {spec_release} gives `{json.dumps(g.divergence.b)}`, vLLM {release} gives "
                  f"`{json.dumps(g.divergence.a)}`.", "",
                  f"Config: `{json.dumps(config_as_given(g.scenario.config), sort_keys=True)}`.", "",
                  f"To do: find the rule in vLLM {release}'s source that changes `{g.field}` "
                  + (f"with {feats}" if g.features else "") + f"; add a gate in spec/versions.py "
                  f"(`since=\"{release}\"`, the source lines of both releases), ask it in the rule function, "
                  f"and save this scenario as docs/changes/<gate>.json.", ""]
    if peer is not None:
        lines += ["## vLLM's own tests under the monitor", "", peer_summary(peer), ""]
    return "\n".join(lines).rstrip() + "\n"


def peer_summary(peer: dict[str, Any]) -> str:
    """A paragraph from a `peer-tests --json-out` report (schedspec.peer-tests/1), and
    the first divergences, which name a rule as the campaign's groups do."""
    if "error" in peer:
        return f"Not run: {peer['error']}"
    t = peer.get("totals", {})
    plain, shadow = t.get("plain", {}), t.get("shadow", {})
    outside = sorted(t.get("outside_scope", {}).items(), key=lambda kv: -kv[1])[:5]
    lines = [f"{t.get('collected', '?')} tests; {plain.get('passed', '?')} pass plain, {shadow.get('passed', '?')} "
             f"shadowed; scheduler calls checked {t.get('calls_checked', '?')} of {t.get('calls_total', '?')} "
             f"(outside the spec's scope, most: "
             + (", ".join(f"{k} {v}" for k, v in outside) or "none") + f"); divergences "
             f"{len(peer.get('divergences', []))}, monitor errors {len(peer.get('monitor_errors', []))}, tests "
             f"passing plain and failing shadowed {len(peer.get('plain_pass_shadow_fail', []))}."]
    for d in peer.get("divergences", [])[:10]:
        lines.append(f"- {json.dumps(d)[:300]}")
    return "\n".join(lines)


__all__ = ["FEATURES", "Group", "features_used", "field_group", "group_divergences", "needed_features",
           "peer_summary", "render_report", "without"]
