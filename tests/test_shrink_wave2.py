"""The differential tester on vLLM's default engine: a spec with one broken
prefix-caching rule (a freed request's cached blocks evicted first block first) diverges from the
spec on a random campaign with both flags drawn, and the shrinker returns a smaller
scenario that is still valid and still diverges."""

from __future__ import annotations

import json

from machine import load_mutant
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL, generate_scenario, scenario_rng
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import scenario_from_json
from schedspec.reference.shrink import shrink

# Cached blocks of a freed request evicted first block first: later prompts then
# lose the start of a shared prefix, and with it the whole hit.
HEAD_FIRST = load_mutant([("block_pool.py", "        for b in last:\n", "        for b in reversed(last):\n")],
                         name="shrink_head_first")


class HeadFirstFree(SpecScheduler):
    name = "broken-free-order"

    def add_request(self, request):
        self.state = HEAD_FIRST.add_request(self.state, request)

    def finish_requests(self, request_ids, status):
        done, self.state = HEAD_FIRST.finish_requests(self.state, request_ids, status)
        return done

    def schedule(self):
        output, self.state = HEAD_FIRST.schedule(self.state)
        return output

    def update_from_output(self, output, sampled_token_ids):
        finished, self.state = HEAD_FIRST.update_from_output(self.state, output, sampled_token_ids)
        return finished


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
