"""A hypothesis state machine over the spec's four scheduler calls, checking every
registered property after every step, and that no call changes the state it was
given (states are values); tests/mutants.py breaks rules to show it notices."""

from __future__ import annotations

import copy
import math
from collections import Counter, deque
from dataclasses import replace

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from schedspec.reference.engine import FakeModel, KVLoads, engine_step
from schedspec.reference.impl import SpecScheduler
from schedspec.spec import prefill_throttle
from schedspec.spec.config import SchedulerConfig, validate_config
from schedspec.spec.properties import PROPERTIES, check_step
from schedspec.spec.request import RequestStatus
from schedspec.spec.input_processor import make_request
from schedspec.spec.state import SchedulerState

@st.composite
def configs(draw, wave2: bool = True) -> SchedulerConfig:
    """Small vLLM-valid configs: small pools force preemption, small max_model_len
    forces length caps.  `wave2=False` keeps prefix caching, async scheduling,
    speculative decoding and LoRA off (the scope of the z3 encoding)."""
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
    if wave2:
        # Drafts per step, and a lookahead; a long-prefill cap at or below the drafts
        # would make a padded admission crash vLLM (and the spec): not drawn here.
        k = draw(st.sampled_from([0, 0, 1, 2, 3]))
        if 0 < c.long_prefill_token_threshold <= k:
            k = 0
        c = replace(c, num_speculative_tokens=k,
                    num_lookahead_tokens=draw(st.sampled_from([0, 0, 1, 2])) if k else 0,
                    max_loras=draw(st.sampled_from([None, None, 1, 2])),
                    # Prefill throttling: a held step skips prefill on purpose, which the
                    # properties must allow for (spec/prefill_throttle.py).
                    prefill_schedule_interval=draw(st.sampled_from([1, 1, 1, 2, 3])),
                    # Encoder inputs: small budgets and caches, so chunks are cut at items and
                    # entries evicted (spec/encoder_inputs.py).
                    max_num_encoder_input_tokens=draw(st.sampled_from([None, 3, 6, 10])),
                    encoder_cache_size=draw(st.sampled_from([None, 6, 10, 16])),
                    disable_chunked_mm_input=draw(st.sampled_from([False, False, True])),
                    # Cache-aware admission (0.34.0): the waiting window reordered by prefix hit.
                    cache_aware_admission_window=draw(st.sampled_from([0, 0, 2, 8])),
                    cache_aware_admission_threshold=draw(st.sampled_from([0.0, 0.5])))
    validate_config(c)
    return c


class PropertyViolation(AssertionError):
    pass


def loading(r) -> bool:
    """Waiting for an asynchronous KV load the worker has not reported finished."""
    return r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and not r.kv_load_finished


# What the machine's steps exercised, so a test can show the new features were
# really reached (a property checked on nothing proves nothing).
COVERAGE: Counter = Counter()


def count_coverage(before: SchedulerState, output, after: SchedulerState) -> None:
    c = before.config
    COVERAGE[f"steps caching={c.enable_prefix_caching} async={c.async_scheduling}"] += 1
    COVERAGE["prefix hits"] += sum(1 for _, h in output.prefix_hits if h > 0)
    COVERAGE["preemptions"] += len(output.preempted_req_ids)
    COVERAGE["drafts sent"] += sum(len(ids) for _, ids in output.scheduled_spec_decode_tokens)
    if c.max_loras is not None:
        running = {after.requests[x].lora_int_id for x in after.running} - {0}
        COVERAGE["adapters held back"] += len(running) == c.max_loras and any(
            after.requests[w].lora_int_id not in running | {0} for w in after.waiting)
    COVERAGE["grammar waits"] += sum(1 for w in before.waiting if before.requests[w].grammar in ("compiling", "failed"))
    COVERAGE["grammar errors"] += sum(1 for w in before.requests if w not in after.requests
                                      and before.requests[w].grammar == "failed")
    if prefill_throttle.holds_prefill(before):  # a step holding prefill, with some to hold
        COVERAGE["steps holding prefill"] += bool(before.waiting) or any(
            before.requests[x].is_prefill_chunk for x in before.running)
    COVERAGE["KV loads within the step"] += len(output.kv_connector_hits)
    COVERAGE["encoder inputs encoded"] += sum(len(ids) for _, ids in output.scheduled_encoder_inputs)
    COVERAGE["encoder cache evictions"] += len(output.free_encoder_mm_hashes)
    encoded = dict(output.scheduled_encoder_inputs)
    COVERAGE["encoder cache hits"] += sum(  # references taken this step to items not encoded in it
        1 for rid, ids in after.encoder_cache.refs.items() for i in ids
        if i not in before.encoder_cache.refs.get(rid, {}) and i not in encoded.get(rid, ()))
    COVERAGE["async KV loads"] += sum(1 for rid, r in after.requests.items() if loading(r)
                                      and (rid not in before.requests or not loading(before.requests[rid])))
    COVERAGE["async KV loads admitted"] += sum(
        1 for rid in output.admitted if before.requests[rid].status == RequestStatus.WAITING_FOR_REMOTE_KVS)
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


def make_machine(watch: str | None = None):
    """The state machine class, driving the spec (under `tests/mutants.py mutated`, a
    mutant of it) through the engine's own step; with `watch`, only that property
    fails the run."""

    class SchedulerMachine(RuleBasedStateMachine):
        @initialize(config=configs())
        def start(self, config):
            self.impl = SpecScheduler()
            self.impl.reset(config)
            self.next_id = 0
            self.output_len: dict[str, int | None] = {}
            # The fake model and drafter; per-request draft and acceptance patterns.
            self.model = FakeModel(self.output_len, config.num_speculative_tokens, {}, {})
            self.steps = 0
            self.in_flight = deque() if config.async_scheduling else None
            # KV connector: each asynchronous load is reported finished after its drawn steps.
            self.load_steps: dict[str, int] = {}
            self.loads = KVLoads(self.load_steps)
            self.mm_lengths: dict[str, int] = {}  # encoder inputs: each identifier's length

        @property
        def state(self) -> SchedulerState:
            return self.impl.state

        @rule(prompt_len=st.integers(1, 47), max_tokens=st.one_of(st.none(), st.integers(1, 12)),
              output_len=st.one_of(st.none(), st.integers(1, 12)), priority=st.integers(0, 3),
              arrival_tie=st.booleans(), family=st.integers(0, 2), shared=st.integers(0, 47),
              drafts=st.lists(st.integers(0, 3), min_size=1, max_size=3),
              accepted=st.lists(st.integers(0, 3), min_size=1, max_size=3), adapter=st.integers(0, 3),
              grammar=st.sampled_from([False, False, False, True]),
              kv=st.sampled_from(["none", "none", "none", "sync", "async"]), kv_tokens=st.integers(1, 47),
              load_steps=st.integers(1, 4),
              items=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 10), st.integers(0, 4)), max_size=3))
        def add_request(self, prompt_len, max_tokens, output_len, priority, arrival_tie, family, shared,
                        drafts, accepted, adapter, grammar, kv, kv_tokens, load_steps, items):
            c = self.state.config
            k = c.num_speculative_tokens
            prompt_len = min(prompt_len, c.max_model_len - 1)
            # Prefix caching: three families of shared prefixes, then the request's own token.
            shared = min(shared, prompt_len)
            tokens = [10 + family] * shared + [1000 + self.next_id] + [7] * (prompt_len - shared - 1)
            rid = f"r{self.next_id}"
            arrival = float(self.next_id - 1 if arrival_tie and self.next_id else self.next_id)
            self.next_id += 1
            self.output_len[rid] = output_len
            self.model.num_draft_tokens[rid] = [min(d, k) for d in drafts]
            self.model.num_accepted_tokens[rid] = accepted
            # KV connector: a remote store holding the first kv_tokens, loaded within the step or
            # asynchronously (spec/kv_connector.py); the last prompt token is always computed.
            kv_tokens = min(kv_tokens, prompt_len - 1) if kv != "none" else 0
            if kv == "async" and kv_tokens:
                self.load_steps[rid] = load_steps
            self.impl.add_request(make_request(
                c, rid, prompt_len, max_tokens, priority, arrival, tokens[:prompt_len] if c.enable_prefix_caching else None,
                adapter if c.max_loras is not None else 0, grammar, kv_tokens, kv == "async" and kv_tokens > 0,
                mm_features=self.mm_features(c, prompt_len, items)))

        def mm_features(self, c, prompt_len, items):
            """Encoder inputs: (gap, length, identifier) placed in order in the prompt; an
            identifier keeps the length it was first drawn with (one identifier, one item)."""
            longest = min(c.encoder_compute_budget, c.encoder_cache_capacity)
            out, pos = [], 0
            for gap, n, ident in items:
                name = f"img{ident}"
                n = self.mm_lengths.setdefault(name, min(n, longest))
                if pos + gap + n > prompt_len:
                    break
                out.append((pos + gap, n, name))
                pos += gap + n
            return out

        @precondition(lambda self: any(r.grammar == "compiling" for r in self.state.requests.values()))
        @rule(data=st.data(), failed=st.sampled_from([False, False, False, True]))
        def grammar_compiled(self, data, failed):
            """Structured output: a grammar finishes compiling, between engine steps."""
            rid = data.draw(st.sampled_from(sorted(k for k, r in self.state.requests.items()
                                                   if r.grammar == "compiling")))
            self.impl.grammar_compiled([rid], failed)
            assert self.state.requests[rid].grammar == ("failed" if failed else "compiled")

        @precondition(lambda self: any(not r.status.is_finished for r in self.state.requests.values()))
        @rule(data=st.data())
        def abort(self, data):
            rid = data.draw(st.sampled_from(sorted(k for k, r in self.state.requests.items()
                                                   if not r.status.is_finished)))
            held = loading(self.state.requests[rid])
            done = self.impl.finish_requests([rid], RequestStatus.FINISHED_ABORTED)
            assert tuple(done) == (rid,)
            assert rid not in self.state.running + self.state.waiting
            # One whose asynchronous load is in flight keeps its blocks until the load ends (S:3153-3164).
            assert (rid in self.state.requests) == held
            COVERAGE["aborts mid-load"] += held

        @rule(count=st.integers(1, 4))
        def steps_(self, count):
            """A few engine steps in a row: requests grow, pools fill, preemption happens."""
            for _ in range(count):
                self.step()

        def step(self):
            """One engine step of formats.md, the engine's own (reference/engine.py)."""
            snapshot = copy.deepcopy(self.state)
            e = engine_step(self.impl, self.steps, self.model, self.in_flight, self.loads)
            assert e.before == snapshot, "a scheduler call changed the state it was given"
            self.steps += 1
            count_coverage(e.before, e.output, e.after)
            bad = {n: v for n, v in check_step(e.before, e.output, e.after).items()
                   if not v.holds and (watch is None or n == watch)}
            if bad:
                raise PropertyViolation("; ".join(f"{n}: {v.detail} {dict(v.values)}" for n, v in bad.items()))

        @invariant()
        def queues_partition_requests(self):
            s = self.state
            held = [rid for rid, r in s.requests.items() if r.status.is_finished]
            assert sorted(s.running + s.waiting + tuple(held)) == sorted(s.requests), \
                "running + waiting + requests finished mid-load != requests"

    return SchedulerMachine


SpecMachine = make_machine()
__all__ = ["COVERAGE", "PROPERTIES", "PropertyViolation", "SpecMachine", "configs", "make_machine"]
