"""Deliberately broken schedulers the counterexample tests search against: each
reaches a goal the spec never reaches, so a search that finds nothing on them
is a broken search, not a correct scheduler."""

from __future__ import annotations

import dataclasses

from schedspec.reference.impl import SpecScheduler


class ReversedRunning(SpecScheduler):
    """The running loop serves the running list from its tail, so the head of a
    long running list can get nothing for several steps (running-starved)."""

    name = "broken-reversed-running"

    def schedule(self):
        st = self.state
        self.state = dataclasses.replace(st, running=tuple(reversed(st.running)))
        out = super().schedule()
        back = [r for r in st.running if r in self.state.running]
        self.state = dataclasses.replace(self.state, running=tuple(back) + tuple(
            r for r in self.state.running if r not in back))
        return out


class BudgetPlusOne(SpecScheduler):
    """One token over the budget, reporting the real config (token_budget_respected)."""

    name = "broken-budget-plus-one"

    def reset(self, config):
        self.real = config
        super().reset(dataclasses.replace(config, max_num_scheduled_tokens=config.token_budget + 1,
                                          max_num_batched_tokens=config.max_num_batched_tokens + 1))

    def observe(self):
        return dataclasses.replace(self.state, config=self.real)
