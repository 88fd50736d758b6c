"""The fixed witnesses of the loop claims whose property the bounded encoding's
BMC does not reach (it models neither async scheduling, structured output, LoRA,
speculative decoding nor prefix caching): a scenario of witnesses/, replayed on
the spec, must show what the claim is about (witness_replay.py).

The scenarios (witnesses/<name>.json):

- loop-async-counters: three requests on a pool of 9 usable blocks with async
  scheduling: grants that count placeholders, and a preemption of a request whose
  batch is in flight, whose stale output is then delivered (found by a small random
  search over the spec, kept as a file so the witness is the same every run);
- loop-grammar-wait: two requests with a grammar ahead of one without: r0's grammar
  compiles for two steps, r1's fails at step 1, r2 behind them is admitted while both wait;
- loop-max-loras: max_loras 1: r0 (adapter 1) is admitted, r1 (adapter 2) is
  skipped, one adapter too many, and r2 (adapter 1) behind it is admitted past it;
- loop-drafts-sent: num_speculative_tokens 3, lookahead 1, a token budget of 6: r0
  decodes with three drafts, then one, alternately; r2 (arriving at step 1) decodes
  beside it and gets fewer of its drafts than it has; r1, a one-token prompt
  arriving at step 5, is admitted as a new decode padded with three -1 drafts (found
  by a small search over the spec);
- loop-cached-blocks: prefix caching with one draft per step (block_size 2): r0's
  grants and its deliveries of accepted drafts cache its blocks; r1, of r0's prefix
  group, arrives later and hits them.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from .obligation import Result
from .witness_replay import load_witness, replay_witness


def async_witness() -> tuple[Result, Any]:
    """The witness of an async-only claim: loop-async-counters, replayed on the spec,
    must show a grant counting placeholders and a request preempted with output in
    flight whose stale output is delivered, with the property applicable (and
    holding) on every step; `step` is the step of that preemption."""
    from schedspec.reference.engine import run_scenario
    from schedspec.reference.impl import SpecScheduler
    from schedspec.spec.properties import PROPERTIES

    t0 = time.perf_counter()
    scenario = load_witness("loop-async-counters")
    seen: dict[str, Any] = {"placeholder grant": None, "stale delivered": None, "property": True}
    prop = PROPERTIES["placeholders_never_negative"].check

    def on_step(t):
        v = prop(t.before, t.output, t.after)
        seen["property"] = seen["property"] and v.holds and v.applicable
        for rid, _ in t.output.num_scheduled_tokens:
            r = t.before.requests.get(rid)
            if r is not None and r.num_output_placeholders > 0 and seen["placeholder grant"] is None:
                seen["placeholder grant"] = t.step
        for rid in t.output.preempted_req_ids:
            r, a = t.before.requests[rid], t.after.requests.get(rid)
            if r.num_in_flight_tokens > 0 and (a is None or a.num_output_tokens > r.num_output_tokens) \
                    and seen["stale delivered"] is None:
                seen["stale delivered"] = t.step

    run_scenario(scenario, SpecScheduler(), on_step=on_step)
    ok = seen["property"] and seen["placeholder grant"] is not None and seen["stale delivered"] is not None
    return Result("proved" if ok else "refuted", time.perf_counter() - t0,
                  f"async replay on the spec: {seen}", {"step": seen["stale delivered"]}), scenario


def grammar_witness() -> tuple[Result, Any]:
    """The witness of grammar_wait_respected: a request admitted from behind a
    request waiting for its grammar."""
    def shows(t):
        waiting = list(t.before.waiting)
        blocked = [i for i, rid in enumerate(waiting) if t.before.requests[rid].grammar in ("compiling", "failed")]
        return any(blocked and i > blocked[0] and rid in t.output.scheduled for i, rid in enumerate(waiting))

    return replay_witness(load_witness("loop-grammar-wait"), "grammar_wait_respected",
                          "admitted behind a grammar wait", shows)


def lora_witness() -> tuple[Result, Any]:
    """The witness of max_loras_respected: the batch at max_loras adapters and a
    request admitted from behind one skipped for its adapter."""
    def shows(t):
        adapters = {t.after.requests[rid].lora_int_id for rid in t.after.running} - {0}
        waiting = list(t.before.waiting)
        skipped = [i for i, rid in enumerate(waiting) if rid not in t.output.scheduled
                   and t.before.requests[rid].lora_int_id not in adapters | {0}]
        behind = any(skipped and i > skipped[0] and rid in t.output.scheduled for i, rid in enumerate(waiting))
        return behind and len(adapters) == t.after.config.max_loras

    return replay_witness(load_witness("loop-max-loras"), "max_loras_respected", "admitted behind a LoRA skip", shows)


def drafts_witness() -> tuple[Result, Any]:
    """The witness of drafts_sent_are_known: a step that sends a running request
    fewer drafts than it has, and a step that admits a padded new decode."""
    seen = {"cut": False, "padded": False}

    def shows(t):
        admitted = set(t.output.admitted)
        for rid, ids in t.output.scheduled_spec_decode_tokens:
            if rid in admitted:
                seen["padded"] = True
            elif len(ids) < len(t.before.requests[rid].spec_token_ids):
                seen["cut"] = True
        return seen["cut"] and seen["padded"]

    return replay_witness(load_witness("loop-drafts-sent"), "drafts_sent_are_known",
                          "drafts cut short and a padded new decode, by this step", shows)


def caching_witness() -> tuple[Result, Any]:
    """The witness of prefix_hit_within_shared_prefix: an admission that hits cached blocks."""
    return replay_witness(load_witness("loop-cached-blocks"), "prefix_hit_within_shared_prefix",
                          "a hit on cached blocks", lambda t: any(h > 0 for _, h in t.output.prefix_hits))


# Claims whose witness is a fixed scenario replayed on the spec: the bounded
# encoding's BMC models neither async scheduling, structured output, LoRA,
# speculative decoding nor prefix caching.
FIXED_WITNESSES: dict[str, Callable[[], tuple[Result, Any]]] = {
    "placeholders_never_negative": async_witness, "grammar_wait_respected": grammar_witness,
    "max_loras_respected": lora_witness, "drafts_sent_are_known": drafts_witness,
    "prefix_hit_within_shared_prefix": caching_witness}
