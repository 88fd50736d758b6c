"""Each registered property (spec/properties.py) and each state invariant
(spec/invariants.py) as a z3 formula over the symbolic state and decision.

`PROPERTY_FORMULAS[name](before, decision, after) -> (applicable, holds)` and
`INVARIANT_FORMULAS[name](state) -> holds`, one per registry name and named
after it.  They are not a second definition: tests/test_proofs_agreement.py
evaluates each one on the same concrete steps as the Python predicate and
requires the same verdict, holds and applicable alike, on correct and broken
rules.  The only difference is representational: in slots a request cannot
appear twice, so the duplicate checks of the predicates are vacuous here.
"""

from __future__ import annotations

from typing import Callable

import z3

from schedspec.spec.versions import INPUT_BUDGET, LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL, LONG_PREFILL_THRESHOLD_NEEDS_TWO

from .encoding import SymDecision, z3_max0, z3_min
from .symbolic import PREEMPTED, RUNNING, WAITING, SymSlot, SymState, key_lt, priority_key_le

T = z3.BoolVal(True)


def _sum(xs):
    return z3.Sum(list(xs) + [z3.IntVal(0)])


def _granted(d: SymDecision, s: int):
    return z3.If(d.scheduled[s], d.num_scheduled_tokens[s], 0)


def step_budget(st: SymState):
    """spec/properties.py get_step_budget."""
    if not st.config.release.applies(INPUT_BUDGET):
        return st.config.token_budget
    return z3_min(st.config.token_budget, st.config.max_num_batched_tokens)


def long_prefill_threshold(st: SymState):
    """spec/properties.py get_long_prefill_threshold."""
    c = st.config
    in_force = z3.BoolVal(True)
    if c.release.applies(LONG_PREFILL_THRESHOLD_NEEDS_TWO):
        in_force = st.num_running + st.num_waiting > 1
    if c.release.applies(LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL):
        in_force = z3.And(in_force, c.enable_chunked_prefill)
    return z3.If(in_force, c.long_prefill_token_threshold, 0)


def capped_need(st: SymState, r: SymSlot):
    n = r.num_tokens - r.num_computed_tokens
    th = long_prefill_threshold(st)
    n = z3.If(z3.And(0 < th, th < n), th, n)
    return z3_max0(z3_min(n, st.config.max_model_len - r.num_computed_tokens - 1))


def block_demand(st: SymState, r: SymSlot, k):
    c = st.config
    return z3_max0(c.cdiv(z3_min(r.num_computed_tokens + k, c.max_model_len)) - r.num_blocks)


def expected_victims(st: SymState, count):
    """Per slot: is it among the first `count` victims the policy names, and which
    (spec/properties.py get_expected_victims)."""
    N = len(st.slots)
    alive = [s.in_running for s in st.slots]
    slots = st.slots
    # Slots that can never be running (a constant queue flag) are no candidates.
    cand = [s for s in range(N) if not z3.is_false(z3.simplify(alive[s]))]
    beats = {}
    for s in cand:
        for t in cand:
            if s != t:
                a, b = slots[s], slots[t]
                prio = z3.Or(z3.Not(priority_key_le(a, b)),
                             z3.And(priority_key_le(a, b), priority_key_le(b, a), a.pos < b.pos))
                beats[s, t] = z3.If(st.config.is_priority, prio, a.pos > b.pos)
    index = [z3.IntVal(-1)] * N
    for j in range(len(cand)):
        isv = {s: z3.And([alive[s]] + [z3.Implies(alive[t], beats[s, t]) for t in cand if t != s]) for s in cand}
        for s in cand:
            index[s] = z3.If(z3.And(isv[s], j < count), j, index[s])
            alive[s] = z3.And(alive[s], z3.Not(isv[s]))
    return index


PROPERTY_FORMULAS: dict[str, Callable] = {}


def formula(fn):
    PROPERTY_FORMULAS[fn.__name__] = fn
    return fn


@formula
def token_budget_respected(before: SymState, d: SymDecision, after: SymState):
    total = _sum(_granted(d, s) for s in range(len(before.slots)))
    c = before.config
    return T, z3.And(total <= c.token_budget, total <= c.max_num_batched_tokens)


@formula
def grants_positive(before, d, after):
    return T, z3.And([z3.Implies(d.scheduled[s], d.num_scheduled_tokens[s] >= 1) for s in range(len(before.slots))])


@formula
def running_before_waiting(before, d, after):
    N = len(before.slots)
    applicable = z3.Or(list(d.admitted))
    conds = []
    for s in range(N):
        r = before.slots[s]
        need = capped_need(before, r)
        conds.append(z3.Implies(z3.And(r.in_running, need > 0), _granted(d, s) == need))
    running_total = _sum(z3.If(before.slots[s].in_running, _granted(d, s), 0) for s in range(N))
    admitted_total = _sum(z3.If(d.admitted[s], _granted(d, s), 0) for s in range(N))
    conds.append(admitted_total <= step_budget(before) - running_total)
    return applicable, z3.And(conds)


@formula
def preemption_only_on_allocation_failure(before, d, after):
    N = len(before.slots)
    applicable = z3.Or(list(d.preempted))
    demand = _sum(z3.If(r.in_running, block_demand(before, r, capped_need(before, r)), 0) for r in before.slots)
    count = _sum(z3.If(p, 1, 0) for p in d.preempted)
    index = expected_victims(before, count)
    rank = [_sum(z3.If(z3.And(d.preempted[t], d.preempt_seq[t] < d.preempt_seq[s]), 1, 0)
                 for t in range(N) if t != s) for s in range(N)]
    victims_ok = z3.And([z3.And(z3.Implies(d.preempted[s], index[s] == rank[s]),
                                z3.Implies(index[s] >= 0, d.preempted[s])) for s in range(N)])
    return applicable, z3.And(z3.Not(z3.Or(list(d.admitted))), demand > before.num_free_blocks, victims_ok)


@formula
def starvation_condition(before, d, after):
    N = len(before.slots)
    c = before.config
    slots = before.slots
    decodes_only = z3.And([z3.Implies(r.in_running, r.num_tokens - r.num_computed_tokens == 1) for r in slots])
    D = before.num_running
    B = step_budget(before)
    fed = z3.Or([z3.And(slots[s].in_waiting, d.scheduled[s]) for s in range(N)])
    is_head = [z3.And(r.in_waiting, r.pos == 0) for r in slots]
    blocks_needed = (_sum(z3.If(r.in_running, block_demand(before, r, 1), 0) for r in slots)
                     + _sum(z3.If(is_head[s], c.cdiv(slots[s].num_tokens), 0) for s in range(N))
                     + c.watermark_blocks)
    th = long_prefill_threshold(before)
    head_ok = []
    for s in range(N):
        r = slots[s]
        need = r.num_tokens - r.num_computed_tokens
        need = z3.If(z3.And(0 < th, th < need), th, need)
        head_ok.append(z3.Implies(is_head[s], _granted(d, s) == z3_min(need, B - D)))
    feeds = z3.And(c.enable_chunked_prefill, D < c.max_num_active_reqs, blocks_needed <= before.num_free_blocks)
    applicable = z3.And(before.num_waiting > 0, decodes_only, z3.Or(D >= B, feeds))
    holds = z3.If(D >= B, z3.Not(fed), z3.And(head_ok))
    return applicable, holds


@formula
def max_num_seqs_respected(before, d, after):
    return T, after.num_running <= after.config.max_num_active_reqs


def _blocks_exact(st: SymState):
    c = st.config
    return z3.And([z3.Implies(r.present, r.num_blocks == c.cdiv(z3_min(r.num_computed_tokens, c.max_model_len)))
                   for r in st.slots])


def _blocks_conserved(st: SymState):
    held = _sum(z3.If(r.present, r.num_blocks, 0) for r in st.slots)
    return z3.And(st.num_free_blocks >= 0, held + st.num_free_blocks == st.config.num_usable_blocks)


@formula
def kv_blocks_conserved(before, d, after):
    return T, z3.And(_blocks_conserved(after), _blocks_exact(after))


@formula
def computed_tokens_bounded(before, d, after):
    return T, z3.And([z3.Implies(r.present, z3.And(0 <= r.num_computed_tokens, r.num_computed_tokens <= r.num_tokens))
                      for r in after.slots])


@formula
def scheduled_within_known_tokens(before, d, after):
    # Flags off: no prefix hits and no placeholders, so a grant starts at the
    # request's num_computed_tokens (0 for an admission) and ends by num_tokens.
    return T, z3.And([z3.Implies(d.scheduled[s], before.slots[s].num_computed_tokens + d.num_scheduled_tokens[s]
                                 <= before.slots[s].num_tokens) for s in range(len(before.slots))])


@formula
def scheduled_requests_run(before, d, after):
    N = len(before.slots)
    return T, z3.And([z3.Implies(d.scheduled[s], z3.And(
        z3.Or(before.slots[s].in_running, d.admitted[s]),
        z3.Implies(after.slots[s].present, after.slots[s].in_running))) for s in range(N)])


@formula
def computed_tokens_advance_by_grant(before, d, after):
    N = len(before.slots)
    return T, z3.And([z3.Implies(z3.And(d.scheduled[s], after.slots[s].present),
                                 after.slots[s].num_computed_tokens
                                 == before.slots[s].num_computed_tokens + d.num_scheduled_tokens[s])
                      for s in range(N)])


@formula
def waiting_order_preserved(before, d, after):
    N = len(before.slots)
    b, a = before.slots, after.slots
    # FCFS: the victims, last first, then the waiting queue less the admissions.
    expected = [z3.And(a[s].present, z3.Or(d.preempted[s], z3.And(b[s].in_waiting, z3.Not(d.admitted[s]))))
                for s in range(N)]
    n_pre = _sum(z3.If(z3.And(expected[t], d.preempted[t]), 1, 0) for t in range(N))
    pos = []
    for s in range(N):
        later_victims = _sum(z3.If(z3.And(expected[t], d.preempted[t], d.preempt_seq[t] > d.preempt_seq[s]), 1, 0)
                             for t in range(N) if t != s)
        ahead = _sum(z3.If(z3.And(expected[t], z3.Not(d.preempted[t]), b[t].pos < b[s].pos), 1, 0)
                     for t in range(N) if t != s)
        pos.append(z3.If(d.preempted[s], later_victims, n_pre + ahead))
    fcfs = z3.And([z3.And(a[s].in_waiting == expected[s], z3.Implies(expected[s], a[s].pos == pos[s]))
                   for s in range(N)])
    prio = _queue_key_ordered(after)
    return T, z3.If(after.config.is_priority, prio, fcfs)


def _queue_key_ordered(st: SymState):
    a = st.slots
    N = len(a)
    return z3.And([z3.Implies(z3.And(a[s].in_waiting, a[t].in_waiting, a[s].pos < a[t].pos), key_lt(a[s], a[t]))
                   for s in range(N) for t in range(N) if s != t])


@formula
def preempted_restart_from_zero(before, d, after):
    N = len(before.slots)
    a = after.slots
    return z3.Or(list(d.preempted)), z3.And([z3.Implies(d.preempted[s], z3.And(
        a[s].in_waiting, a[s].num_computed_tokens == 0, a[s].num_blocks == 0, a[s].status == PREEMPTED,
        a[s].num_preemptions == before.slots[s].num_preemptions + 1)) for s in range(N)])


# --- the state invariant -----------------------------------------------------------------------

INVARIANT_FORMULAS: dict[str, Callable[[SymState], z3.BoolRef]] = {}


def inv(fn):
    INVARIANT_FORMULAS[fn.__name__] = fn
    return fn


def _dense(st: SymState, queue) -> z3.BoolRef:
    a = st.slots
    N = len(a)
    members = [queue(r) for r in a]
    size = _sum(z3.If(m, 1, 0) for m in members)
    out = [z3.Implies(members[s], z3.And(0 <= a[s].pos, a[s].pos < size)) for s in range(N)]
    out += [z3.Implies(z3.And(members[s], members[t]), a[s].pos != a[t].pos)
            for s in range(N) for t in range(s + 1, N)]
    return z3.And(out)


@inv
def queues_partition_requests(st: SymState):
    a = st.slots
    N = len(a)
    ids = [z3.Implies(z3.And(a[s].present, a[t].present), a[s].rid_rank != a[t].rid_rank)
           for s in range(N) for t in range(s + 1, N)]
    return z3.And([_dense(st, lambda r: r.in_running), _dense(st, lambda r: r.in_waiting)] + ids)


@inv
def statuses_match_queues(st: SymState):
    return z3.And([z3.And(z3.Implies(r.in_running, r.status == RUNNING),
                          z3.Implies(r.in_waiting, z3.Or(r.status == WAITING, r.status == PREEMPTED)))
                   for r in st.slots])


@inv
def request_lengths_valid(st: SymState):
    L = st.config.max_model_len
    return z3.And([z3.Implies(r.present, z3.And(
        1 <= r.num_prompt_tokens, r.num_prompt_tokens < L, r.num_tokens < L, 0 <= r.num_output_tokens,
        r.num_output_tokens < r.max_tokens, r.num_preemptions >= 0, r.output_len >= 0)) for r in st.slots])


@inv
def computed_tokens_below_num_tokens(st: SymState):
    return z3.And([z3.Implies(r.present, z3.And(0 <= r.num_computed_tokens, r.num_computed_tokens < r.num_tokens))
                   for r in st.slots])


@inv
def waiting_requests_hold_nothing(st: SymState):
    return z3.And([z3.Implies(r.in_waiting, z3.And(r.num_computed_tokens == 0, r.num_blocks == 0)) for r in st.slots])


@inv
def blocks_match_computed_tokens(st: SymState):
    return _blocks_exact(st)


@inv
def blocks_conserved(st: SymState):
    return _blocks_conserved(st)


@inv
def running_within_limit(st: SymState):
    return st.num_running <= st.config.max_num_active_reqs


@inv
def waiting_queue_ordered(st: SymState):
    a = st.slots
    N = len(a)
    fcfs = z3.And([z3.Implies(z3.And(a[s].in_waiting, a[t].in_waiting, a[s].status == WAITING,
                                     a[t].status != WAITING), a[t].pos < a[s].pos)
                   for s in range(N) for t in range(N) if s != t])
    return z3.If(st.config.is_priority, _queue_key_ordered(st), fcfs)


def state_invariant(st: SymState) -> z3.BoolRef:
    """The whole state invariant, with the config's acceptance."""
    return z3.And([st.config.constraints()] + [f(st) for f in INVARIANT_FORMULAS.values()])
