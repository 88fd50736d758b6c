"""The properties under cache-aware admission (vLLM 0.34.0, S:2790-2839): the waiting
window may be reordered by prefix hit, and only among its plainly waiting requests.
waiting_order_preserved allows exactly that permutation, starvation_condition
leaves the head alone where the reorder may replace it; each relaxation is shown
to still catch an order the rule does not allow.  (The scenarios of
tests/regressions/prop-cache-aware-reorder-*.json run the same steps end to end.)"""

from __future__ import annotations

from dataclasses import replace

from helpers import config, step
from schedspec.spec import scheduler as S
from schedspec.spec.input_processor import make_request
from schedspec.spec.properties import check_step
from schedspec.spec.request import RequestStatus
from schedspec.spec.state import SchedulerState


def reorder_step(**kw):
    """r0 runs with a cached 4-token prefix; r1 (no hit) then r2 (r0's prefix) arrive;
    one seat, so both wait and the step reorders them: (before, output, after)."""
    c = config(**{"max_num_seqs": 1, "max_model_len": 32, "block_size": 2, "num_gpu_blocks": 32,
                  "enable_prefix_caching": True, "cache_aware_admission_window": 2,
                  "cache_aware_admission_threshold": 0.0, **kw})
    s = S.add_request(SchedulerState(config=c), make_request(c, "r0", 4, 4, prompt_token_ids=(1, 2, 3, 4)))
    _, _, s = step(s)
    s = S.add_request(s, make_request(c, "r1", 4, 2, arrival_time=1.0, prompt_token_ids=(9, 9, 9, 9)))
    before = S.add_request(s, make_request(c, "r2", 6, 2, arrival_time=2.0, prompt_token_ids=(1, 2, 3, 4, 5, 6)))
    out, _, after = step(before)
    return before, out, after


def test_the_reorder_happens_and_the_properties_hold():
    before, out, after = reorder_step()
    assert before.waiting == ("r1", "r2") and after.waiting == ("r2", "r1")  # not vacuous: r2 moved
    bad = {n: v for n, v in check_step(before, out, after).items() if not v.holds}
    assert bad == {}


def test_an_order_the_rule_does_not_allow_is_still_caught():
    before, out, after = reorder_step()
    verdict = lambda b, a: check_step(b, out, a)["waiting_order_preserved"].holds  # noqa: E731
    # A request that is not plainly waiting keeps its slot: here r1 was preempted before.
    r1 = replace(before.requests["r1"], status=RequestStatus.PREEMPTED)
    assert not verdict(replace(before, requests={**before.requests, "r1": r1}), after)
    # Beyond the window nothing moves: a window of one allows no reorder.
    narrow = replace(before, config=replace(before.config, cache_aware_admission_window=1))
    assert not verdict(narrow, after)
    # Without the feature (0.33.0's FCFS) the order is the queue's.
    off = replace(before, config=replace(before.config, cache_aware_admission_window=0))
    assert not verdict(off, after)
    # A request that was not waiting cannot appear, nor one vanish.
    assert not verdict(before, replace(after, waiting=("r2",)))


def test_starvation_condition_judges_the_head_only_when_no_reorder_can_replace_it():
    before, out, after = reorder_step(max_num_seqs=2)
    assert out.admitted == ("r2",) and before.waiting[0] == "r1"  # r2 went first
    assert check_step(before, out, after)["starvation_condition"].holds
    assert not check_step(before, out, after)["starvation_condition"].applicable
    # With the window off the same step is judged, and r1 not fed is a violation.
    off = replace(before, config=replace(before.config, cache_aware_admission_window=0))
    assert not check_step(off, out, after)["starvation_condition"].holds
