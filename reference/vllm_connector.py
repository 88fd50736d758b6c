"""The KV connector the vLLM adapter gives vLLM's scheduler for a scenario whose
requests carry `kv_connector_tokens` or `kv_connector_send_steps` (spec/kv_connector.py,
docs/formats.md).

A remote store holding the first `kv_connector_tokens` prompt tokens of each such
request: asked at an admission from `num_computed_tokens` local tokens, it answers
the tokens it holds beyond them, loaded within the step (base.py
get_num_new_matched_tokens).  It is a best-effort cache of a KV producer
(requires_kv_delivery False, base.py:198-207), attached to a scheduler built
without one, so that, as the spec has it, no free is deferred (S:185-193) and a
preemption keeps its in-flight output (S:988-992).  It sends the KV of the requests
in `sends` once they finish (request_finished answers delay_free); the engine loop
reports those sends as the worker would.  Its worker side never runs.
"""

from __future__ import annotations

from typing import Any, Callable


class ScenarioStore:
    """What the remote store holds (request id -> leading prompt tokens), filled by
    the adapter as requests arrive, the requests it loads asynchronously, and what
    the connector answered since `answers` was last cleared (request id -> tokens
    beyond the local hit)."""

    def __init__(self) -> None:
        self.holds: dict[str, int] = {}
        self.async_loads: set[str] = set()
        self.answers: dict[str, int] = {}
        self.sends: set[str] = set()  # the requests whose KV it sends once they finish


def answering_connector(answer: Callable[[Any, int, int], tuple], sends: Callable[[Any], bool] = lambda r: False
                        ) -> type:
    """A scheduler-side KV connector class (base.py KVConnectorBase_V1) whose
    get_num_new_matched_tokens(request, num_computed_tokens) returns
    `answer(request, num_computed_tokens, block_size)`, and whose request_finished
    keeps a finished request's blocks, to send them, where `sends(request)` (base.py:631-650);
    it keeps no other state, is best-effort (requires_kv_delivery False) and has no worker side."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

    class AnsweringConnector(KVConnectorBase_V1):
        requires_kv_delivery = False  # a best-effort cache: a dropped save is a later miss

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            return answer(request, num_computed_tokens, self._vllm_config.cache_config.block_size)

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            pass

        def request_finished(self, request, block_ids):
            return sends(request), None

        def build_connector_meta(self, scheduler_output):
            return KVConnectorMetadata()

        def start_load_kv(self, forward_context, **kwargs):
            raise AssertionError("schedspec's KV connectors have no worker side")

        wait_for_layer_load = save_kv_layer = wait_for_save = start_load_kv

    return AnsweringConnector


def attach_scenario_connector(sched: Any, vllm_config: Any, kv_cache_config: Any,
                              requires_kv_delivery: bool = False) -> ScenarioStore:
    """Give `sched` the scenario connector, answering from the store returned; one
    that needs a preempted request's KV delivered if `requires_kv_delivery` (which
    the scheduler reads from its connector when built, S:170-201)."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    store = ScenarioStore()

    def answer(request, num_computed_tokens, block_size):
        n = store.answers[request.request_id] = max(0, store.holds.get(request.request_id, 0) - num_computed_tokens)
        return n, n > 0 and request.request_id in store.async_loads  # vLLM asserts a load loads something (S:1338)

    vllm_config.kv_transfer_config = KVTransferConfig(kv_connector="ScenarioConnector", kv_role="kv_producer")
    connector = answering_connector(answer, lambda r: r.request_id in store.sends)(
        vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)
    connector.bind_kv_cache_manager(sched.kv_cache_manager)  # as Scheduler.__init__ does (S:383-384)
    connector.requires_kv_delivery = sched.requires_kv_delivery = requires_kv_delivery
    sched.connector = connector
    return store


__all__ = ["ScenarioStore", "answering_connector", "attach_scenario_connector"]
