"""The add_request and abort encodings, and the all-roles step, agree with the spec.

tests/test_proofs_agreement.py ties the fixed-role step (first R slots running,
next W waiting) to spec/scheduler.py.  The `inductive:add_request` and
`inductive:abort` obligations use `encoding.add_request` / `encoding.abort`
over slots of any role, and the BMC witnesses unroll the all-roles step
(`schedule_update` with every slot a candidate for both queues).  Here each of
those is evaluated on concrete states (reached by the spec, and drawn directly),
with the requests put into slots in a drawn order, and compared field by field
with `scheduler.add_request`, `scheduler.finish_requests` and `schedule` +
`update_from_output`.  Spec mutants of each transition, and the encoding's own
bad variants, must each make the comparison fail.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machine import configs
from mutants import Mutation, mutated
from test_proofs_agreement import EXPLICIT_STATES, SETTINGS, SPEC_MUTANTS, actions, drawn_states, reached_states
from schedspec.proofs.agreement import (AbortEvaluator, AddEvaluator, AllRolesStepEvaluator, spec_step,
                                        state_shape)
from schedspec.spec import scheduler as S
from schedspec.spec.config import PRIORITY
from schedspec.spec.input_processor import make_request
from schedspec.spec.request import RequestStatus

ADD_SLOTS = 8  # 7 present + the new one
ABORT_SLOTS = 8
ROLES_SLOTS = 6

# A new id that sorts before, between or after the drawn ones ("q0".."q11", "r0"...).
NEW_IDS = ["a", "q05", "q5x", "r", "z"]


def placed(state, n: int, rng: random.Random, first: str | None = None, avoid: int | None = None) -> dict[str, int]:
    """The requests of `state` in a drawn order of slots 0..n-1 (never `avoid`);
    `first` in slot 0."""
    slots = [i for i in range(n) if i != avoid]
    rng.shuffle(slots)
    rids = list(state.requests)
    if first is not None:
        rids.remove(first)
        slots.remove(0)
        out = {first: 0}
    else:
        out = {}
    out.update(zip(rids, slots))
    return out


def new_request(state, rng: random.Random):
    c = state.config
    prompt = rng.randint(1, c.max_model_len - 1)
    arrivals = sorted({r.arrival_time for r in state.requests.values()})
    # ties with an existing arrival and priority are where the queue_key order matters
    arrival = rng.choice(arrivals + [-1.0, 99.0]) if arrivals else 0.0
    rid = rng.choice([i for i in NEW_IDS if i not in state.requests])
    return make_request(c, rid, prompt, rng.choice([None, rng.randint(1, 8)]), rng.randint(0, 3), arrival)


# The per-state choices (slot order, the new request, the abort) come from a
# seeded random.Random, not from hypothesis: a search may then stop at its
# first disagreement without hypothesis seeing its draws change.


def check_add(ev, state, rng, scheduler=S) -> dict | None:
    """None when the encoding agrees; else the difference."""
    if len(state.requests) > ev.n - 1:
        return None
    req = new_request(state, rng)
    got = ev.evaluate(state, req, placed(state, ev.n, rng, avoid=ev.slot))
    exp = state_shape(scheduler.add_request(state, req))
    return None if got == exp else {"state": state, "new": req, "got": got, "exp": exp}


def check_abort(ev, state, rng, scheduler=S) -> dict | None:
    if not state.requests or len(state.requests) > ev.n:
        return None
    rid = rng.choice(sorted(state.requests))
    got = ev.evaluate(state, placed(state, ev.n, rng, first=rid))
    done, after = scheduler.finish_requests(state, [rid], RequestStatus.FINISHED_ABORTED)
    exp = state_shape(after)
    return None if got == exp and done == (rid,) else {"state": state, "abort": rid, "got": got, "exp": exp}


def check_roles(ev, state, output_len, rng, scheduler=S) -> dict | None:
    if not ev.fits(state):
        return None
    ev.slot_of = placed(state, ev.R, rng)
    got, _ = ev.evaluate(state, output_len)
    exp, _ = spec_step(state, output_len, scheduler)
    return None if got == exp else {"state": state, "slots": ev.slot_of, "got": got, "exp": exp}


@pytest.fixture(scope="module")
def evs():
    return {"add": AddEvaluator(ADD_SLOTS), "abort": AbortEvaluator(ABORT_SLOTS),
            "roles": AllRolesStepEvaluator(ROLES_SLOTS)}


def run_all(evs, scheduler=S, stop_at_first=False, examples=(300, 400)) -> tuple[list, dict]:
    """Every check on reached and drawn states; (disagreements, counts)."""
    found, seen = [], {"add": 0, "abort": 0, "roles": 0, "add:priority_tie": 0, "add:nonempty_waiting": 0,
                       "abort:running_with_blocks": 0, "abort:waiting": 0, "roles:preemption": 0,
                       "roles:scrambled": 0}

    def one(state, output_len, seed):
        if stop_at_first and found:
            return
        rng = random.Random(seed)
        for kind in ("add", "abort", "roles"):
            try:
                if kind == "add":
                    bad = check_add(evs["add"], state, rng, scheduler)
                elif kind == "abort":
                    bad = check_abort(evs["abort"], state, rng, scheduler)
                else:
                    bad = check_roles(evs["roles"], state, output_len, rng, scheduler)
            except (AssertionError, ValueError, KeyError, IndexError) as e:
                bad = {"crash": repr(e)}  # a mutant that crashes disagrees too
            if bad is not None:
                found.append((kind, bad))
                return
        seen["add"] += len(state.requests) <= ADD_SLOTS - 1
        seen["abort"] += 0 < len(state.requests) <= ABORT_SLOTS
        seen["roles"] += len(state.requests) <= ROLES_SLOTS
        c = state.config
        if c.policy == PRIORITY and len({(r.priority, r.arrival_time) for r in state.requests.values()}) \
                < len(state.requests):
            seen["add:priority_tie"] += 1
        if state.waiting:
            seen["add:nonempty_waiting"] += 1
        if any(state.num_blocks(r) for r in state.running):
            seen["abort:running_with_blocks"] += 1
        if state.waiting:
            seen["abort:waiting"] += 1
        if len(state.requests) <= ROLES_SLOTS and state.running and state.waiting:
            seen["roles:scrambled"] += 1
        if len(state.requests) <= ROLES_SLOTS and spec_step(state, output_len, scheduler)[0]["preempted_req_ids"]:
            seen["roles:preemption"] += 1

    @settings(max_examples=examples[0], **SETTINGS)
    @given(config=configs(wave2=False), acts=actions, seed=st.integers(0, 2**32))
    def reached(config, acts, seed):
        for k, (state, output_len) in enumerate(reached_states(config, acts, scheduler)):
            one(state, output_len, seed + k)

    @settings(max_examples=examples[1], **SETTINGS)
    @given(drawn=drawn_states(), seed=st.integers(0, 2**32))
    def direct(drawn, seed):
        one(*drawn, seed)

    # The hand-made states of the fixed-role test (a PRIORITY refund, a victim
    # behind the cursor, ...), each in several slot orders.
    @settings(max_examples=40, **SETTINGS)
    @given(make=st.sampled_from(EXPLICIT_STATES), seed=st.integers(0, 2**32))
    def explicit(make, seed):
        one(*make(), seed)

    explicit()
    if not (stop_at_first and found):
        direct()
    if not (stop_at_first and found):
        reached()
    return found, seen


def test_add_abort_and_all_roles_agree_with_spec(evs):
    found, seen = run_all(evs)
    assert not found, found[:3]
    # Not vacuous: many states of each kind, and the paths that matter.
    assert seen["add"] >= 1000 and seen["abort"] >= 400 and seen["roles"] >= 1000, seen
    assert all(seen[k] >= 20 for k in seen), seen


M = Mutation
TRANSITION_MUTANTS = {
    "add_at_front": [M("scheduler.add_request", "enqueue(state.config.policy, waiting, requests, "
                       "request.request_id, front=False)", "enqueue(state.config.policy, waiting, requests, "
                       "request.request_id, front=True)")],
    "priority_ignored_on_add": [M("scheduler.enqueue", "policy == PRIORITY", "policy == PRIORITY and front")],
    "abort_keeps_blocks": [M("scheduler.remove_finished", "w.kv.free(rid)", "pass")],
    "abort_reorders_waiting": [M("scheduler.remove_finished",
                                 "w.waiting = deque(x for x in w.waiting if x not in gone)",
                                 "w.waiting = deque(sorted(x for x in w.waiting if x not in gone))")],
}
# Step mutants the all-roles form must catch as the fixed-role form does.
ROLES_MUTANTS = ("fcfs_victim_head", "no_cursor_fix", "no_refund", "preempted_to_back", "budget_off_by_one")


@pytest.mark.parametrize("name", sorted(TRANSITION_MUTANTS) + [f"step:{m}" for m in ROLES_MUTANTS])
def test_spec_mutant_is_caught(evs, name):
    muts = SPEC_MUTANTS[name[5:]] if name.startswith("step:") else TRANSITION_MUTANTS[name]
    with mutated(muts) as mutant:
        found, _ = run_all(evs, mutant, stop_at_first=True)
    assert found, f"the spec mutant {name} agrees with the encodings on every state tried"
    if name.startswith("step:"):
        assert any(kind == "roles" for kind, _ in found), found[0]


@pytest.mark.parametrize("variant, kind", [("add_at_front", "add"), ("abort_leaks_blocks", "abort"),
                                           ("preempted_to_back", "roles"), ("victim_head_of_running", "roles")])
def test_bad_encoding_variant_is_caught(variant, kind):
    """The comparison also notices a wrong encoding, not only a wrong spec."""
    evs = {"add": AddEvaluator(ADD_SLOTS, variant if kind == "add" else "correct"),
           "abort": AbortEvaluator(ABORT_SLOTS, variant if kind == "abort" else "correct"),
           "roles": AllRolesStepEvaluator(ROLES_SLOTS, variant if kind == "roles" else "correct")}
    found, _ = run_all(evs, stop_at_first=True)
    assert found and found[0][0] == kind, found[:1]
