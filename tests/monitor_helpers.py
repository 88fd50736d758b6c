"""Builders shared by the runtime-monitor tests (test_monitor_scope.py,
test_monitor_engine.py): real vLLM 0.33.0 schedulers, requests and model-runner
outputs on the CPU, with no model, and the fixture that puts the process's
schedulers under a fresh monitor and restores everything afterwards.

Schedulers are built as reference/vllm_adapter.py builds them (and as vLLM's
own tests/v1/core/utils.py `create_scheduler` does): an offline model config,
`skip_tokenizer_init`, a KVCacheConfig of hand-made groups (by default one
FullAttentionSpec group), and the adapter's guard that keeps the async
scheduling VllmConfig resolved, which the CPU platform hook would switch off.
Everything else is vLLM's own config classes, so a feature a test asks for is
built, validated and wired by vLLM.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

import pytest

from schedspec.monitor.check import compare_states, renamed
from schedspec.reference.impl import SpecScheduler


def vllm_required() -> bool:
    """As tests/conftest.py: CI=true or SCHEDSPEC_REQUIRE_VLLM=1 make a missing vLLM a failure."""
    return os.environ.get("SCHEDSPEC_REQUIRE_VLLM") == "1" or os.environ.get("CI") == "true"


def require_vllm() -> None:
    """Import vLLM 0.33.0 the adapter's way (CPU, offline), or skip the module."""
    try:
        from schedspec.reference.vllm_adapter import import_vllm

        import_vllm()
        import schedspec.monitor.shadow  # noqa: F401 - imports vLLM's schedulers
    except ImportError as e:
        if vllm_required():
            pytest.fail(f"vLLM is required here (SCHEDSPEC_REQUIRE_VLLM=1 or CI=true) but cannot be imported: {e}")
        pytest.skip(f"vLLM 0.33.0 is not installed ({e}); run `schedspec install-vllm`", allow_module_level=True)


# -- the monitor, installed for one test --------------------------------------------


@pytest.fixture
def monitor():
    """vLLM's Scheduler patched (shadow.install) under a fresh `count` monitor,
    which is also the default one that ShadowScheduler / ShadowAsyncScheduler
    report to; afterwards vLLM's classes and the previous default monitor are
    restored, whatever the test did."""
    from schedspec.monitor import shadow

    previous = shadow._default  # noqa: SLF001 - restored exactly, None included
    mon = shadow.install("count")
    try:
        yield mon
    finally:
        shadow.uninstall()
        shadow.set_default_monitor(previous)


@pytest.fixture
def shadow_monitor():
    """A fresh `count` monitor as the default one, without patching vLLM's own
    classes: only ShadowScheduler / ShadowAsyncScheduler instances report to it."""
    from schedspec.monitor import shadow
    from schedspec.monitor.monitor import Monitor

    previous = shadow._default  # noqa: SLF001
    shadow.uninstall()
    mon = Monitor("count")
    shadow.set_default_monitor(mon)
    try:
        yield mon
    finally:
        shadow.uninstall()
        shadow.set_default_monitor(previous)


# -- configs and schedulers -------------------------------------------------------------

_model_dirs: dict[str, str] = {}

# A small Llama-style model: grouped-query attention (2 heads, 1 KV head), which
# context parallelism needs (tensor parallel size above the KV head count).
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1,
         "vocab_size": 1000, "rms_norm_eps": 1e-5, "torch_dtype": "float16", "max_position_embeddings": 4096}
# A small mixture-of-experts model (the aux output connector returns routed experts).
MIXTRAL = dict(LLAMA, architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=2,
               num_experts_per_tok=1)


def model_dir(hf_config: Mapping[str, Any] | None, max_model_len: int) -> str:
    """A folder with a config.json: OPT-125m's (the adapter's) when `hf_config`
    is None, else `hf_config` itself."""
    if hf_config is None:
        from schedspec.reference.vllm_adapter import model_dir

        return model_dir(max_model_len)
    text = json.dumps(dict(hf_config), sort_keys=True)
    if text not in _model_dirs:
        d = tempfile.mkdtemp(prefix="schedspec-monitor-model-")
        atexit.register(shutil.rmtree, d, True)
        Path(d, "config.json").write_text(text)
        _model_dirs[text] = d
    return _model_dirs[text]


def vllm_config(*, max_model_len: int = 256, max_num_batched_tokens: int = 64, max_num_seqs: int = 8,
                block_size: int = 16, prefix_caching: bool = False, async_scheduling: bool = False,
                scheduler: Mapping[str, Any] | None = None, hf_config: Mapping[str, Any] | None = None,
                runner: str = "auto", **vllm_kw: Any):
    """A VllmConfig built by vLLM's own config classes; `vllm_kw` are further
    VllmConfig fields (speculative_config, lora_config, parallel_config, ...)."""
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    from schedspec.reference.vllm_adapter import platform_keeps_async_scheduling

    sc = SchedulerConfig(is_encoder_decoder=False, max_model_len=max_model_len,
                         max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                         async_scheduling=async_scheduling, **dict(scheduler or {}))
    mc = ModelConfig(model=model_dir(hf_config, max_model_len), skip_tokenizer_init=True,
                     max_model_len=max_model_len, dtype="float16", seed=42, runner=runner)
    cc = CacheConfig(block_size=block_size, enable_prefix_caching=prefix_caching)
    with platform_keeps_async_scheduling():
        vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc, **vllm_kw)
    if vc.cache_config.kv_cache_layout is None:  # as the adapter: one block is one page
        vc.cache_config.kv_cache_layout = "LBNHC"
    return vc


def full_attention(block_size: int = 16):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)


def kv_groups(*specs):
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    return [KVCacheGroupSpec([f"layer{i}"], spec) for i, spec in enumerate(specs)]


def build_scheduler(vc=None, *, cls=None, groups=None, num_blocks: int = 64, block_size: int | None = None,
                    hash_block_size: int | None = None, **config_kw: Any):
    """A vLLM scheduler of class `cls`, by default the class the config names
    (`get_scheduler_cls()`, as EngineCore.__init__ picks it), over `groups`
    (default: one FullAttentionSpec group) of `num_blocks` blocks."""
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.structured_output import StructuredOutputManager

    vc = vc if vc is not None else vllm_config(**config_kw)
    bs = block_size or vc.cache_config.block_size
    vc.cache_config.num_gpu_blocks = num_blocks
    kcc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=groups if groups is not None else kv_groups(full_attention(bs)))
    cls = cls or vc.scheduler_config.get_scheduler_cls()
    return cls(vllm_config=vc, kv_cache_config=kcc, structured_output_manager=StructuredOutputManager(vc),
               block_size=bs, hash_block_size=hash_block_size or bs, log_stats=True)


def block_hasher(sched):
    """The per-request block hasher EngineCore gives requests (v1/engine/core.py:220-230)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    vc = sched.vllm_config
    fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
    init_none_hash(fn)
    return get_request_block_hasher(sched.hash_block_size, fn, vc.num_hash_lookahead_tokens)


_prompt_seq = itertools.count(1)


def prompt(n: int, start: int | None = None) -> list[int]:
    """`n` token ids; a fresh run of them unless `start` is given (so no two
    prompts share a prefix by accident)."""
    first = start if start is not None else 3 + 97 * next(_prompt_seq) % 40000
    return [3 + (first + k) % 50000 for k in range(n)]


def request(rid: str, n: int | None = 20, *, sched=None, max_tokens: int = 4, tokens: list[int] | None = None,
            sampling: Mapping[str, Any] | None = None, **kw: Any):
    """A vLLM Request of `n` prompt tokens (or `tokens`); with `sched` given and
    prefix caching (or a KV connector) on there, it carries that scheduler's
    block hasher, as EngineCore's requests do.  `kw` are further Request
    arguments, `sampling` further SamplingParams ones."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    if "sampling_params" in kw:  # given, None included (a pooling request)
        params = kw.pop("sampling_params")
    else:
        params = SamplingParams(max_tokens=max_tokens, **dict(sampling or {}))
    if "prompt_token_ids" not in kw:
        kw["prompt_token_ids"] = list(tokens) if tokens is not None else prompt(n)
    if sched is not None and "block_hasher" not in kw and \
            (sched.cache_config.enable_prefix_caching or sched.connector is not None):
        kw["block_hasher"] = block_hasher(sched)
    kw.setdefault("pooling_params", None)
    return Request(request_id=rid, sampling_params=params, **kw)


def sampled_for(sched, scheduler_output, token: int = 100, stop: Mapping[str, int] | None = None
                ) -> dict[str, list[int]]:
    """What a model runner samples for a batch just scheduled: one token for
    each request whose scheduled chunk reaches its last known token, nothing
    for a non-final prefill chunk.  `stop` gives some requests another token."""
    out = {}
    for rid in scheduler_output.num_scheduled_tokens:
        r = sched.requests.get(rid)
        if r is not None and not r.is_prefill_chunk:
            out[rid] = [(stop or {}).get(rid, token)]
    return out


def runner_output(scheduler_output, sampled: Mapping[str, Iterable[int]], finished_recving: Iterable[str] = (),
                  failed_recving: Iterable[str] = (), finished_sending: Iterable[str] = ()):
    """A ModelRunnerOutput (v1/outputs.py) for every request of the batch; with
    the KV loads the worker reports finished or failed, and the sends it reports."""
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

    ids = list(scheduler_output.num_scheduled_tokens)
    kv = KVConnectorOutput(finished_recving=set(finished_recving) or None, failed_recving=set(failed_recving),
                           finished_sending=set(finished_sending) or None) \
        if finished_recving or failed_recving or finished_sending else None
    from schedspec.reference.vllm_adapter import runner_index

    return ModelRunnerOutput(req_ids=ids, **runner_index(ModelRunnerOutput, ids),
                             sampled_token_ids=[list(sampled.get(rid, ())) for rid in ids], kv_connector_output=kv)


def loading(sched) -> list[str]:
    """The requests waiting for remote KVs whose load is not yet reported finished."""
    done = sched.finished_recving_kv_req_ids
    return sorted(rid for rid, r in sched.requests.items()
                  if r.status.name == "WAITING_FOR_REMOTE_KVS" and rid not in done)


def step(sched, token: int = 100, stop: Mapping[str, int] | None = None, finish_loads: bool = False):
    """schedule, then update_from_output with what a model runner would sample;
    `finish_loads`: reporting every KV load in flight finished."""
    out = sched.schedule()
    sched.update_from_output(out, runner_output(out, sampled_for(sched, out, token, stop),
                                                loading(sched) if finish_loads else ()))
    return out


def run_to_completion(sched, limit: int = 200) -> int:
    """Steps until the scheduler holds no request (sync) or no batch is in
    flight and none is held (async: two batches in flight, as EngineCore)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    n = 0
    if not isinstance(sched, AsyncScheduler):
        while sched.requests and n < limit:
            step(sched)
            n += 1
        return n
    in_flight = []
    while (sched.requests or in_flight) and n < limit:
        if len(in_flight) < 2 and sched.requests:
            out = sched.schedule()
            in_flight.append((out, sampled_for(sched, out)))
            if len(in_flight) < 2:
                continue
        out, sampled = in_flight.pop(0)
        sched.update_from_output(out, runner_output(out, sampled))
        n += 1
    return n


# -- a KV connector that keeps a finished request's blocks (a delayed free) --------


def _delay_free_connector():
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

    class DelayFreeConnector(ExampleConnector):
        """vLLM's ExampleConnector that, like a connector still sending a
        finished request's KV, takes over freeing its blocks (base.py:631)."""

        # Kept as a truthy number, not True: an answer of another shape than the spec's
        # (delay_free, params), which the monitor still names (a bool one is modelled).
        def request_finished(self, request, block_ids):
            return 1, None

        def request_finished_all_groups(self, request, block_ids):
            return 1, None

    return DelayFreeConnector


def _answering(answer):
    from schedspec.reference.vllm_connector import answering_connector

    return answering_connector(answer)


def _matching_connector(answer):
    """A connector giving every admission the answer `answer(block_size)`."""
    from schedspec.reference.vllm_connector import answering_connector

    return answering_connector(lambda request, num_computed_tokens, block_size: answer(block_size))


# Connectors vLLM's factory loads by module path (kv_connector_module_path).
CONNECTORS = {
    "DelayFreeConnector": _delay_free_connector,
    # One block of external tokens, loaded within the step (a sync load, S:1177-1226).
    "OneBlockConnector": lambda: _matching_connector(lambda bs: (bs, False)),
    # One block loaded asynchronously: the request waits for remote KVs (S:1336-1338, 1576-1607).
    "OneBlockAsyncConnector": lambda: _matching_connector(lambda bs: (bs, True)),
    # The whole sequence, loaded asynchronously: the promotion leaves the last token to compute (S:3662-3663).
    "WholePromptAsyncConnector": lambda: _answering(
        lambda request, num_computed_tokens, block_size: (request.num_tokens - num_computed_tokens, True)),
    # Cannot tell yet: the request is skipped this step (S:1185-1190).
    "UndecidedConnector": lambda: _matching_connector(lambda bs: (None, False)),
    # A KV producer: loads nothing, sends every finished request's KV (S:3180-3200, 3517-3536).
    "SendingConnector": lambda: _sending_connector(),
}


def _sending_connector():
    from schedspec.reference.vllm_connector import answering_connector

    return answering_connector(lambda request, num_computed_tokens, block_size: (0, False), sends=lambda r: True)


def __getattr__(name: str):
    # vLLM's KV connector factory imports the class by module and name
    # (kv_connector_module_path); it is made on first use, after vLLM is imported.
    make = CONNECTORS.get(name)
    if make is not None:
        cls = make()
        cls.__name__ = cls.__qualname__ = name
        globals()[name] = cls
        return cls
    raise AttributeError(name)


# -- what the monitor saw ---------------------------------------------------------------


def calls_seen(stats: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """The calls with a nonzero total, with their counts."""
    return {c: dict(n) for c, n in stats["calls"].items() if n.get("total")}


def assert_clean(stats: Mapping[str, Any]) -> None:
    """No divergence and no monitor error."""
    assert stats["divergences"] == [], stats["divergences"]
    assert stats["monitor_errors"] == [], stats["monitor_errors"]


def assert_all_checked(stats: Mapping[str, Any], *calls: str) -> None:
    """Every call seen was checked (none outside scope, none failed), and
    `calls` were among them."""
    seen = calls_seen(stats)
    assert set(calls) <= set(seen), seen
    for call, n in seen.items():
        assert n.get("checked", 0) == n["total"], (call, n)
    assert stats["outside_scope"] == {}
    assert_clean(stats)


class Both:
    """vLLM and the spec side by side behind the implementation protocol: after
    every call, lift(vLLM) must equal the spec's state."""

    name = "both"

    def __init__(self, vllm):
        self.vllm, self.spec = vllm, SpecScheduler()
        self.rename: dict[bytes, bytes] = {}  # spec hash -> vLLM hash, learnt as blocks are hashed
        self.calls = 0

    def reset(self, config):
        self.vllm.reset(config)
        self.spec.reset(config)
        self.rename = {}

    def agree(self, call: str):
        self.calls += 1
        a, b = self.spec.observe(), self.vllm.observe()
        for rid, r in a.requests.items():  # every hash pairs with the one at its place
            v = b.requests.get(rid)
            if v is not None and len(v.block_hashes) == len(r.block_hashes):
                for x, y in zip(r.block_hashes, v.block_hashes):
                    assert self.rename.setdefault(x, y) == y, f"after {call}: hash renaming is not one to one"
        pa, pb = a.block_pool, b.block_pool
        if pa is not None and pb is not None:
            # A block hashed and freed in one call (its request finished in it) pairs
            # by block id, which both sides must agree on anyway; the renaming stays
            # one to one across every later call.
            for blk, x in pa.block_hash.items():
                y = pb.block_hash.get(blk)
                if y is not None and x not in self.rename:
                    assert y not in self.rename.values(), f"after {call}: hash renaming is not one to one"
                    self.rename[x] = y
        # pre = the spec's own state: every hash is known, so compare_states renames nothing itself
        d = compare_states(a, renamed(a, self.rename), b)
        assert d is None, f"after {call}: lift(vLLM) differs from the spec at {d.describe()}"

    def add_request(self, request):
        self.vllm.add_request(request)
        self.spec.add_request(request)
        self.agree("add_request")

    def finish_requests(self, ids, status):
        a, b = self.spec.finish_requests(ids, status), self.vllm.finish_requests(ids, status)
        assert list(a) == list(b)
        self.agree("finish_requests")
        return a

    def schedule(self):
        a, b = self.spec.schedule(), self.vllm.schedule()
        assert a == b, (a, b)
        self.agree("schedule")
        self.pending = getattr(self, "pending", {})
        self.pending[id(a)] = b
        return a

    def update_from_output(self, output, sampled, finished_recving=(), finished_sending=()):
        b = self.pending.pop(id(output))
        x = self.spec.update_from_output(output, sampled, finished_recving, finished_sending)
        y = self.vllm.update_from_output(b, sampled, finished_recving, finished_sending)
        assert list(x) == list(y)
        self.agree("update_from_output")
        return x

    def update_draft_token_ids(self, drafts):
        self.spec.update_draft_token_ids(drafts)
        self.vllm.update_draft_token_ids(drafts)
        self.agree("update_draft_token_ids")

    def grammar_compiled(self, request_ids, failed=False):
        self.spec.grammar_compiled(request_ids, failed)
        self.vllm.grammar_compiled(request_ids, failed)
        self.agree("grammar_compiled")

    def observe(self):
        return self.spec.observe()

    def close(self):
        pass
