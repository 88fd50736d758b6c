"""Counterexample search with candidates judged on worker processes
(reference/workers.py): the same scenario, the same count of draws, as one process."""

from __future__ import annotations

import pytest

from schedspec.reference.loader import load_impl
from schedspec.proofs.search.counterexample import ImplementationFailed, search
from schedspec.proofs.search.goals import get_goal


@pytest.mark.parametrize("goal,seed", [("starvation", 4), ("thrash", 1), ("property:grants_positive", 0)])
def test_workers_find_what_one_process_finds(goal, seed):
    g = get_goal(goal)
    runs = {w: search(g, 3, load_impl("spec"), seed=seed, tries=400, budget_s=600, shrink_s=600, candidates=2,
                      workers=w, impl_name="spec") for w in (1, 2)}
    one, two = runs[1], runs[2]
    assert one.tried == two.tried and one.undecided == two.undecided
    if goal.startswith("property:"):  # the spec keeps its properties: nothing to find, on any worker
        assert one.found is None and two.found is None and one.tried == 400
    else:
        assert one.found is not None and one.found.to_json() == two.found.to_json()
        assert one.original.to_json() == two.original.to_json()


def test_a_worker_that_cannot_load_is_the_implementation_s_failure():
    with pytest.raises(ImplementationFailed, match="no licence"):
        search(get_goal("starvation"), 3, load_impl("spec"), tries=100, workers=2,
               impl_name="tests.campaign_impls:BrokenLoad")
