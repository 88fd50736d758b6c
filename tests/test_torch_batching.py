"""run_batch's sub-batches (gpu/batch.py `_groups`): a batch cut into groups of
similar request counts gives each scenario the trace it gets alone in one batch,
in the caller's order, with the progress callback counting up over all groups.

The cut only happens for big batches (`_GROUP_MIN` scenarios per group); the
test lowers the bar so that 96 scenarios make 6 groups."""

import json
from itertools import pairwise

import schedspec.gpu.batch as batch_mod
from schedspec.gpu.batch import run_batch
from schedspec.reference.generator import generate_scenario, scenario_rng
from schedspec.spec.config import config_as_given


def _scenarios(n: int):
    return [generate_scenario(scenario_rng(11, i), i) for i in range(n)]


def test_groups_sort_by_request_count(monkeypatch):
    monkeypatch.setattr(batch_mod, "_GROUP_MIN", 16)
    prepared = [batch_mod.prepare(sc) for sc in _scenarios(96)]
    prepared = [p for p in prepared if not isinstance(p, str)]
    groups = batch_mod._groups(prepared)
    assert len(groups) == len(prepared) // 16 and sum(map(len, groups)) == len(prepared)
    sizes = [[len(p.ids) for p in g] for g in groups]
    assert all(max(a) <= min(b) for a, b in pairwise(sizes))  # groups are contiguous in R
    assert len({max(s) for s in sizes}) > 1  # the workload really has different R per group


def test_grouped_traces_equal_whole_batch(monkeypatch):
    scenarios = _scenarios(96)
    whole = run_batch(scenarios, device="cpu")
    monkeypatch.setattr(batch_mod, "_GROUP_MIN", 16)
    seen = []
    grouped = run_batch(scenarios, device="cpu", progress=lambda step, total: seen.append((step, total)))
    assert [t["scenario"] for t in grouped] == [sc.name for sc in scenarios]
    assert json.dumps(grouped) == json.dumps(whole)
    steps = [s for s, _ in seen]
    assert steps == sorted(steps) and len({t for _, t in seen}) == 1 and steps[-1] <= seen[-1][1]


def test_streamed_traces_arrive_once_each_as_their_scenarios_end(monkeypatch):
    """stream_batch_traces hands over every trace once, equal to run_batch_traces's,
    a rejected scenario's before any step and a scenario that ends early before
    the batch does (its rows compacted away), across sub-batches too."""
    import dataclasses

    from schedspec.gpu.batch import run_batch_traces, stream_batch_traces

    scenarios = _scenarios(40)
    # a third of them end at step 3, so the rows are compacted mid-run
    scenarios = [dataclasses.replace(sc, max_steps=3) if i % 3 else sc for i, sc in enumerate(scenarios)]
    bad = dataclasses.replace(scenarios[5], config={**config_as_given(scenarios[5].config), "block_size": 0})
    scenarios[5] = bad
    whole = run_batch_traces(scenarios, device="cpu")
    assert whole[5].error and "block_size" in whole[5].error
    monkeypatch.setattr(batch_mod, "_GROUP_MIN", 16)
    step = [0]
    arrived: dict[int, tuple[int, str]] = {}

    def on_trace(i, tr):
        assert i not in arrived, f"trace {i} handed over twice"
        arrived[i] = (step[0], json.dumps(tr.to_dict()))

    stream_batch_traces(scenarios, on_trace, device="cpu", progress=lambda s, total: step.__setitem__(0, s))
    assert sorted(arrived) == list(range(len(scenarios)))
    assert [text for _, text in (arrived[i] for i in range(len(scenarios)))] == [json.dumps(t.to_dict()) for t in whole]
    assert arrived[5][0] == 0  # the rejected scenario, before the first step
    horizon = step[0]
    short = [i for i in range(len(scenarios)) if i % 3 and i != 5]
    assert max(arrived[i][0] for i in short) < horizon  # handed over before the run ended
