"""A hypothesis state machine over the spec's four scheduler calls, checking every
registered property after every step, and a loader for deliberately broken
("mutant") variants of the spec, to show the machine catches them."""

from __future__ import annotations

import math
import sys
import types
from collections import Counter
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from schedspec.spec import scheduler as spec_scheduler
from schedspec.spec.config import SchedulerConfig, validate_config
from schedspec.spec.properties import PROPERTIES, check_step
from schedspec.spec.request import EOS_TOKEN_ID, RequestStatus, make_request
from schedspec.spec.state import SchedulerOutput, SchedulerState

SPEC_DIR = Path(spec_scheduler.__file__).parent


@st.composite
def configs(draw, wave2: bool = True) -> SchedulerConfig:
    """Small vLLM-valid configs: small pools force preemption, small max_model_len
    forces length caps.  `wave2=False` keeps prefix caching and async scheduling off
    (the scope of the z3 encoding and of the torch implementation)."""
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
        # With the engine flags drawn, half the pools are as small as vLLM allows, so
        # preemption (and with it stale outputs and eviction) is common.
        num_gpu_blocks=draw(st.one_of(st.integers(need + 1, need + 2), st.integers(need + 1, 4 * need + 2))
                            if wave2 else st.integers(need + 1, 4 * need + 2)),
        enable_prefix_caching=draw(st.booleans()) if wave2 else False,
        async_scheduling=draw(st.booleans()) if wave2 else False,
    )
    validate_config(c)
    return c


def load_mutant(replacements: list[tuple[str, str, str]], name: str = "mutant") -> types.ModuleType:
    """A copy of spec/scheduler.py with textual replacements (file, old, new); a
    replacement in kv_cache.py builds a mutant kv_cache the scheduler imports.
    Every `old` must occur exactly once, so a mutant cannot silently be the spec."""
    sources = {f: (SPEC_DIR / f).read_text() for f in ("scheduler.py", "kv_cache.py", "block_pool.py")}
    for file, old, new in replacements:
        count = sources[file].count(old)
        assert count == 1, f"mutation target occurs {count} times in {file}: {old!r}"
        sources[file] = sources[file].replace(old, new)
    package = "schedspec.spec"
    kv = types.ModuleType(f"{package}.kv_cache_{name}")
    kv.__package__ = package
    exec(compile(sources["kv_cache.py"], f"<{name}:kv_cache.py>", "exec"), kv.__dict__)
    sys.modules[kv.__name__] = kv
    pool = types.ModuleType(f"{package}.block_pool_{name}")
    pool.__package__ = package
    sys.modules[pool.__name__] = pool  # before exec: its dataclasses look their module up
    exec(compile(sources["block_pool.py"], f"<{name}:block_pool.py>", "exec"), pool.__dict__)
    sched_src = sources["scheduler.py"].replace("from .kv_cache import", f"from .kv_cache_{name} import")
    sched_src = sched_src.replace("from .block_pool import", f"from .block_pool_{name} import")
    mod = types.ModuleType(f"{package}.scheduler_{name}")
    mod.__package__ = package
    exec(compile(sched_src, f"<{name}:scheduler.py>", "exec"), mod.__dict__)
    return mod


class PropertyViolation(AssertionError):
    pass


# What the machine's steps exercised, so a test can show the new features were
# really reached (a property checked on nothing proves nothing).
COVERAGE: Counter = Counter()


def count_coverage(before: SchedulerState, output, after: SchedulerState) -> None:
    c = before.config
    COVERAGE[f"steps caching={c.enable_prefix_caching} async={c.async_scheduling}"] += 1
    COVERAGE["prefix hits"] += sum(1 for _, h in output.prefix_hits if h > 0)
    COVERAGE["preemptions"] += len(output.preempted_req_ids)
    COVERAGE[f"preemptions async={c.async_scheduling}"] += len(output.preempted_req_ids)
    # Async: preempted while its previous batch was in flight; that batch returns in
    # the same engine step, and its token is applied to the waiting request.
    flying = [rid for rid in output.preempted_req_ids if before.requests[rid].num_in_flight_tokens > 0]
    COVERAGE["in-flight preemptions"] += len(flying)
    COVERAGE["stale outputs applied"] += sum(
        1 for rid in flying
        if rid not in after.requests or after.requests[rid].num_output_tokens > before.requests[rid].num_output_tokens)
    if before.block_pool is not None and after.block_pool is not None:
        COVERAGE["evictions"] += sum(1 for b, h in before.block_pool.block_hash.items()
                                     if after.block_pool.block_hash.get(b) != h)
        COVERAGE["shared blocks"] += sum(1 for n in after.block_pool.ref_cnt.values() if n > 1)


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
            self.in_flight: list = []  # async: batches in flight, oldest first

        @rule(prompt_len=st.integers(1, 47), max_tokens=st.one_of(st.none(), st.integers(1, 12)),
              output_len=st.one_of(st.none(), st.integers(1, 12)), priority=st.integers(0, 3),
              arrival_tie=st.booleans(), family=st.integers(0, 2), shared=st.integers(0, 47))
        def add_request(self, prompt_len, max_tokens, output_len, priority, arrival_tie, family, shared):
            c = self.state.config
            prompt_len = min(prompt_len, c.max_model_len - 1)
            # Prefix caching: three families of shared prefixes, then the request's own token.
            shared = min(shared, prompt_len)
            tokens = [10 + family] * shared + [1000 + self.next_id] + [7] * (prompt_len - shared - 1)
            rid = f"r{self.next_id}"
            arrival = float(self.next_id - 1 if arrival_tie and self.next_id else self.next_id)
            self.next_id += 1
            self.output_len[rid] = output_len
            self.state = scheduler.add_request(self.state, make_request(
                c, rid, prompt_len, max_tokens, priority, arrival, tokens[:prompt_len] if c.enable_prefix_caching else None))

        @precondition(lambda self: bool(self.state.requests))
        @rule(data=st.data())
        def abort(self, data):
            rid = data.draw(st.sampled_from(sorted(self.state.requests)))
            done, self.state = scheduler.finish_requests(self.state, [rid], RequestStatus.FINISHED_ABORTED)
            assert done == (rid,)
            assert rid not in self.state.requests

        def token(self, r):
            return EOS_TOKEN_ID if self.output_len[r.request_id] == r.num_output_tokens + 1 else 100

        @rule(count=st.integers(1, 4))
        def steps_(self, count):
            """A few engine steps in a row: requests grow, pools fill, preemption happens."""
            for _ in range(count):
                self.step()

        def step(self):
            """One engine step of formats.md, synchronous or async (two batches in flight)."""
            before = self.state
            if not before.config.async_scheduling:
                output, mid = scheduler.schedule(before)
                sampled = {rid: [self.token(mid.requests[rid])] for rid, _ in output.num_scheduled_tokens
                           if mid.requests[rid].num_computed_tokens >= mid.requests[rid].num_tokens}
                _, after = scheduler.update_from_output(mid, output, sampled)
            else:
                output, after = SchedulerOutput(), before
                done = False
                if before.has_requests():
                    output, after = scheduler.schedule(before)
                    self.in_flight.append((output, [rid for rid, _ in output.num_scheduled_tokens
                                                    if not after.requests[rid].is_prefill_chunk]))
                    done = len(self.in_flight) < 2 and (output.total_num_scheduled_tokens > 0
                                                        or after.has_requests())
                elif not self.in_flight:
                    done = True
                if not done:
                    batch, sampling = self.in_flight.pop(0)
                    sampled = {rid: [self.token(after.requests[rid])] for rid in sampling
                               if rid in after.requests}
                    _, after = scheduler.update_from_output(after, batch, sampled)
            self.state = after
            self.steps += 1
            count_coverage(before, output, after)
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
__all__ = ["COVERAGE", "PROPERTIES", "PropertyViolation", "SpecMachine", "configs", "load_mutant", "make_machine"]
