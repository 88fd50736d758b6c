"""The z3 step encoding (proofs/encoding.py) agrees with spec/scheduler.py.

The encoding is evaluated (substitute the concrete values, simplify) on
hypothesis-drawn states — states the spec reaches from random configs and
actions, and states drawn directly that satisfy the state invariant — and every
output field is compared with what the spec computes: grants in order,
new/resumed/running-scheduled, preemptions in order, sampled, finished, and the
next state (statuses, counters, running and waiting orders, blocks, free
blocks).  The rule paths every proof rests on must each be exercised
(`FEATURES`), and one-line mutants of the spec must make the comparison fail.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from machine import configs
from mutants import Mutation, mutated
from schedspec.proofs.agreement import StepEvaluator, spec_step
from schedspec.spec import scheduler as S
from schedspec.spec.config import PRIORITY, SchedulerConfig, validate_config
from schedspec.spec.invariants import check_state
from schedspec.spec.kv_cache import cdiv
from schedspec.spec.request import Request, RequestStatus
from schedspec.spec.input_processor import make_request
from schedspec.spec.kv_cache import BlockCounts
from schedspec.spec.state import SchedulerState

MAX_RUNNING = MAX_WAITING = 6
# derandomize: the coverage assertion below must not depend on the run's luck.
SETTINGS = dict(deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))


# --- concrete states -----------------------------------------------------------------------------

actions = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(1, 47), st.one_of(st.none(), st.integers(1, 12)),
              st.one_of(st.none(), st.integers(1, 12)), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("abort"), st.integers(0, 100)),
    st.tuples(st.just("step")), st.tuples(st.just("step")), st.tuples(st.just("step")),
    st.tuples(st.just("step")),
), min_size=1, max_size=60)


def reached_states(config: SchedulerConfig, acts, scheduler=S):
    """Run `acts` on the spec; yield (state before each step, output_len)."""
    state, output_len, n = SchedulerState(config), {}, 0
    for a in acts:
        if a[0] == "add":
            _, prompt, max_tokens, out_len, priority, tie = a
            rid = f"r{n}"
            arrival = float(n - 1 if tie and n else n)
            n += 1
            output_len[rid] = out_len
            state = scheduler.add_request(state, make_request(config, rid, min(prompt, config.max_model_len - 1),
                                                              max_tokens, priority, arrival))
        elif a[0] == "abort" and state.requests:
            rid = sorted(state.requests)[a[1] % len(state.requests)]
            _, state = scheduler.finish_requests(state, [rid], RequestStatus.FINISHED_ABORTED)
        elif a[0] == "step":
            yield state, output_len
            _, (_, state) = spec_step(state, output_len, scheduler)


@st.composite
def drawn_states(draw):
    """A state drawn directly (not necessarily reachable) that satisfies the state
    invariant; small pools and near-full lengths make preemption and caps likely."""
    c = draw(configs(wave2=False))
    L, bs = c.max_model_len, c.block_size
    reqs, blocks, output_len = {}, {}, {}
    n_run = draw(st.integers(0, MAX_RUNNING))
    if n_run > c.max_num_active_reqs:  # make room, so that full running lists are drawn too
        seqs = max(c.max_num_seqs, n_run)
        c = dataclasses.replace(c, max_num_seqs=seqs, max_num_active_seqs=None,
                                max_num_batched_tokens=max(c.max_num_batched_tokens, seqs))
    n_wait = draw(st.integers(0, MAX_WAITING))
    running, waiting = [], []
    for i in range(n_run + n_wait):
        rid = f"q{i}"
        prompt = draw(st.integers(1, L - 1))
        out = draw(st.integers(0, L - 1 - prompt))
        max_tokens = draw(st.integers(out + 1, out + 4))
        is_running = i < n_run
        if is_running:
            ncomp = draw(st.integers(0, prompt + out - 1))
            status = RequestStatus.RUNNING
        else:
            ncomp = 0
            status = draw(st.sampled_from([RequestStatus.WAITING, RequestStatus.PREEMPTED]))
            if status == RequestStatus.WAITING:
                out = 0
        r = Request(rid, prompt, max_tokens, draw(st.integers(0, 3)), float(draw(st.integers(0, 6))), status,
                    ncomp, out, draw(st.integers(0, 2)))
        reqs[rid] = r
        output_len[rid] = draw(st.one_of(st.none(), st.integers(1, 6)))
        if cdiv(ncomp, bs):
            blocks[rid] = cdiv(ncomp, bs)
        (running if is_running else waiting).append(rid)
    held = sum(blocks.values())
    extra = draw(st.integers(0, 6))
    G = max(held + 1 + extra, 1 + math.ceil(L / bs))
    c = dataclasses.replace(c, num_gpu_blocks=G)
    validate_config(c)
    if c.policy == PRIORITY:
        waiting.sort(key=lambda w: reqs[w].queue_key)
    else:
        waiting.sort(key=lambda w: reqs[w].status != RequestStatus.PREEMPTED)
    s = SchedulerState(config=c, requests=reqs, running=tuple(running), waiting=tuple(waiting), kv_cache=BlockCounts(G - 1 - held, blocks))
    assert all(v.holds for v in check_state(s).values()), {k: v for k, v in check_state(s).items() if not v.holds}
    return s, output_len


def refund_state():
    """PRIORITY: `a` is granted, then `b`'s allocation fails and preempts `a`, whose
    grant is refunded (S:967-973), so `c` gets 3 tokens instead of 2.  Random
    draws reach a refund but rarely one whose budget matters later."""
    c = SchedulerConfig(max_num_batched_tokens=8, max_num_scheduled_tokens=4, max_num_seqs=4, max_model_len=12,
                        block_size=2, num_gpu_blocks=8, policy="priority")
    R = RequestStatus.RUNNING
    reqs = {"a": Request("a", 5, 4, 3, 0.0, R, 5, 1), "b": Request("b", 4, 4, 0, 1.0, R, 4, 1),
            "c": Request("c", 10, 4, 0, 2.0, R, 4, 0)}
    s = SchedulerState(config=c, requests=reqs, running=("a", "b", "c"), waiting=(), kv_cache=BlockCounts(0, {"a": 3, "b": 2, "c": 2}))
    assert all(v.holds for v in check_state(s).values())
    return s, {}


def input_budget_state():
    """The input budget (max_num_batched_tokens 4) binds below the token budget (8):
    a config the random draws reach only now and then."""
    c = SchedulerConfig(max_num_batched_tokens=4, max_num_scheduled_tokens=8, max_num_seqs=4, max_model_len=16,
                        block_size=2, num_gpu_blocks=16)
    reqs = {"a": Request("a", 10, 4, 0, 0.0, RequestStatus.RUNNING, 2, 0)}
    s = SchedulerState(config=c, requests=reqs, running=("a",), waiting=(), kv_cache=BlockCounts(14, {"a": 1}))
    assert all(v.holds for v in check_state(s).values())
    return s, {}


def input_budget_shared_state():
    """The input budget (4) is shared by the grants of a step: `a` takes 3 of it,
    so `b` gets 1 though the token budget (8) has 5 left (S:862, 1020).  The
    draws that make the input budget bind seldom have a second request behind
    the first (scripts/mutation-score.sh found the gap)."""
    c = SchedulerConfig(max_num_batched_tokens=4, max_num_scheduled_tokens=8, max_num_seqs=4, max_model_len=16,
                        block_size=2, num_gpu_blocks=16)
    R = RequestStatus.RUNNING
    reqs = {"a": Request("a", 5, 4, 0, 0.0, R, 2, 0), "b": Request("b", 5, 4, 0, 1.0, R, 2, 0)}
    s = SchedulerState(config=c, requests=reqs, running=("a", "b"), waiting=(), kv_cache=BlockCounts(13, {"a": 1, "b": 1}))
    assert all(v.holds for v in check_state(s).values())
    return s, {}


def input_budget_left_state(left: int):
    """The waiting loop runs while both budgets are above 0 (S:1066): `a` takes
    4 - `left` of the input budget (4), so with one input token left `w` is
    admitted for 1 token, and with none left it is not, though the token budget
    (8) is not spent."""
    c = SchedulerConfig(max_num_batched_tokens=4, max_num_scheduled_tokens=8, max_num_seqs=4, max_model_len=16,
                        block_size=2, num_gpu_blocks=16)
    reqs = {"a": Request("a", 6 - left, 4, 0, 0.0, RequestStatus.RUNNING, 2, 0),
            "w": Request("w", 6, 4, 0, 1.0, RequestStatus.WAITING, 0, 0)}
    s = SchedulerState(config=c, requests=reqs, running=("a",), waiting=("w",), kv_cache=BlockCounts(14, {"a": 1}))
    assert all(v.holds for v in check_state(s).values())
    return s, {}


def exact_fit_state():
    """Chunked prefill off, and the waiting prompt is exactly the step's budget: it is
    admitted (S:1387-1394 stops only on n > budget)."""
    c = SchedulerConfig(max_num_batched_tokens=8, max_num_scheduled_tokens=7, max_num_seqs=4, max_model_len=8,
                        block_size=2, num_gpu_blocks=12, enable_chunked_prefill=False)
    reqs = {"w": Request("w", 7, 1, 0, 0.0, RequestStatus.WAITING, 0, 0)}
    s = SchedulerState(config=c, requests=reqs, running=(), waiting=("w",), kv_cache=BlockCounts(11, {}))
    assert all(v.holds for v in check_state(s).values())
    return s, {}


def full_isl_watermark_state():
    """The full-ISL gate counts the watermark too (K:552-569): `w`'s whole sequence
    (10 blocks) fits the 10 free blocks, but not with the watermark's 1 on top,
    while its first chunk (3 blocks + 1) would.  Random draws rarely meet that window."""
    c = SchedulerConfig(max_num_batched_tokens=4, max_num_seqs=2, max_model_len=12, block_size=1,
                        num_gpu_blocks=14, watermark=0.1)
    reqs = {"a": Request("a", 2, 8, 0, 0.0, RequestStatus.RUNNING, 2, 1),
            "w": Request("w", 10, 1, 0, 1.0, RequestStatus.WAITING, 0, 0)}
    s = SchedulerState(config=c, requests=reqs, running=("a",), waiting=("w",), kv_cache=BlockCounts(11, {"a": 2}))
    assert all(v.holds for v in check_state(s).values())
    return s, {}


def first_admission_watermark_state():
    """The first admission of a step (nothing running) ignores the watermark
    (K:539-546): `w`'s 8 blocks fit the 9 free ones, but not with the watermark's
    3 on top.  Only a prompt near the size of the whole pool meets this window,
    so random draws do not (scripts/mutation-score.sh found the gap)."""
    c = SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=2, max_model_len=9, block_size=1,
                        num_gpu_blocks=10, watermark=0.3)
    reqs = {"w": Request("w", 8, 1, 0, 0.0, RequestStatus.WAITING, 0, 0)}
    s = SchedulerState(config=c, requests=reqs, running=(), waiting=("w",), kv_cache=BlockCounts(9, {}))
    assert all(v.holds for v in check_state(s).values())
    return s, {}


EXPLICIT_STATES = [refund_state, input_budget_state, input_budget_shared_state,
                   functools.partial(input_budget_left_state, 1), functools.partial(input_budget_left_state, 0),
                   exact_fit_state,
                   full_isl_watermark_state, first_admission_watermark_state]


# --- which rule paths a batch of steps exercised ---------------------------------------------------


def features(state: SchedulerState, spec_out) -> set[str]:
    c = state.config
    f = set()
    grants = dict(spec_out["num_scheduled_tokens"])
    pre = spec_out["preempted_req_ids"]
    if pre:
        f.add(f"preemption:{c.policy}")
        idx = {r: i for i, r in enumerate(state.running)}
        processed = [idx[r] for r in list(grants) + pre if r in idx]
        if any(idx[v] < max(processed) and v != r for v in pre for r in pre + list(grants) if r in idx):
            f.add(f"victim before the cursor:{c.policy}")
        if len(pre) > 1:
            f.add("several preemptions")
    # A resumption: an admission from PREEMPTED, sent among the new requests from 0.34.0.
    if any(state.requests[r].status == RequestStatus.PREEMPTED
           for r in spec_out["scheduled_new_reqs"] + spec_out["scheduled_resumed_reqs"]):
        f.add("resumed")
    if any(state.requests[r].status != RequestStatus.PREEMPTED for r in spec_out["scheduled_new_reqs"]):
        f.add("admitted")
    if state.waiting and not spec_out["scheduled_new_reqs"] + spec_out["scheduled_resumed_reqs"] and not pre:
        if len(state.running) >= c.max_num_active_reqs:
            f.add("admission stopped: run slots")
        elif not c.enable_chunked_prefill:
            f.add("admission stopped: chunked prefill off")
        elif c.scheduler_reserve_full_isl:
            f.add("admission stopped: full-ISL gate or pool")
        else:
            f.add("admission stopped: pool")
    if c.watermark and spec_out["scheduled_new_reqs"] and state.running:
        f.add("watermark")
    if c.long_prefill_token_threshold and any(n == c.long_prefill_token_threshold for n in grants.values()):
        f.add("threshold")
    if c.token_budget < c.max_num_batched_tokens and sum(grants.values()) == c.token_budget:
        f.add("token budget exhausted")
    if c.max_num_batched_tokens < c.token_budget and sum(grants.values()) == c.max_num_batched_tokens:
        f.add("input budget exhausted")
    for _, status in spec_out["finished"]:
        f.add(f"finished:{status}")
    if len(state.running) == MAX_RUNNING:
        f.add("6 running")
    if len(state.waiting) == MAX_WAITING:
        f.add("6 waiting")
    return f


FEATURES = {
    "preemption:fcfs", "preemption:priority", "victim before the cursor:priority", "several preemptions",
    "resumed", "admitted", "admission stopped: run slots", "admission stopped: chunked prefill off",
    "admission stopped: full-ISL gate or pool", "admission stopped: pool", "watermark", "threshold",
    "token budget exhausted", "input budget exhausted", f"finished:{int(RequestStatus.FINISHED_STOPPED)}",
    f"finished:{int(RequestStatus.FINISHED_LENGTH_CAPPED)}", "6 running", "6 waiting",
}


@pytest.fixture(scope="module")
def evaluator():
    return StepEvaluator("correct", MAX_RUNNING, MAX_WAITING)


def compare(ev, state, output_len, scheduler=S) -> tuple[dict, dict]:
    got, _ = ev.evaluate(state, output_len)
    exp, _ = spec_step(state, output_len, scheduler)
    return got, exp


def test_encoding_agrees_with_spec(evaluator):
    seen = Counter()
    covered: set[str] = set()

    def check(state, output_len):
        if not evaluator.fits(state):
            return
        got, exp = compare(evaluator, state, output_len)
        diff = {k: (exp[k], got.get(k)) for k in exp if exp[k] != got.get(k)}
        assert not diff and "positions_not_dense" not in got, (state, output_len, diff, got)
        seen["states"] += 1
        covered.update(features(state, exp))

    @settings(max_examples=450, **SETTINGS)
    @given(config=configs(wave2=False), acts=actions)
    def reached(config, acts):
        for state, output_len in reached_states(config, acts):
            check(state, output_len)

    @settings(max_examples=500, **SETTINGS)
    @given(drawn=drawn_states())
    def direct(drawn):
        check(*drawn)

    for make in EXPLICIT_STATES:
        check(*make())
    reached()
    reached_count = seen["states"] - len(EXPLICIT_STATES)
    direct()
    assert reached_count >= 1000, seen
    assert seen["states"] - reached_count >= 400, seen
    missing = FEATURES - covered
    assert not missing, f"rule paths the agreement test never exercised: {sorted(missing)}"


# --- sensitivity: a one-line change to the spec must show up as a disagreement ---------------------

M = Mutation
SPEC_MUTANTS = {
    "budget_off_by_one": [M("scheduler.ScheduleWork.__init__", "c.token_budget", "c.token_budget + 1")],
    "threshold_one_eligible": [M("config.long_prefill_threshold", "num_eligible <= 1", "num_eligible <= 0")],
    "fcfs_victim_head": [M("scheduler.choose_victim", "s.running[-1]", "s.running[0]")],
    "no_cursor_fix": [M("scheduler.preempt", "v < s.cursor", "False")],
    "no_refund": [M("scheduler.preempt", "s.token_budget += refund\ns.input_budget += refund + s.draft_slots", "pass")],
    "watermark_on_first_admission": [M("kv_cache.allocate_slots",
                                       "has_scheduled_reqs and (request.status == WAITING or request.status == PREEMPTED)",
                                       "request.status == WAITING or request.status == PREEMPTED")],
    "full_isl_without_watermark": [M("kv_cache.allocate_slots",
                                     "full + num_evictable_hit_blocks + watermark_blocks > num_free_blocks",
                                     "full + num_evictable_hit_blocks > num_free_blocks")],
    "allocation_needs_spare_block": [M("kv_cache.allocate_slots",
                                       "new_blocks + num_evictable_hit_blocks + watermark_blocks > num_free_blocks - "
                                       "reserved_blocks",
                                       "new_blocks + num_evictable_hit_blocks + watermark_blocks >= num_free_blocks - "
                                       "reserved_blocks")],
    "chunked_off_fit_strict": [M("guards.stops_admission", "not s.config.enable_chunked_prefill and n > budget",
                                 "not s.config.enable_chunked_prefill and n >= budget")],
    "admit_after_preemption": [M("scheduler.schedule", "not s.preempted", "True")],
    "length_check_strict": [M("scheduler.check_stop", "request.num_tokens >= max_model_len",
                              "request.num_tokens > max_model_len")],
    "preempted_to_back": [M("scheduler.preempt", "enqueue(s.config.policy, s.waiting, s.requests, victim, front=True)",
                            "enqueue(s.config.policy, s.waiting, s.requests, victim, front=False)")],
}


@pytest.mark.parametrize("name", sorted(SPEC_MUTANTS))
def test_agreement_detects_spec_mutant(evaluator, name):
    with mutated(SPEC_MUTANTS[name]) as mutant:
        found = []

        def check(state, output_len):
            if found or not evaluator.fits(state):
                return
            try:
                got, exp = compare(evaluator, state, output_len, mutant)
            except (AssertionError, ValueError, KeyError, IndexError):
                found.append("the mutant crashed")  # a crash is a disagreement too
                return
            if got != exp:
                found.append((state, got, exp))

        @settings(max_examples=300, **SETTINGS)
        @given(config=configs(wave2=False), acts=actions)
        def reached(config, acts):
            for state, output_len in reached_states(config, acts):
                check(state, output_len)
                if found:
                    return

        @settings(max_examples=300, **SETTINGS)
        @given(drawn=drawn_states())
        def direct(drawn):
            check(*drawn)

        for make in EXPLICIT_STATES:
            check(*make())
        if not found:
            direct()
        if not found:
            reached()
    assert found, f"the spec mutant {name} agrees with the encoding on every state tried"
