"""One test per rule of the core scope, on hand-made states."""

import pytest

from helpers import add, config, running_state, step
from schedspec.spec import scheduler as S
from schedspec.spec.kv_cache import allocate_slots
from schedspec.spec.request import EOS_TOKEN_ID, Request, RequestStatus
from schedspec.spec.kv_cache import BlockCounts
from schedspec.spec.state import SchedulerState

W, R, P = RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED


# --- the seed's numbers on the exact seed state: 10 running decodes, a 24-token prompt waiting


@pytest.mark.parametrize("budget, decodes, prefill", [(8, 8, 0), (16, 10, 6), (32, 10, 22)])
def test_table3(budget, decodes, prefill):
    c = config(max_num_batched_tokens=32, max_num_scheduled_tokens=budget, max_num_seqs=32)
    state = add(running_state(c, 10), "prompt", 24)
    out, _ = S.schedule(state)
    granted = out.scheduled
    assert sum(1 for r in granted if r.startswith("d")) == decodes
    assert granted.get("prompt", 0) == prefill
    if budget == 8:  # no rotation: the first eight, every step
        assert [r for r, _ in out.num_scheduled_tokens] == [f"d{i}" for i in range(8)]


def test_table3_b16_takes_four_steps_then_b32_takes_two():
    for budget, chunks in ((16, [6, 6, 6, 6]), (32, [22, 2])):
        c = config(max_num_batched_tokens=32, max_num_scheduled_tokens=budget, max_num_seqs=32)
        state = add(running_state(c, 10), "prompt", 24)
        got = []
        for _ in chunks:
            out, _, state = step(state)
            got.append(out.scheduled["prompt"])
        assert got == chunks


def test_group_b_starves_the_prompt():
    c = config(max_num_batched_tokens=32, max_num_scheduled_tokens=16, max_num_seqs=32)
    state = add(running_state(c, 16), "prompt", 24)
    for _ in range(5):
        out, _, state = step(state)
        assert "prompt" not in out.scheduled and len(out.num_scheduled_tokens) == 16


# --- running loop


def test_long_prefill_threshold_only_with_more_than_one_eligible_request():
    c = config(long_prefill_token_threshold=10)
    out, _ = S.schedule(add(SchedulerState(c), "a", 40))
    assert out.scheduled == {"a": 40}  # alone: the whole budget (S:773-779)
    out, _ = S.schedule(add(add(SchedulerState(c), "a", 40), "b", 40))
    assert out.scheduled == {"a": 10, "b": 10}


def test_threshold_caps_running_prefill_chunks():
    c = config(max_num_batched_tokens=16, long_prefill_token_threshold=4)
    state = add(add(SchedulerState(c), "a", 30), "b", 30)
    out, _, state = step(state)
    out, _, state = step(state)
    assert out.scheduled == {"a": 4, "b": 4}


def test_model_length_cap_gives_zero_and_skips_not_stops():
    c = config(max_model_len=64)
    # A hand-made running request whose next position would reach max_model_len.
    full = Request("full", 63, max_tokens=10, status=R, num_computed_tokens=63, num_output_tokens=1)
    other = Request("other", 4, max_tokens=10, status=R, num_computed_tokens=4, num_output_tokens=1)
    state = SchedulerState(config=c, requests={"full": full, "other": other}, running=("full", "other"), waiting=(), kv_cache=BlockCounts(c.num_usable_blocks - 5, {"full": 4, "other": 1}))
    out, _ = S.schedule(state)
    assert out.scheduled == {"other": 1}  # cap 3 = L - ncomp - 1 = 0: skipped, scan goes on


def test_budget_exhausted_stops_both_loops():
    c = config(max_num_batched_tokens=16, max_num_scheduled_tokens=3)
    state = add(running_state(c, 3), "w", 5)
    out, _ = S.schedule(state)
    assert out.scheduled == {"d0": 1, "d1": 1, "d2": 1}


def test_input_budget_caps_when_scheduled_budget_is_larger():
    c = config(max_num_batched_tokens=16, max_num_scheduled_tokens=100)
    out, _ = S.schedule(add(SchedulerState(c), "a", 40))
    assert out.scheduled == {"a": 16}


# --- allocate_slots


def test_allocate_slots_none_when_pool_too_small():
    c = config(block_size=4, num_gpu_blocks=17)
    r = Request("a", 8, 10, status=R, num_computed_tokens=8, num_output_tokens=1)
    assert allocate_slots(c, r, 1, 2, 1) == 1
    assert allocate_slots(c, r, 1, 2, 0) is None
    assert allocate_slots(c, r.evolve(num_computed_tokens=7), 1, 2, 0) == 0  # fits in a held block


def test_watermark_only_for_admissions_with_something_running():
    c = config(block_size=4, num_gpu_blocks=101, watermark=0.1)  # int(0.1 * 101) = 10 blocks
    new = Request("a", 8, 10)
    assert allocate_slots(c, new, 8, 0, 11, has_scheduled_reqs=True) is None  # 2 + 10 > 11
    assert allocate_slots(c, new, 8, 0, 12, has_scheduled_reqs=True) == 2
    assert allocate_slots(c, new, 8, 0, 2, has_scheduled_reqs=False) == 2  # first admission
    running = new.evolve(status=R, num_computed_tokens=8)
    assert allocate_slots(c, running, 1, 2, 1, has_scheduled_reqs=True) == 1  # running: no watermark


def test_full_sequence_gate_checks_the_whole_prompt():
    c = config(block_size=4, num_gpu_blocks=101)
    r = Request("a", 40, 10)  # 10 blocks in all
    assert allocate_slots(c, r, 4, 0, 5, full_sequence_must_fit=False) == 1
    assert allocate_slots(c, r, 4, 0, 5, full_sequence_must_fit=True) is None


# --- preemption


def preemption_state(policy: str):
    # 10 usable blocks of 16; two 80-token prompts take 5 each (vLLM test_preempt_during_execution).
    c = config(max_num_batched_tokens=160, max_model_len=160, block_size=16, num_gpu_blocks=11, policy=policy)
    state = add(add(SchedulerState(c), "r0", 80), "r1", 80)
    out, _, state = step(state)
    assert out.scheduled == {"r0": 80, "r1": 80} and state.num_free_blocks == 0
    return state


def test_fcfs_preempts_the_tail_and_blocks_admissions():
    state = add(preemption_state("fcfs"), "late", 1)
    out, _, after = step(state)
    assert out.preempted_req_ids == ("r1",) and out.scheduled == {"r0": 1}
    assert out.admitted == ()  # any preemption cancels every admission (S:1066)
    v = after.requests["r1"]
    assert (v.status, v.num_computed_tokens, v.num_preemptions, after.num_blocks("r1")) == (P, 0, 1, 0)
    assert v.num_output_tokens == 1  # outputs are kept and replayed on resume
    assert after.waiting == ("r1", "late")  # the front of waiting


def test_self_preemption_fcfs_breaks():
    # The tail of running cannot grow and is itself the FCFS victim (S:992-994).
    c = config(max_num_batched_tokens=64, max_model_len=32, block_size=4, num_gpu_blocks=9)
    a = Request("a", 24, 100, status=R, num_computed_tokens=24, num_output_tokens=1)
    b = Request("b", 4, 100, arrival_time=1, status=R, num_computed_tokens=4, num_output_tokens=1)
    state = SchedulerState(config=c, requests={"a": a, "b": b}, running=("a", "b"), waiting=(), kv_cache=BlockCounts(1, {"a": 6, "b": 1}))
    out, after = S.schedule(state)
    assert out.preempted_req_ids == ("b",) and out.scheduled == {"a": 1}
    assert after.running == ("a",) and after.waiting == ("b",)


def test_priority_victim_is_lowest_priority_even_if_already_scheduled():
    # vLLM test_priority_scheduling_preemption: lo is granted first, then preempted for hi; refunded.
    c = config(max_num_batched_tokens=64, max_model_len=80, block_size=16, num_gpu_blocks=6, policy="priority")
    state = add(SchedulerState(c), "lo", 32, priority=5)
    _, _, state = step(state)
    state = add(state, "hi", 32, priority=0)
    out, _, state = step(state)
    assert out.scheduled == {"lo": 1, "hi": 32} and state.num_free_blocks == 0
    out, _, state = step(state)
    assert out.preempted_req_ids == ("lo",)
    assert out.scheduled == {"hi": 1} and out.total_num_scheduled_tokens == 1  # lo's grant refunded
    assert state.running == ("hi",) and state.waiting == ("lo",)


def test_priority_cursor_fix_keeps_the_next_request_scheduled():
    # vLLM test_priority_preemption_bug (#49206): A is preempted from before the cursor; C must run.
    c = config(max_num_batched_tokens=64, max_model_len=80, block_size=16, num_gpu_blocks=6, policy="priority",
               scheduler_reserve_full_isl=False, long_prefill_token_threshold=15)
    A = Request("A", 64, 100, priority=9, arrival_time=0, status=R, num_computed_tokens=48)
    B = Request("B", 15, 100, priority=0, arrival_time=1, status=R, num_computed_tokens=15, num_output_tokens=1)
    C = Request("C", 1, 100, priority=1, arrival_time=2, status=R, num_computed_tokens=1, num_output_tokens=1)
    state = SchedulerState(config=c, requests={"A": A, "B": B, "C": C}, running=("A", "B", "C"), waiting=(), kv_cache=BlockCounts(0, {"A": 3, "B": 1, "C": 1}))
    out, after = S.schedule(state)
    assert out.preempted_req_ids == ("A",)
    assert out.scheduled == {"B": 1, "C": 1} and after.running == ("B", "C")


def test_priority_self_preemption_continues_with_the_next():
    c = config(max_num_batched_tokens=64, max_model_len=32, block_size=4, num_gpu_blocks=9, policy="priority")
    a = Request("a", 31, 100, priority=5, status=R, num_computed_tokens=24)
    b = Request("b", 3, 100, priority=0, arrival_time=1, status=R, num_computed_tokens=3, num_output_tokens=1)
    state = SchedulerState(config=c, requests={"a": a, "b": b}, running=("a", "b"), waiting=(), kv_cache=BlockCounts(1, {"a": 6, "b": 1}))
    out, after = S.schedule(state)
    assert out.preempted_req_ids == ("a",)
    assert out.scheduled == {"b": 1}  # R continues after self-preemption (S:998-1008)


# --- waiting loop


def test_run_slot_check_uses_max_num_active_seqs():
    c = config(max_num_seqs=4, max_num_active_seqs=2)
    state = SchedulerState(c)
    for i in range(4):
        state = add(state, f"r{i}", 2)
    out, _ = S.schedule(state)
    assert out.scheduled_new_reqs == ("r0", "r1")


def test_chunked_prefill_off_stops_admission_at_the_first_misfit():
    # vLLM test_schedule_order: 800, 800, 10, 10 with B=1024, M=3.
    for chunked, expected in ((True, {"a": 800, "b": 224}), (False, {"a": 800})):
        c = config(max_num_batched_tokens=1024, max_num_seqs=3, max_model_len=1024, enable_chunked_prefill=chunked)
        state = SchedulerState(c)
        for rid, n in (("a", 800), ("b", 800), ("c", 10), ("d", 10)):
            state = add(state, rid, n)
        out, _ = S.schedule(state)
        assert out.scheduled == expected


def test_allocation_failure_stops_admission_never_skips():
    c = config(block_size=4, num_gpu_blocks=8, max_model_len=28)  # 7 usable blocks
    state = add(add(SchedulerState(c), "big", 27), "small", 1)
    state = add(SchedulerState(c), "a", 20)
    state = add(add(state, "big", 27), "small", 1)
    out, _ = S.schedule(state)
    assert out.scheduled == {"a": 20}  # big does not fit; small behind it is not admitted


def test_waiting_requests_never_preempt():
    c = config(block_size=4, num_gpu_blocks=8, max_model_len=28, policy="priority")
    state = add(SchedulerState(c), "lo", 20, priority=9)
    _, _, state = step(state)
    state = add(state, "hi", 20, priority=0)
    out, _, state = step(state)
    assert out.preempted_req_ids == () and "hi" not in out.scheduled


def test_priority_waiting_order():
    c = config(policy="priority", max_num_seqs=1, max_num_batched_tokens=64)
    state = SchedulerState(c)
    for i, (p, t) in enumerate([(2, 1), (1, 3), (1, 2), (0, 4)]):
        state = add(state, str(i), 4, priority=p, arrival_time=float(t))
    assert state.waiting == ("3", "2", "1", "0")


# --- update_from_output and finishing


def test_eos_before_length():
    c = config()
    state = add(SchedulerState(c), "a", 4, max_tokens=1)
    _, finished, _ = step(state, eos={"a"})
    assert finished == (("a", RequestStatus.FINISHED_STOPPED),)
    _, finished, _ = step(add(SchedulerState(c), "a", 4, max_tokens=1))
    assert finished == (("a", RequestStatus.FINISHED_LENGTH_CAPPED),)


def test_length_cap_at_max_model_len():
    c = config(max_model_len=8)
    state = add(SchedulerState(c), "a", 6, max_tokens=100)
    _, f1, state = step(state)
    _, f2, state = step(state)
    assert f1 == () and f2 == (("a", RequestStatus.FINISHED_LENGTH_CAPPED),)  # num_tokens reached L
    assert state.requests == {} and state.num_free_blocks == c.num_usable_blocks


def test_tokens_after_a_stop_are_discarded():
    c = config()
    state = add(SchedulerState(c), "a", 4, max_tokens=2)
    out, mid = S.schedule(state)
    finished, after = S.update_from_output(mid, out, {"a": [100, 100, 100]})
    assert finished == (("a", RequestStatus.FINISHED_LENGTH_CAPPED),)


@pytest.mark.parametrize("where", ["waiting", "running", "preempted"])
def test_abort_from_every_state(where):
    if where == "preempted":
        state = add(preemption_state("fcfs"), "x", 1)
        _, _, state = step(state)
        rid = "r1"
        assert state.requests[rid].status == P
    else:
        state = add(SchedulerState(config()), "r", 4)
        if where == "running":
            _, _, state = step(state)
        rid = "r"
    done, after = S.finish_requests(state, [rid, "unknown"], RequestStatus.FINISHED_ABORTED)
    assert done == (rid,) and rid not in after.requests
    assert rid not in after.running + after.waiting
    assert sum(after.req_to_num_blocks.values()) + after.num_free_blocks == after.config.num_usable_blocks


def test_duplicate_request_id_is_rejected():
    state = add(SchedulerState(config()), "a", 4)
    with pytest.raises(ValueError, match="duplicate"):
        add(state, "a", 4)


def test_output_for_an_aborted_request_is_ignored():
    state = add(SchedulerState(config()), "a", 4)
    out, mid = S.schedule(state)
    _, mid = S.finish_requests(mid, ["a"], RequestStatus.FINISHED_ABORTED)
    finished, after = S.update_from_output(mid, out, {"a": [EOS_TOKEN_ID]})
    assert finished == () and after.requests == {}
