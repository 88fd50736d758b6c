"""The differential tester on vLLM's default engine: a spec with one broken
prefix-caching rule (a freed request's cached blocks evicted first block first) diverges from the
spec on a random campaign with both flags drawn, and the shrinker returns a smaller
scenario that is still valid and still diverges."""

from __future__ import annotations

import json

import pytest

from mutants import Mutation, mutated
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL, generate_scenario, scenario_rng
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import scenario_from_json
from schedspec.reference.shrink import shrink

# Cached blocks of a freed request evicted first block first: later prompts then
# lose the start of a shared prefix, and with it the whole hit.
HEAD_FIRST = [Mutation("block_pool.PoolWork.free", "for b in last:\n    self.back[b] = None",
                       "for b in reversed(last):\n    self.back[b] = None")]


class HeadFirstFree(SpecScheduler):
    """The spec with HEAD_FIRST in force during each of its own calls only, so it
    runs beside the unbroken spec."""

    name = "broken-free-order"

    def add_request(self, request):
        with mutated(HEAD_FIRST) as spec:
            self.state = spec.add_request(self.state, request)

    def finish_requests(self, request_ids, status):
        with mutated(HEAD_FIRST) as spec:
            done, self.state = spec.finish_requests(self.state, request_ids, status)
            return done

    def schedule(self):
        with mutated(HEAD_FIRST) as spec:
            output, self.state = spec.schedule(self.state)
            return output

    def update_from_output(self, output, sampled_token_ids):
        with mutated(HEAD_FIRST) as spec:
            finished, self.state = spec.update_from_output(self.state, output, sampled_token_ids)
            return finished


@pytest.mark.long
def test_broken_free_order_is_found_and_shrunk():
    spec, broken = SpecScheduler(), HeadFirstFree()
    found = None
    for i in range(400):
        s = generate_scenario(scenario_rng(11, i), i, flags=FLAGS_ALL)
        d = compare_traces(run_scenario(s, broken), run_scenario(s, spec))
        if d is not None:
            found = (s, d)
            break
    assert found is not None, "the broken free order was not caught in 400 scenarios"
    s, d = found
    small, _ = shrink(s, broken, spec, d, budget_s=30)
    assert len(small.requests) <= len(s.requests)
    reloaded = scenario_from_json(json.loads(json.dumps(small.to_json())))  # still a valid file
    assert compare_traces(run_scenario(reloaded, broken), run_scenario(reloaded, spec)) is not None


def test_the_one_shrinker_takes_any_predicate():
    """reference/shrink.py's shrinker with a predicate that runs nothing: the result
    still holds it, is a valid file with prefix fields consistent with prompt_len, is as
    small as the phases make it, and is the same every time."""
    from schedspec.reference.scenario import Abort, RequestSpec, Scenario, scenario_problem
    from schedspec.reference.shrink import shrink_while

    s = Scenario("groups", {"max_num_batched_tokens": 64, "max_num_seqs": 8, "max_model_len": 64, "block_size": 4,
                            "num_gpu_blocks": 64, "policy": "priority", "enable_prefix_caching": True},
                 (RequestSpec("a", 20, 1, priority=-3, prefix_group="sys", prefix_len=12, arrival_time=0.0),
                  RequestSpec("b", 30, 2, max_tokens=9, prefix_group="sys", prefix_len=12, arrival_time=5.0),
                  RequestSpec("c", 9, 4, output_len=4, prompt_token_ids=tuple(range(10, 19)), arrival_time=2.0),
                  RequestSpec("d", 7, 6, arrival_time=3.0)),
                 (Abort("d", 9),), max_steps=40)

    def shared_prefix(x):  # two requests of a group share >= 2 tokens and one prompt is given explicitly
        group = [r for r in x.requests if r.prefix_group is not None and r.prefix_len >= 2]
        tokens = [r for r in x.requests if r.prompt_token_ids is not None and r.prompt_len >= 3]
        return "found" if len(group) >= 2 and tokens else None

    assert scenario_problem(s) is None and shared_prefix(s)
    small, found, stats = shrink_while(s, shared_prefix, "found", last_step=lambda f: None)
    assert found == "found" and shared_prefix(small) and scenario_problem(small) is None
    assert [(r.id, r.prompt_len, r.prefix_len, r.arrival_step, r.priority) for r in small.requests] == \
        [("r0", 2, 2, 0, 0), ("r1", 2, 2, 0, 0), ("r2", 3, 0, 0, 0)]
    assert small.requests[2].prompt_token_ids == (10, 11, 12) and not small.aborts
    assert stats.accepted > 0 and stats.runs >= stats.accepted
    assert shrink_while(s, shared_prefix, "found", last_step=lambda f: None)[0] == small
