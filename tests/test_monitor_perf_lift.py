"""The monitor's fast lift is the full lift.

In an engine the monitor lifts each call's post-state reusing what it read at
the last call (lifted requests, block tables, the prefix-cache map, each checked
unchanged before reuse) and the spec's own answer (`like`).  Here a shadowed
vLLM 0.33.0 scheduler runs a workload with admissions, shared prefix blocks,
finishes and frees, and after every checked call the monitor's post-state must
equal a lift made from nothing (every cache dropped), field by field and as
state JSON.  No timing here: speed is benchmarks/monitor_overhead.py's.
"""

from __future__ import annotations

import json
from collections import deque

import pytest

from monitor_helpers import require_vllm

require_vllm()

from schedspec.monitor import shadow  # noqa: E402
from schedspec.monitor.monitor import POST_ATTR, Monitor  # noqa: E402
from schedspec.reference import vllm_lift  # noqa: E402
from schedspec.reference.state_json import state_to_json  # noqa: E402
from schedspec.reference.vllm_adapter import VllmScheduler, runner_index  # noqa: E402
from schedspec.spec.config import SchedulerConfig  # noqa: E402
from schedspec.spec.input_processor import make_request  # noqa: E402

SHARED = list(range(1000, 1016))  # one full block every long prompt starts with


def fresh_lift(sched, config):
    """lift_state with every cache the fast lift keeps dropped first."""
    for r in sched.requests.values():
        r.__dict__.pop(vllm_lift.LIFT_ATTR, None)
    kv = sched.kv_cache_manager
    kv.block_pool.__dict__.pop(vllm_lift.POOL_ATTR, None)
    for m in kv.coordinator.single_type_managers:
        m.__dict__.pop(vllm_lift.TABLES_ATTR, None)
    return vllm_lift.lift_state(sched, config)


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_engine_post_states_equal_a_full_lift(async_scheduling, prefix_caching):
    config = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=512, block_size=16,
                             num_gpu_blocks=80, enable_prefix_caching=prefix_caching,
                             async_scheduling=async_scheduling)
    adapter = VllmScheduler()
    adapter.reset(config)
    previous = shadow._default  # noqa: SLF001 - restored below
    monitor = Monitor("raise", relift=False)
    shadow.set_default_monitor(monitor)
    try:
        sched = adapter.sched
        sched.__class__ = shadow.ShadowAsyncScheduler if async_scheduling else shadow.ShadowScheduler
        ModelRunnerOutput = adapter._v["ModelRunnerOutput"]  # noqa: SLF001
        lifted_config = vllm_lift.lift_config(sched)
        in_flight: deque = deque()
        checked = 0
        for step in range(60):
            if step % 6 == 0 and step < 40:  # new requests keep arriving; long ones share a first block
                for k in range(3):
                    i = step * 3 + k
                    n = 10 + (i * 7) % 30
                    tokens = SHARED + [3 + i * 31 + j for j in range(n - 16)] if n > 16 else \
                        [5 + i + j for j in range(n)]
                    adapter.add_request(make_request(config, f"r{i}", n, 4 + i % 9, arrival_time=float(i),
                                                     prompt_token_ids=tokens if prefix_caching else None))
                    checked += 1
                    assert sched.__dict__[POST_ATTR] == fresh_lift(sched, lifted_config)
            out = sched.schedule()
            checked += 1
            post = sched.__dict__[POST_ATTR]
            full = fresh_lift(sched, lifted_config)
            assert post == full
            assert json.dumps(state_to_json(post), sort_keys=True) == json.dumps(state_to_json(full), sort_keys=True)
            sampling = [rid for rid in out.num_scheduled_tokens if not sched.requests[rid].is_prefill_chunk]
            in_flight.append((out, sampling))
            if async_scheduling and len(in_flight) < 2:
                continue
            out, sampling = in_flight.popleft()
            ids = list(out.num_scheduled_tokens)
            sched.update_from_output(out, ModelRunnerOutput(
                req_ids=ids, **runner_index(ModelRunnerOutput, ids),
                sampled_token_ids=[[100 + step] if rid in sampling else [] for rid in ids],
                logprobs=None, prompt_logprobs_dict={}, pooler_output=None))
            checked += 1
            post = sched.__dict__[POST_ATTR]
            assert post == fresh_lift(sched, lifted_config)
        stats = monitor.summary()
        assert not stats["divergences"] and not stats["monitor_errors"]
        assert sum(c["checked"] for c in stats["calls"].values()) == checked
    finally:
        shadow.set_default_monitor(previous)
        adapter.close()
