"""A hypothesis state machine over the spec's four scheduler calls, checking every
registered property after every step, and a loader for deliberately broken
("mutant") variants of the spec, to show the machine catches them."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from schedspec.spec import scheduler as spec_scheduler
from schedspec.spec.config import SchedulerConfig, validate_config
from schedspec.spec.properties import PROPERTIES, check_step
from schedspec.spec.request import EOS_TOKEN_ID, RequestStatus, make_request
from schedspec.spec.state import SchedulerState

SPEC_DIR = Path(spec_scheduler.__file__).parent


@st.composite
def configs(draw) -> SchedulerConfig:
    """Small vLLM-valid configs: small pools force preemption, small max_model_len
    forces length caps."""
    block_size = draw(st.integers(1, 8))
    max_model_len = draw(st.integers(3, 48))
    max_num_seqs = draw(st.integers(1, 6))
    chunked = draw(st.booleans())
    low = max(max_num_seqs, 1 if chunked else max_model_len)
    max_num_batched_tokens = draw(st.integers(low, max(low, 64)))
    need = math.ceil(max_model_len / block_size)
    c = SchedulerConfig(
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_scheduled_tokens=draw(st.one_of(st.none(), st.integers(1, max_num_batched_tokens + 4))),
        max_num_seqs=max_num_seqs,
        max_num_active_seqs=draw(st.one_of(st.none(), st.integers(1, max_num_seqs))),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 2, 3, 5, 8]).filter(lambda t: t <= max_model_len)),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.0, 0.1, 0.3])),
        scheduler_reserve_full_isl=draw(st.booleans()),
        max_model_len=max_model_len,
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(need + 1, 4 * need + 2)),
    )
    validate_config(c)
    return c


def load_mutant(replacements: list[tuple[str, str, str]], name: str = "mutant") -> types.ModuleType:
    """A copy of spec/scheduler.py with textual replacements (file, old, new); a
    replacement in kv_cache.py builds a mutant kv_cache the scheduler imports.
    Every `old` must occur exactly once, so a mutant cannot silently be the spec."""
    sources = {f: (SPEC_DIR / f).read_text() for f in ("scheduler.py", "kv_cache.py")}
    for file, old, new in replacements:
        count = sources[file].count(old)
        assert count == 1, f"mutation target occurs {count} times in {file}: {old!r}"
        sources[file] = sources[file].replace(old, new)
    package = "schedspec.spec"
    kv = types.ModuleType(f"{package}.kv_cache_{name}")
    kv.__package__ = package
    exec(compile(sources["kv_cache.py"], f"<{name}:kv_cache.py>", "exec"), kv.__dict__)
    sys.modules[kv.__name__] = kv
    sched_src = sources["scheduler.py"].replace("from .kv_cache import", f"from .kv_cache_{name} import")
    mod = types.ModuleType(f"{package}.scheduler_{name}")
    mod.__package__ = package
    exec(compile(sched_src, f"<{name}:scheduler.py>", "exec"), mod.__dict__)
    return mod


class PropertyViolation(AssertionError):
    pass


def make_machine(scheduler=spec_scheduler, watch: str | None = None):
    """The state machine class, driving `scheduler` (the spec or a mutant); with
    `watch`, only that property fails the run."""

    class SchedulerMachine(RuleBasedStateMachine):
        @initialize(config=configs())
        def start(self, config):
            self.state = SchedulerState(config)
            self.next_id = 0
            self.output_len: dict[str, int | None] = {}
            self.steps = 0

        @rule(prompt_len=st.integers(1, 47), max_tokens=st.one_of(st.none(), st.integers(1, 12)),
              output_len=st.one_of(st.none(), st.integers(1, 12)), priority=st.integers(0, 3),
              arrival_tie=st.booleans())
        def add_request(self, prompt_len, max_tokens, output_len, priority, arrival_tie):
            c = self.state.config
            prompt_len = min(prompt_len, c.max_model_len - 1)
            rid = f"r{self.next_id}"
            arrival = float(self.next_id - 1 if arrival_tie and self.next_id else self.next_id)
            self.next_id += 1
            self.output_len[rid] = output_len
            self.state = scheduler.add_request(self.state, make_request(c, rid, prompt_len, max_tokens, priority, arrival))

        @precondition(lambda self: bool(self.state.requests))
        @rule(data=st.data())
        def abort(self, data):
            rid = data.draw(st.sampled_from(sorted(self.state.requests)))
            done, self.state = scheduler.finish_requests(self.state, [rid], RequestStatus.FINISHED_ABORTED)
            assert done == (rid,)
            assert rid not in self.state.requests

        @rule()
        def step(self):
            before = self.state
            output, mid = scheduler.schedule(before)
            sampled = {}
            for rid, _ in output.num_scheduled_tokens:
                r = mid.requests[rid]
                if r.num_computed_tokens >= r.num_tokens:
                    sampled[rid] = [EOS_TOKEN_ID if self.output_len[rid] == r.num_output_tokens + 1 else 100]
            _, after = scheduler.update_from_output(mid, output, sampled)
            self.state = after
            self.steps += 1
            bad = {n: v for n, v in check_step(before, output, after).items()
                   if not v.holds and (watch is None or n == watch)}
            if bad:
                raise PropertyViolation("; ".join(f"{n}: {v.detail} {dict(v.values)}" for n, v in bad.items()))

        @invariant()
        def queues_partition_requests(self):
            s = self.state
            assert sorted(s.running + s.waiting) == sorted(s.requests), "running + waiting != requests"

    return SchedulerMachine


SpecMachine = make_machine()
__all__ = ["PROPERTIES", "PropertyViolation", "SpecMachine", "configs", "load_mutant", "make_machine"]
