"""The scheduler's properties, as named predicates over one step.

Every property is a function `(before, output, after) -> Verdict`:
- `before`: the state after the step's aborts and arrivals, before `schedule()`;
- `output`: what `schedule()` decided;
- `after`: the state after `update_from_output()`.
They read only what any implementation can report (reference/impl.py's
`observe()`), so the same predicates judge the spec, the torch implementation,
vLLM itself and yours.  A property whose premise does not hold in a step says so
(`applicable=False`), so a run can show how often each property was really tested.

`PROPERTIES` is the one registry that the tests, the CLI, the proofs and the
differential tester iterate over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from . import cache_aware_admission, kv_connector, prefill_throttle, spec_decode
from .config import FCFS, PRIORITY, long_prefill_threshold, step_budget
from .kv_cache import cdiv, get_num_blocks_to_allocate
from .lora import exceeds_max_loras, running_loras
from .request import Request, RequestStatus, last_token_in_flight
from .state import SchedulerOutput, SchedulerState
from .versions import INPUT_BUDGET, UNHASHED_FREE_BLOCKS_FIRST, has


@dataclass(frozen=True)
class Verdict:
    holds: bool
    applicable: bool = True
    detail: str = ""
    values: Mapping[str, Any] = field(default_factory=dict)


HOLDS = Verdict(True)
NOT_APPLICABLE = Verdict(True, applicable=False)


def violated(detail: str, **values: Any) -> Verdict:
    return Verdict(False, True, detail, values)


@dataclass(frozen=True)
class Property:
    name: str
    doc: str
    check: Callable[[SchedulerState, SchedulerOutput, SchedulerState], Verdict]
    # The engine flags without which the property has nothing to judge (it is
    # then not applicable, or trivially true): the z3 encoding, which models the
    # engine with both flags off, leaves these properties to the other checkers.
    engine_flags: tuple[str, ...] = ()


PROPERTIES: dict[str, Property] = {}


def prop(fn: Callable[[SchedulerState, SchedulerOutput, SchedulerState], Verdict] | None = None, *,
         engine_flags: tuple[str, ...] = ()):
    def register(fn):
        doc = " ".join((fn.__doc__ or "").split())
        PROPERTIES[fn.__name__] = Property(fn.__name__, doc, fn, engine_flags)
        return fn

    return register(fn) if fn is not None else register


# --- quantities the properties share -------------------------------------------------


def get_long_prefill_threshold(state: SchedulerState) -> int:
    """The threshold in force this step (config.py `long_prefill_threshold`)."""
    return long_prefill_threshold(state.config, len(state.running) + len(state.waiting))


def get_need(r: Request) -> int:
    """A running request's tokens to compute, before any cap (S:855), its drafts
    included.  Async: an output placeholder counts as a token to compute, and a
    request whose last allowed token is in flight needs none (S:816-830)."""
    if last_token_in_flight(r):
        return 0
    return r.num_tokens_with_spec + r.num_output_placeholders - r.num_computed_tokens


def get_block_span(state: SchedulerState, r: Request) -> tuple[int, int]:
    """The blocks a request may hold between steps: exactly those its computed tokens
    fill, or, with drafts or a lookahead, up to the slots of its drafts and lookahead
    too: rejected drafts return no block (S:2417-2426, K:571-574).  Async: two batches'
    rejections can follow the last allocation (a step that did not schedule it)."""
    c = state.config
    lo = cdiv(min(r.num_computed_tokens, c.max_model_len), c.block_size)
    extra = c.num_speculative_tokens * (2 if c.async_scheduling else 1) + c.num_lookahead_tokens
    return lo, cdiv(min(r.num_computed_tokens + extra, c.max_model_len), c.block_size) if extra else lo


def is_live(state: SchedulerState, rid: str) -> bool:
    """`rid` is a request of `state` not finished: not one finished and kept, holding its
    blocks for a KV connector's load or send (spec/kv_connector.py)."""
    r = state.requests.get(rid)
    return r is not None and not r.status.is_finished


def get_capped_need(state: SchedulerState, r: Request) -> int:
    """A running request's need after the threshold and model-length caps, before
    the budget cap (S:855-872)."""
    n = get_need(r)
    threshold = get_long_prefill_threshold(state)
    if 0 < threshold < n:
        n = threshold
    return max(min(n, state.config.max_model_len - r.num_computed_tokens - 1), 0)


def cut_by_prefill_lookahead(c, r: Request, granted: int, start: int | None = None) -> bool:
    """Grant `granted` (from `start`, else its computed tokens) is what a multi-module MTP
    drafter's prefill lookahead L left of a prefill chunk (S:695-714): it ends exactly L
    tokens before the prefill's end, or it is nothing because no chunk the budget allows
    ends outside them."""
    left = r.num_tokens - (r.num_computed_tokens if start is None else start)
    lookahead = c.num_prefill_lookahead_tokens
    return lookahead > 1 and (left - granted == lookahead if granted else 0 < left <= lookahead)


def cut_by_encoder_input(c, r: Request, start: int, granted: int) -> bool:
    """Grant `granted` from `start` is what an encoder input left of the chunk: it ends
    where an item starts (less a multi-module MTP drafter's read-ahead) that the
    encoder budget or cache could not take or that may not be split, or it is nothing
    because the chunk would start in or at such an item (S:2139-2151, 2203-2225)."""
    shift = c.num_prefill_lookahead_tokens
    return any(f.offset - shift <= start + granted <= f.offset or (granted == 0 and start < f.offset + f.length)
               for f in r.mm_features)


def get_step_budget(state: SchedulerState) -> int:
    """Tokens one step may grant in all: the token budget and the input budget (the
    token budget alone before 0.28.0, versions.INPUT_BUDGET).  token_budget_respected
    does not use it: max_num_batched_tokens bounds a step in every release."""
    if not has(state.config, INPUT_BUDGET):
        return state.config.token_budget
    return step_budget(state.config)


def get_block_demand(state: SchedulerState, rid: str, num_new_tokens: int) -> int:
    r = state.requests[rid]
    # Speculative decoding: the drafter's lookahead slots too (K:571-574).
    num_tokens = min(r.num_computed_tokens + num_new_tokens + state.config.num_lookahead_tokens,
                     state.config.max_model_len)
    return get_num_blocks_to_allocate(state.config.block_size, state.num_blocks(rid), num_tokens)


def get_expected_victims(before: SchedulerState, count: int) -> list[str]:
    """The first `count` victims the policy names (S:948-986): FCFS the tail of
    running, PRIORITY the largest (priority, arrival_time), first in running order."""
    running = list(before.running)
    victims = []
    for _ in range(min(count, len(running))):
        if before.config.policy == PRIORITY:
            v = max(running, key=lambda x: before.requests[x].priority_key)
        else:
            v = running[-1]
        running.remove(v)
        victims.append(v)
    return victims


# --- the properties ---------------------------------------------------------------------


@prop
def token_budget_respected(before, output, after):
    """The tokens granted in one step never exceed max_num_scheduled_tokens, nor max_num_batched_tokens."""
    total = output.total_num_scheduled_tokens
    c = before.config
    if total > c.token_budget or total > c.max_num_batched_tokens:
        return violated("step grants more tokens than the budget", total=total,
                        max_num_scheduled_tokens=c.token_budget,
                        max_num_batched_tokens=c.max_num_batched_tokens)
    return HOLDS


@prop
def grants_positive(before, output, after):
    """Every grant is at least one token, and no request is granted twice in a step."""
    ids = [rid for rid, _ in output.num_scheduled_tokens]
    if len(ids) != len(set(ids)):
        return violated("a request is granted twice", scheduled=output.num_scheduled_tokens)
    bad = [(rid, n) for rid, n in output.num_scheduled_tokens if n < 1]
    if bad:
        return violated("a grant is below one token", grants=bad)
    return HOLDS


@prop
def running_before_waiting(before, output, after):
    """A waiting request receives tokens only if every running request eligible this step received its full capped need, and only from the budget they left; a step that holds prefill (docs/rules.md §18) skips the running prefill chunks on purpose, and a multi-module MTP drafter's prefill lookahead (docs/rules.md §15.9) or an encoder input (docs/rules.md §20) may cut a chunk the budget cut, leaving budget to admissions."""
    if not output.admitted:
        return NOT_APPLICABLE
    granted = output.scheduled
    held = prefill_throttle.holds_prefill(before)
    for rid in before.running:
        need = get_capped_need(before, before.requests[rid])
        if held and before.requests[rid].is_prefill_chunk:
            continue
        r = before.requests[rid]
        if need > 0 and granted.get(rid, 0) != need and \
                not cut_by_prefill_lookahead(before.config, r, granted.get(rid, 0)) and \
                not cut_by_encoder_input(before.config, r, r.num_computed_tokens, granted.get(rid, 0)):
            return violated("a waiting request was admitted while a running one was short",
                            admitted=list(output.admitted), running_request=rid,
                            capped_need=need, granted=granted.get(rid, 0))
    running_total = sum(granted.get(rid, 0) for rid in before.running)
    admitted_total = sum(granted[rid] for rid in output.admitted)
    left = get_step_budget(before) - running_total
    if admitted_total > left:
        return violated("admissions used more than the budget running left",
                        admitted_tokens=admitted_total, budget_left=left)
    return HOLDS


@prop
def preemption_only_on_allocation_failure(before, output, after):
    """A preemption happens only in a step where the running requests' block demand exceeds the free pool, the victim is the one the policy names, and no request is admitted in that step."""
    if not output.preempted_req_ids:
        return NOT_APPLICABLE
    if output.admitted:
        return violated("a request was admitted in a step with a preemption",
                        preempted=list(output.preempted_req_ids), admitted=list(output.admitted))
    demand = sum(get_block_demand(before, rid, get_capped_need(before, before.requests[rid]))
                 for rid in before.running)
    if demand <= before.num_free_blocks:
        return violated("preempted although the running requests' whole block demand fits",
                        preempted=list(output.preempted_req_ids), block_demand=demand,
                        num_free_blocks=before.num_free_blocks)
    expected = get_expected_victims(before, len(output.preempted_req_ids))
    if list(output.preempted_req_ids) != expected:
        return violated(f"victims are not the ones the {before.config.policy} policy names",
                        preempted=list(output.preempted_req_ids), expected=expected)
    return HOLDS


def get_head_start(before: SchedulerState, output: SchedulerOutput, head: str) -> int | None:
    """Where the head of waiting's chunk starts (its hit and loaded tokens), or None
    when a rule skips it on purpose or may pad it (starvation_condition's exceptions)."""
    c, r, granted = before.config, before.requests[head], output.scheduled
    if r.num_stale_output_tokens > 0:
        return None  # async: skipped until its in-flight output returns
    if r.grammar in ("compiling", "failed"):
        return None  # structured output: skipped until its grammar compiles (structured_output.py)
    if kv_connector.undecided(r):
        return None  # skipped until its KV connector can tell its hit (kv_connector.py)
    if r.kv_connector_async and (kv_connector.loading(r) and not r.kv_load_finished
                                 or r.kv_connector_tokens and r.num_computed_tokens == 0 and head not in granted):
        return None  # loading: no tokens, and a load starts only beside every prefill in flight
    # What admission computes: its hit and loaded tokens when admitted; else at least what
    # its KV connector holds (a local hit is visible only on admission).
    start = max(output.computed_on_admission(head, r.num_computed_tokens), kv_connector.external_tokens(r, 0))
    if c.num_speculative_tokens and c.enable_prefix_caching and head not in granted and r.num_computed_tokens == 0 \
            and not r.skip_reading_prefix_cache:
        # Not admitted, its hit is not in the output: look it up as admission would (S:1149-1166).
        hits = before.kv_cache.work().get_computed_blocks(r.block_hashes, r.num_tokens, c.block_size)
        start = max(start, len(spec_decode.eagle_block_drop(c, hits)) * c.block_size)
    if c.num_speculative_tokens and r.num_tokens - start == 1:
        return None  # a new decode may be padded, or not admitted (spec_decode.pads_new_decode)
    if exceeds_max_loras(c, running_loras(before.requests[x] for x in before.running), r):
        return None  # LoRA: it would bring one adapter too many and is skipped (lora.py)
    if prefill_throttle.holds_prefill(before) and prefill_throttle.has_prefill_left(start, r.num_tokens):
        return None  # a step holding prefill admits no prefill (prefill_throttle.py)
    return start


@prop
def starvation_condition(before, output, after):
    """With D running requests each needing exactly one token and D >= the token budget B, waiting requests receive no tokens; with D < B, chunked prefill on, a free run slot and enough blocks, the head of waiting receives min(need, B - D) > 0 (with a drafter's rows s per request, what the input budget keeps after D(1 + s) and s of its own, S:1345).  Where cache-aware admission (0.34.0) may put another request before the head, the second half is not applicable."""
    if not before.waiting:
        return NOT_APPLICABLE
    c = before.config
    # Async: a decode at max_model_len - 1 needs a token and the cap gives it none
    # (S:868), so the capped need counts; in reachable synchronous states the two agree,
    # and the z3 formula (synchronous) states the uncapped one.
    need_of = get_capped_need if c.async_scheduling else (lambda _, r: get_need(r))
    if any(need_of(before, before.requests[r]) != 1 for r in before.running):
        return NOT_APPLICABLE
    D = len(before.running)
    B = get_step_budget(before)
    granted = output.scheduled
    if D >= B:
        fed = [w for w in before.waiting if w in granted]
        if fed:
            return violated("a waiting request got tokens although D >= B", D=D, B=B, fed=fed)
        return HOLDS
    if not c.enable_chunked_prefill or D >= c.max_num_active_reqs:
        return NOT_APPLICABLE
    head = before.waiting[0]
    movable = reorder_window(before, output)
    if head in movable and len(movable) >= 2:
        return NOT_APPLICABLE  # which request leads is the cache's choice (cache-aware admission)
    r = before.requests[head]
    start = get_head_start(before, output, head)
    if start is None:
        return NOT_APPLICABLE
    # The head's whole sequence, with a drafter's lookahead slots (K:571-574).
    blocks_needed = (sum(get_block_demand(before, d, 1) for d in before.running)
                     + get_block_demand(before, head, r.num_tokens - r.num_computed_tokens) + c.watermark_blocks)
    if blocks_needed > before.num_free_blocks:
        return NOT_APPLICABLE
    # A prefix hit is computed already: the head needs what the cache lacks.
    need = r.num_tokens - start
    threshold = get_long_prefill_threshold(before)
    if 0 < threshold < need:
        need = threshold
    expected = min(need, B - D)
    s = c.max_num_new_slots_for_drafting
    if s and has(c, INPUT_BUDGET):
        expected = max(0, min(expected, c.max_num_batched_tokens - D * (1 + s) - s))
    if granted.get(head, 0) != expected and (cut_by_encoder_input(c, r, start, granted.get(head, 0))
                                             or cut_by_prefill_lookahead(c, r, granted.get(head, 0), start)):
        return NOT_APPLICABLE  # an encoder input or an MTP drafter's lookahead cut its chunk
    if granted.get(head, 0) != expected:
        return violated("the head of waiting did not get min(need, B - D)", D=D, B=B, head=head,
                        expected=expected, granted=granted.get(head, 0))
    return HOLDS


@prop
def max_num_seqs_respected(before, output, after):
    """The running list never holds more than max_num_seqs requests (nor more than max_num_active_seqs)."""
    c = after.config
    if len(after.running) > c.max_num_active_reqs:
        return violated("too many running requests", running=len(after.running),
                        max_num_seqs=c.max_num_seqs, max_num_active_reqs=c.max_num_active_reqs)
    return HOLDS


@prop
def kv_blocks_conserved(before, output, after):
    """Blocks held plus free blocks equal the usable pool, and each request holds exactly the blocks its computed tokens fill (with speculative decoding, up to those of its drafts and lookahead too)."""
    c = after.config
    # With prefix caching a block several requests share counts once.
    held = sum(after.req_to_num_blocks.values()) if after.block_pool is None else len(after.block_pool.ref_cnt)
    if after.num_free_blocks < 0 or held + after.num_free_blocks != c.num_usable_blocks:
        return violated("blocks held + free != usable blocks", held=held,
                        num_free_blocks=after.num_free_blocks, usable=c.num_usable_blocks)
    for rid, r in after.requests.items():
        lo, hi = get_block_span(after, r)
        if not lo <= after.num_blocks(rid) <= hi:
            return violated("a request holds the wrong number of blocks", request=rid,
                            num_computed_tokens=r.num_computed_tokens, held=after.num_blocks(rid),
                            expected=lo if lo == hi else f"{lo}..{hi}")
    return HOLDS


@prop
def computed_tokens_bounded(before, output, after):
    """Every request keeps 0 <= num_computed_tokens <= num_tokens + num_output_placeholders (async: tokens in flight are computed but not yet appended)."""
    for rid, r in after.requests.items():
        if not 0 <= r.num_computed_tokens <= r.num_tokens + r.num_output_placeholders:
            return violated("num_computed_tokens out of [0, num_tokens + num_output_placeholders]",
                            request=rid, num_computed_tokens=r.num_computed_tokens, num_tokens=r.num_tokens,
                            num_output_placeholders=r.num_output_placeholders)
    return HOLDS


@prop
def scheduled_requests_run(before, output, after):
    """After the step every scheduled request is running or finished, and was running or admitted before."""
    allowed = set(before.running) | set(output.admitted)
    for rid, _ in output.num_scheduled_tokens:
        if rid not in allowed:
            return violated("a request was scheduled without running or being admitted", request=rid)
        if is_live(after, rid) and rid not in after.running:
            return violated("a scheduled request is not running after the step", request=rid,
                            status=after.requests[rid].status.name)
    return HOLDS


@prop
def computed_tokens_advance_by_grant(before, output, after):
    """A scheduled request that did not finish advances by exactly its grant, from 0 if it was preempted before, or from its prefix hit and KV connector tokens when admitted; with speculative decoding, less the drafts rejected (at most those it verified: this step's, or under async scheduling an older batch's)."""
    drafts = dict(output.scheduled_spec_decode_tokens)
    c = after.config
    for rid, n in output.num_scheduled_tokens:
        if not is_live(after, rid):
            continue
        start = output.computed_on_admission(rid, before.requests[rid].num_computed_tokens)
        rejectable = c.num_speculative_tokens if c.async_scheduling else len(drafts.get(rid, ()))
        if not start + n - rejectable <= after.requests[rid].num_computed_tokens <= start + n:
            return violated("num_computed_tokens did not advance by the grant", request=rid,
                            before=start, granted=n, after=after.requests[rid].num_computed_tokens)
    return HOLDS


@prop
def waiting_order_preserved(before, output, after):
    """FCFS: the waiting queue keeps its order, preempted requests go to its front; PRIORITY: it is in (priority, arrival_time, id) order.  Requests holding blocks of a KV load wait before all others, in a queue of their own (those whose load started in the step at its end).  From 0.34.0, with cache-aware admission on, the plainly waiting requests among the first cache_aware_admission_window of the plain queue may trade places with one another (and only with one another)."""
    held = {w for w in after.waiting if kv_connector.holds_loaded_blocks(after.requests[w])}
    if after.config.policy == FCFS:
        admitted = set(output.admitted)
        rest = [w for w in before.waiting if w not in admitted and is_live(after, w)]
        expected = [w for w in rest if kv_connector.holds_loaded_blocks(before.requests[w])]
        expected += [w for w in rest if w in held and w not in expected]
        plain = [v for v in reversed(output.preempted_req_ids) if is_live(after, v)]
        plain += [w for w in rest if w not in held]
        observed = list(after.waiting[len(expected):])
        if observed != plain and reordered_by_cached_prefix(before, output, after, held, observed):
            return HOLDS
        expected += plain
    else:
        key = lambda w: after.requests[w].queue_key  # noqa: E731
        expected = sorted(held, key=key) + sorted((w for w in after.waiting if w not in held), key=key)
    if list(after.waiting) != expected:
        return violated("the waiting queue is out of order", waiting=list(after.waiting), expected=expected)
    return HOLDS


def reorder_window(before: SchedulerState, output: SchedulerOutput) -> list[str]:
    """The requests cache-aware admission (0.34.0, S:2790-2839) may move in this step:
    the plainly waiting ones (WAITING, nothing computed) among the first
    cache_aware_admission_window of the plain queue as the waiting loop starts (the
    step's preempted requests at its front, KV holders apart); [] where the feature
    is off."""
    c = before.config
    if not cache_aware_admission.enabled(c):
        return []
    preempted = list(reversed(output.preempted_req_ids))
    queue = preempted + [w for w in before.waiting if not kv_connector.holds_loaded_blocks(before.requests[w])]
    window = queue[:c.cache_aware_admission_window]
    return [w for w in window if w not in preempted and cache_aware_admission.movable(before.requests[w])]


def reordered_by_cached_prefix(before, output, after, held: set[str], observed: list[str]) -> bool:
    """Whether `observed`, the plain queue after the step, is its FCFS order with
    the window's movable requests (reorder_window) permuted among their own places,
    then the step's admissions, finishes and new KV holders taken out (vLLM reorders
    before it admits).  Which permutation the hits give depends on the pool in the
    middle of the step, which no observer sees: the order itself is judged where a
    step is compared with the spec's (the differential tester, the monitor)."""
    movable = reorder_window(before, output)
    if len(movable) < 2:
        return False
    admitted, preempted = set(output.admitted), set(output.preempted_req_ids)

    def survives(w: str) -> bool:
        return is_live(after, w) and (w in preempted or (w not in admitted and w not in held))

    # The FCFS order with each movable request's place left open ("*"), and the
    # movable requests that survive, each to fill one open place, in any order.
    template = [("*" if w in movable else w) for w in [*reversed(output.preempted_req_ids), *before.waiting]
                if w in movable or survives(w)]
    fill = {w for w in movable if survives(w)}
    if sorted(observed) != sorted([w for w in template if w != "*"] + list(fill)):
        return False
    i = 0
    for slot in template:  # an open place takes the next observed request if it is one of `fill`
        if slot == "*":
            if i < len(observed) and observed[i] in fill:
                i += 1
        elif i < len(observed) and observed[i] == slot:
            i += 1
        else:
            return False
    return i == len(observed)


@prop
def preempted_restart_from_zero(before, output, after):
    """A preempted request is back in waiting with 0 computed tokens, no blocks, status PREEMPTED and one more preemption."""
    if not output.preempted_req_ids:
        return NOT_APPLICABLE
    for rid in output.preempted_req_ids:
        r = after.requests.get(rid)
        if not is_live(after, rid) and after.config.async_scheduling:
            continue  # async: its in-flight token finished it while it waited (held, if its KV is sent)
        if r is None or rid not in after.waiting:
            return violated("a preempted request is not waiting", request=rid)
        if (r.num_computed_tokens != 0 or after.num_blocks(rid) != 0 or r.status != RequestStatus.PREEMPTED
                or r.num_preemptions != before.requests[rid].num_preemptions + 1):
            return violated("a preempted request was not reset", request=rid,
                            num_computed_tokens=r.num_computed_tokens, blocks=after.num_blocks(rid),
                            status=r.status.name, num_preemptions=r.num_preemptions)
    return HOLDS


@prop(engine_flags=("async_scheduling",))
def placeholders_never_negative(before, output, after):
    """Async bookkeeping stays sane: num_output_placeholders, num_in_flight_tokens and num_stale_output_tokens are never negative, and stale tokens are in-flight tokens."""
    for rid, r in after.requests.items():
        if (r.num_output_placeholders < 0 or r.num_in_flight_tokens < 0 or r.num_stale_output_tokens < 0
                or r.num_stale_output_tokens > r.num_in_flight_tokens):
            return violated("async counters out of range", request=rid,
                            num_output_placeholders=r.num_output_placeholders,
                            num_in_flight_tokens=r.num_in_flight_tokens,
                            num_stale_output_tokens=r.num_stale_output_tokens)
    return HOLDS


@prop
def scheduled_within_known_tokens(before, output, after):
    """No request is scheduled beyond num_tokens + num_output_placeholders and the drafts it sends, counted from its num_computed_tokens, or from its prefix hit and KV connector tokens when admitted: a token is computed at most once per admission."""
    drafts = dict(output.scheduled_spec_decode_tokens)
    for rid, n in output.num_scheduled_tokens:
        r = before.requests.get(rid)
        if r is None:
            continue
        start = output.computed_on_admission(rid, r.num_computed_tokens)
        if start + n > r.num_tokens + r.num_output_placeholders + len(drafts.get(rid, ())):
            return violated("scheduled past num_tokens + num_output_placeholders", request=rid,
                            start=start, granted=n, num_tokens=r.num_tokens,
                            num_output_placeholders=r.num_output_placeholders)
    return HOLDS


@prop(engine_flags=("num_speculative_tokens",))
def drafts_sent_are_known(before, output, after):
    """Speculative decoding: the drafts a step sends are a running request's own drafts, a prefix of them, or for an admission num_speculative_tokens -1 paddings (S:1025-1041, 1641-1646); never more than num_speculative_tokens, never an empty list."""
    if not output.scheduled_spec_decode_tokens:
        return NOT_APPLICABLE
    admitted, k = set(output.admitted), before.config.num_speculative_tokens
    for rid, ids in output.scheduled_spec_decode_tokens:
        own = before.requests[rid].spec_token_ids
        ok = ids == (-1,) * k if rid in admitted else 0 < len(ids) and ids == own[:len(ids)]
        if not ok or rid not in output.scheduled:
            return violated("drafts sent that the request does not have", request=rid, sent=list(ids),
                            drafts=list(own), admitted=rid in admitted)
    return HOLDS


@prop(engine_flags=("max_loras",))
def max_loras_respected(before, output, after):
    """LoRA: the running requests use at most max_loras distinct adapters (S:1054-1063)."""
    loras = {after.requests[rid].lora_int_id for rid in after.running} - {0}
    if after.config.max_loras is not None and len(loras) > after.config.max_loras:
        return violated("more adapters running than max_loras", adapters=sorted(loras),
                        max_loras=after.config.max_loras)
    return HOLDS


@prop(engine_flags=("grammar_compile_steps",))
def grammar_wait_respected(before, output, after):
    """Structured output: a request whose grammar is still compiling, or failed to compile, is never scheduled (S:1118-1121, S:3685-3697)."""
    waiting = [rid for rid in before.waiting if before.requests[rid].grammar in ("compiling", "failed")]
    if not waiting:
        return NOT_APPLICABLE
    for rid in waiting:
        if rid in output.scheduled:
            return violated("a request waiting for its grammar was scheduled", request=rid,
                            grammar=before.requests[rid].grammar, granted=output.scheduled[rid])
    return HOLDS


@prop(engine_flags=("enable_prefix_caching",))
def block_ref_counts_match_holders(before, output, after):
    """Prefix caching: every block's reference count equals the number of requests holding it, and only live requests hold blocks."""
    pool = after.block_pool
    if pool is None:
        return NOT_APPLICABLE
    holders: dict[int, int] = {}
    for rid, blocks in pool.req_to_blocks.items():
        if blocks and rid not in after.requests:
            return violated("a finished request still holds blocks", request=rid, blocks=list(blocks))
        for b in blocks:
            holders[b] = holders.get(b, 0) + 1
    if holders != dict(pool.ref_cnt):
        wrong = sorted(b for b in set(holders) | set(pool.ref_cnt) if holders.get(b, 0) != pool.ref_cnt.get(b, 0))
        return violated("a block's ref_cnt is not its number of holders", block=wrong[0],
                        ref_cnt=pool.ref_cnt.get(wrong[0], 0), holders=holders.get(wrong[0], 0))
    return HOLDS


@prop(engine_flags=("enable_prefix_caching",))
def kv_pool_partitioned(before, output, after):
    """Prefix caching: held blocks, cached free blocks and uncached free blocks partition the usable pool; the free queue holds each free block once, cached ones behind uncached ones, and num_free_blocks is its length."""
    pool = after.block_pool
    if pool is None:
        return NOT_APPLICABLE
    queue = pool.free_queue()
    held = set(pool.ref_cnt)
    usable = set(range(1, after.config.num_gpu_blocks))
    if len(queue) != len(set(queue)) or held & set(queue) or held | set(queue) != usable:
        return violated("held + free blocks are not a partition of the usable pool",
                        held=len(held), free=len(queue), distinct_free=len(set(queue)), usable=len(usable))
    if after.num_free_blocks != len(queue):
        return violated("num_free_blocks is not the free queue's length", num_free_blocks=after.num_free_blocks,
                        free_queue=len(queue))
    hashed = [b in pool.block_hash for b in queue]
    if hashed != sorted(hashed) and has(after.config, UNHASHED_FREE_BLOCKS_FIRST):  # 0.20.0 mixes them
        return violated("a cached free block is ahead of an uncached one in the free queue")
    for h, blocks in pool.cached.items():
        if not blocks or any(pool.block_hash.get(b) != h for b in blocks):
            return violated("the hash map and the blocks' hashes disagree", blocks=list(blocks))
    if sum(len(v) for v in pool.cached.values()) != len(pool.block_hash):
        return violated("a hashed block is missing from the hash map")
    return HOLDS


@prop(engine_flags=("enable_prefix_caching",))
def prefix_hit_within_shared_prefix(before, output, after):
    """Prefix caching: a hit is whole blocks, leaves at least one token to compute, and covers only blocks whose whole prefix was in the cache when the request was looked up (cached before the step, or by a request granted earlier in it)."""
    if not output.prefix_hits:
        return NOT_APPLICABLE
    c = before.config
    b = c.block_size
    available = set(before.block_pool.cached) if before.block_pool is not None else set()
    hits = dict(output.prefix_hits)
    # In grant order: each grant hashes the request's known full blocks up to what it
    # will have computed (K:642-646), before any later admission's lookup.
    for rid, n in output.num_scheduled_tokens:
        r = before.requests[rid]
        if rid in hits:
            h = hits[rid]
            if h % b or h > r.num_tokens - 1 or h < 0:
                return violated("a hit is not whole blocks leaving a token to compute", request=rid, hit=h,
                                num_tokens=r.num_tokens, block_size=b)
            missing = [i for i in range(h // b) if i >= len(r.block_hashes) or r.block_hashes[i] not in available]
            if missing:
                return violated("a hit covers a block whose prefix was not cached", request=rid, hit=h,
                                block_index=missing[0])
        start = output.computed_on_admission(rid, r.num_computed_tokens)
        available.update(r.block_hashes[:min(start + n, r.num_tokens) // b])
    return HOLDS


@prop(engine_flags=("mm_features",))
def encoder_budget_respected(before, output, after):
    """Encoder inputs: the items one step encodes hold at most max_num_encoder_input_tokens embeddings (S:2203-2210, ECM:148-174)."""
    if not output.scheduled_encoder_inputs:
        return NOT_APPLICABLE
    total = sum(before.requests[rid].mm_features[i].length for rid, ids in output.scheduled_encoder_inputs for i in ids)
    if total > before.config.encoder_compute_budget:
        return violated("a step encodes more embeddings than the encoder budget", total=total,
                        max_num_encoder_input_tokens=before.config.encoder_compute_budget)
    return HOLDS


@prop(engine_flags=("mm_features",))
def encoder_cache_within_capacity(before, output, after):
    """Encoder inputs: the encoder cache's entries, referenced or freeable, hold at most encoder_cache_size embeddings (ECM:148-243)."""
    used = after.encoder_cache.num_used_slots()
    if not used:
        return NOT_APPLICABLE
    if used > after.config.encoder_cache_capacity:
        return violated("the encoder cache holds more embeddings than its size", used=used,
                        encoder_cache_size=after.config.encoder_cache_capacity)
    return HOLDS


@prop(engine_flags=("mm_features",))
def encoder_inputs_available(before, output, after):
    """Encoder inputs: every item a step's chunk reaches is encoded in that step or found in the encoder cache (and not evicted in it), never computed without its embeddings (S:2064-2258)."""
    encoded = {before.requests[rid].mm_features[i].identifier for rid, ids in output.scheduled_encoder_inputs
               for i in ids}
    available = encoded | (set(before.encoder_cache.cached) - set(output.free_encoder_mm_hashes))
    judged = False
    for rid, n in output.num_scheduled_tokens:
        r = before.requests[rid]
        if not r.mm_features:
            continue
        judged = True
        start = output.computed_on_admission(rid, r.num_computed_tokens)
        for i, f in enumerate(r.mm_features):
            if f.offset < start + n and f.offset + f.length > start and f.identifier not in available:
                return violated("a chunk reaches an item neither encoded nor cached", request=rid, item=i,
                                chunk=[start, start + n], item_tokens=[f.offset, f.offset + f.length])
    return HOLDS if judged else NOT_APPLICABLE


def check_step(before: SchedulerState, output: SchedulerOutput, after: SchedulerState) -> dict[str, Verdict]:
    """Every registered property on one step."""
    return {name: p.check(before, output, after) for name, p in PROPERTIES.items()}
