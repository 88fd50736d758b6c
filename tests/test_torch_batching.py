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
