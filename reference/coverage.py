"""Coverage of a differential campaign: which scheduler situations the agreeing
traces exercised (preemptions, resumptions, aborts by queue, finish reasons),
and, from the spec's own states step by step (`StepCoverage`), what prefix
caching and async scheduling exercised."""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedspec.spec import prefill_throttle
from schedspec.spec.config import long_prefill_threshold
from schedspec.spec.request import RequestStatus

from .scenario import Scenario

if TYPE_CHECKING:
    from .engine import Transition


def _bump(cov: dict[str, int], key: str, n: int = 1) -> None:
    cov[key] = cov.get(key, 0) + n


def flag_label(prefix_caching: bool, async_scheduling: bool) -> str:
    """"sync", "async", "sync + prefix caching" or "async + prefix caching"."""
    return ("async" if async_scheduling else "sync") + (" + prefix caching" if prefix_caching else "")


def resumptions(steps: list[dict]) -> list[list[str]]:
    """For each step of a trace, the admissions that were resumptions: requests preempted
    at an earlier step and admitted again.  From vLLM 0.34.0 a trace lists them among
    `new`, before among `resumed` (docs/formats.md); this reads both."""
    out, preempted = [], set()
    for st in steps:
        resumed = [rid for rid in st["new"] + st["resumed"] if rid in preempted]
        out.append(resumed)
        preempted = (preempted | set(st["preempted"])) - set(resumed)
        preempted -= {rid for rid, _ in st["finished"]}
    return out


def add_coverage(scenario: Scenario, trace: dict, cov: dict[str, int]) -> None:
    if "error" in trace:
        cov["rejected scenarios"] = cov.get("rejected scenarios", 0) + 1
        return
    if "crash" in trace:
        cov["scenarios that raised"] = cov.get("scenarios that raised", 0) + 1
        return
    L = scenario.config.max_model_len
    specs = {r.id: r for r in scenario.requests}
    preempted_waiting: set[str] = set()
    prev_running: list[str] = []

    def bump(key: str, n: int = 1) -> None:
        _bump(cov, key, n)

    bump("scenarios (" + flag_label(scenario.config.enable_prefix_caching,
                                    scenario.config.async_scheduling) + ")")
    if scenario.config.num_speculative_tokens:
        bump("scenarios with speculative decoding")
    if scenario.config.max_loras is not None:
        bump("scenarios with LoRA")
    if any(r.grammar_compile_steps is not None for r in scenario.requests):
        bump("scenarios with structured output")
    if scenario.config.prefill_schedule_interval > 1:
        bump("scenarios with prefill throttling")
    if scenario.config.long_prefill_token_threshold_adaptive:
        bump("scenarios with the adaptive long-prefill threshold")
    if any(r.kv_connector_tokens for r in scenario.requests):
        bump("scenarios with KV connector hits")
    if any(r.kv_connector_send_steps is not None for r in scenario.requests):
        bump("scenarios with KV connector sends")
    if scenario.config.requires_kv_delivery:
        bump("scenarios with a KV connector requiring delivery")
    if any(r.mm_features for r in scenario.requests):
        bump("scenarios with encoder inputs")
    if scenario.config.num_hash_lookahead_tokens:
        bump("scenarios with lookahead block hashes")
    if scenario.config.use_eagle_block_drop:
        bump("scenarios with the EAGLE block drop")
    if scenario.config.num_prefill_lookahead_tokens > 1:
        bump("scenarios with a multi-module MTP drafter")
    if scenario.config.cache_aware_admission_window:
        bump("scenarios with cache-aware admission")
    resumed_at = resumptions(trace["steps"])
    for k, st in enumerate(trace["steps"]):
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
        resumed = resumed_at[k]
        preempted_waiting |= set(st["preempted"])
        preempted_waiting -= set(resumed)
        if resumed:
            bump("resumptions", len(resumed))
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


def encoder_coverage(t: Transition, cov: dict[str, int]) -> None:
    """Encoder inputs: items encoded, entries evicted, entries two requests or more
    reference, and chunks that end at an item not encoded and not cached (cut there by
    the encoder budget, the cache or disable_chunked_mm_input), or admissions and running
    requests that scheduled nothing for it (S:2203-2225)."""
    out, before, after = t.output, t.before, t.after
    _bump(cov, "encoder inputs encoded", sum(len(ids) for _, ids in out.scheduled_encoder_inputs))
    _bump(cov, "encoder cache entries evicted", len(out.free_encoder_mm_hashes))
    if any(len(ids) > 1 for ids in after.encoder_cache.cached.values()):
        _bump(cov, "steps with an encoder cache entry shared")
    encoded = dict(out.scheduled_encoder_inputs)
    for rid, n in out.num_scheduled_tokens:
        r = before.requests[rid]
        end = out.computed_on_admission(rid, r.num_computed_tokens) + n
        if end < r.num_tokens and any(f.offset == end and i not in encoded.get(rid, ())
                                      and f.identifier not in after.encoder_cache.cached
                                      for i, f in enumerate(r.mm_features)):
            _bump(cov, "chunks cut at an encoder input")


def spec_decode_coverage(t: Transition, cov: dict[str, int]) -> None:
    """Speculative decoding: steps with drafts, drafts sent to the model, padded
    admissions (S:1358-1380, 1641-1646), requests keeping several tokens in one
    step, and, synchronous engine, requests whose rejected drafts rolled
    num_computed_tokens back (S:2417-2426), in drafts."""
    out, before, after = t.output, t.before, t.after
    _bump(cov, "steps with speculative decoding")
    admitted = set(out.admitted)
    for rid, ids in out.scheduled_spec_decode_tokens:
        _bump(cov, "draft tokens scheduled", len(ids))
        if rid in admitted:
            _bump(cov, "padded admissions")
    if any(n > 1 for n in t.record.get("new_tokens", {}).values()):
        _bump(cov, "steps with several tokens for a request")
    if not before.config.async_scheduling:
        grants, hits = out.scheduled, dict(out.prefix_hits)
        for rid, ids in out.scheduled_spec_decode_tokens:
            r = after.requests.get(rid)
            if r is not None and rid not in admitted:
                start = before.requests[rid].num_computed_tokens
                rejected = start + grants[rid] - r.num_computed_tokens
                if rejected > 0:
                    _bump(cov, "rejected drafts rolled back", rejected)


class StepCoverage:
    """An engine `on_step` observer (reference/engine.py `Transition`) that counts,
    from the states of the spec, what prefix caching and async scheduling did:

    - `prefix hits` / `prefix hits on resumption`: admissions, new or resumed, that
      found at least one cached block; `prefix tokens saved`: the tokens those hits
      skipped;
    - `evicted blocks`: cached blocks whose hash was dropped because the pool
      handed them out again (spec/block_pool.py `_uncache`, vLLM block_pool.py
      `_maybe_evict_cached_block`): hashed before the step, not (or differently)
      after it;
    - `steps with shared blocks`: some block held by two requests or more;
    - `in-flight preemptions`: requests preempted while a batch holding their
      tokens was still in flight (num_in_flight_tokens > 0 before the step), whose
      output then arrives stale;
    - `stale outputs applied`: batches applied to a request preempted meanwhile;
      `finished while preempted`: such a stale output finished the request;
    - `aborts with a batch in flight`: aborts of requests with tokens in flight;
    - `async max_tokens guard`: running requests left unscheduled in a step that
      began with the last token max_tokens allows in flight, the condition under
      which vLLM passes them over (sched/scheduler.py:800-812);
      `empty async batches`: schedule() called with nothing to schedule, a batch
      that still takes a place in flight;
    - `steps (<flags>)`: steps per combination of the two flags;
    - structured output: `steps with a request waiting for its grammar` (compiling or
      failed, in waiting before schedule()), and those of them that scheduled something;
    - speculative decoding (`spec_decode_coverage`).

    Make one per scenario run; counts go into `cov`."""

    def __init__(self, cov: dict[str, int]):
        self.cov = cov
        self._prev_after = None  # the state after the previous listed step

    def __call__(self, t: Transition) -> None:
        cov, before, after = self.cov, t.before, t.after
        c = before.config
        _bump(cov, "steps (" + flag_label(c.enable_prefix_caching, c.async_scheduling) + ")")
        prev = self._prev_after
        self._prev_after = after
        for rid, reason in t.record.get("finished", ()):
            if reason == "aborted" and prev is not None:
                r = prev.requests.get(rid)
                if r is not None and r.num_in_flight_tokens > 0:
                    _bump(cov, "aborts with a batch in flight")
        # In this order, so that the counts come out in the order they always have.
        if c.async_scheduling:
            _async_coverage(t, cov)
        _feature_coverage(t, cov)
        resumed = {rid for rid in t.output.admitted if before.requests[rid].status == RequestStatus.PREEMPTED}
        _kv_connector_coverage(t, cov, resumed)
        _prefix_coverage(t, cov, resumed)
        _stale_coverage(t, cov)
        _block_coverage(t, cov)


def _async_coverage(t: Transition, cov: dict[str, int]) -> None:
    """The async max_tokens guard and empty async batches (StepCoverage)."""
    before, out = t.before, t.output
    scheduled = out.scheduled
    for rid in before.running:
        r = before.requests[rid]
        if (rid not in scheduled and r.num_output_placeholders > 0 and r.num_computed_tokens + 2
                - r.num_output_placeholders >= r.num_prompt_tokens + r.max_tokens):
            _bump(cov, "async max_tokens guard")
    if t.record.get("schedule_called") and not out.num_scheduled_tokens:
        _bump(cov, "empty async batches")


def _feature_coverage(t: Transition, cov: dict[str, int]) -> None:
    """Speculative decoding, encoder inputs, an MTP drafter's lookahead, LoRA, the
    adaptive long-prefill threshold, prefill throttling and grammars (StepCoverage)."""
    before, after, out = t.before, t.after, t.output
    c = before.config
    if c.num_speculative_tokens:
        spec_decode_coverage(t, cov)
    if any(r.mm_features for r in before.requests.values()):
        encoder_coverage(t, cov)
    if c.num_prefill_lookahead_tokens > 1 and any(
            rid in before.requests and before.requests[rid].num_computed_tokens + n < before.requests[rid].num_tokens
            for rid, n in out.num_scheduled_tokens):
        _bump(cov, "steps with a prefill chunk under an MTP drafter's lookahead")
    if c.max_loras is not None:
        running = {after.requests[x].lora_int_id for x in after.running} - {0}
        if len(running) == c.max_loras:
            _bump(cov, "steps at max_loras")
            if any(after.requests[w].lora_int_id not in running | {0} for w in after.waiting):
                _bump(cov, "steps holding an adapter back")
    if c.long_prefill_token_threshold_adaptive and \
            long_prefill_threshold(c, len(before.running) + len(before.waiting)) > c.long_prefill_token_threshold:
        _bump(cov, "steps with the long-prefill cap raised to a fair share")
    if c.prefill_schedule_interval > 1 and prefill_throttle.holds_prefill(before):
        _bump(cov, "steps holding prefill back")
        if before.waiting and not out.scheduled_new_reqs and not out.scheduled_resumed_reqs:
            _bump(cov, "steps holding an admission back")
    if any(before.requests[w].grammar in ("compiling", "failed") for w in before.waiting):
        _bump(cov, "steps with a request waiting for its grammar")
        if out.num_scheduled_tokens:
            _bump(cov, "steps scheduling past a request waiting for its grammar")


def _kv_connector_coverage(t: Transition, cov: dict[str, int], resumed: set[str]) -> None:
    """KV connector loads (asynchronous or not, on resumption or not) and sends (StepCoverage)."""
    before, after, out = t.before, t.after, t.output
    for rid, r in after.requests.items():
        was = before.requests.get(rid)
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and (was is None or was.status != r.status):
            _bump(cov, "KV connector async loads")
    for rid in out.admitted:
        if before.requests[rid].status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            _bump(cov, "KV connector async loads admitted")
    for rid, r in before.requests.items():  # finished, its blocks held until a load or a send ends
        if r.status.is_finished and rid not in after.requests:
            _bump(cov, "KV connector sends ended after their request finished" if r.kv_connector_sends
                  else "KV connector loads ended after their request finished")
    if out.num_scheduled_tokens and any(r.status.is_finished and r.kv_connector_sends
                                        for r in before.requests.values()):
        _bump(cov, "steps scheduling past blocks held for a KV send")
    if any(before.requests[w].status == RequestStatus.WAITING_FOR_REMOTE_KVS for w in before.waiting) \
            and out.num_scheduled_tokens:
        _bump(cov, "steps scheduling past a request loading KV")
    for rid, n in out.kv_connector_hits:
        _bump(cov, "KV connector loads on resumption" if rid in resumed else "KV connector loads")
        _bump(cov, "KV connector tokens loaded", n)
        if dict(out.prefix_hits).get(rid):
            _bump(cov, "KV connector loads beyond a prefix hit")


def _prefix_coverage(t: Transition, cov: dict[str, int], resumed: set[str]) -> None:
    """Prefix hits, new or on resumption, and the tokens they saved (StepCoverage)."""
    c = t.before.config
    for rid, hit in t.output.prefix_hits:
        if hit > 0:
            _bump(cov, "prefix hits on resumption" if rid in resumed else "prefix hits")
            _bump(cov, "prefix tokens saved", hit)
            if c.num_hash_lookahead_tokens:
                _bump(cov, "prefix hits on lookahead block hashes")
            if c.use_eagle_block_drop:
                _bump(cov, "prefix hits with the EAGLE block dropped")


def _stale_coverage(t: Transition, cov: dict[str, int]) -> None:
    """In-flight preemptions and the stale outputs applied (StepCoverage)."""
    before, after, out = t.before, t.after, t.output
    # Stale outputs: pending before the step, or made stale by this step's preemptions.
    stale = {rid: r.num_stale_output_tokens for rid, r in before.requests.items()
             if r.num_stale_output_tokens > 0}
    for rid in out.preempted_req_ids:
        r = before.requests.get(rid)
        if r is not None and r.num_in_flight_tokens > 0:
            _bump(cov, "in-flight preemptions")
            if before.config.requires_kv_delivery:
                _bump(cov, "in-flight outputs dropped for KV delivery")
            stale[rid] = stale.get(rid, 0) + r.num_in_flight_tokens
    finished = {rid for rid, _ in t.record.get("finished", ())}
    for rid, n in stale.items():
        r = after.requests.get(rid)
        if r is None:
            if rid in finished:
                _bump(cov, "stale outputs applied")
                if not any(rid == x and reason == "aborted" for x, reason in t.record["finished"]):
                    _bump(cov, "finished while preempted")
        elif r.num_stale_output_tokens < n:
            _bump(cov, "stale outputs applied")


def _block_coverage(t: Transition, cov: dict[str, int]) -> None:
    """Evicted blocks and shared blocks, from the block pools around the step (StepCoverage)."""
    pa, pb = t.before.block_pool, t.after.block_pool
    if pa is not None and pb is not None:
        if pa.block_hash is not pb.block_hash:
            evicted = sum(1 for b, h in pa.block_hash.items() if pb.block_hash.get(b) != h)
            if evicted:
                _bump(cov, "evicted blocks", evicted)
        if any(n > 1 for n in pb.ref_cnt.values()):
            _bump(cov, "steps with shared blocks")
