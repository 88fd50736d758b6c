"""The real vLLM V1 scheduler (0.20.0 ... 0.34.0) behind schedspec's implementation protocol.

`VllmScheduler` drives `vllm.v1.core.sched.scheduler.Scheduler` (or
`AsyncScheduler`, sched/async_scheduler.py), built the way
vLLM's own unit tests build it (tests/v1/core/utils.py `create_scheduler`): an
offline OPT-125m model config (reference/vllm_model/config.json, its
`max_position_embeddings` raised to cover `max_model_len`), no tokenizer, one
full-attention KV cache group of `num_gpu_blocks` blocks.  With
`async_scheduling` the scheduler is `AsyncScheduler` with two batches in flight
(the CPU platform would switch async scheduling off; the adapter keeps the
value VllmConfig resolved, as a GPU platform does), and `update_from_output`
takes whichever batch the engine completes.  With `enable_prefix_caching`
requests carry the spec's prompt tokens and the block hasher EngineCore gives
them, and `observe()` reports the block pool block by block, with vLLM's block
ids and hashes (spec/block_pool.py).

Releases: the adapter runs whichever release of spec/versions.py RELEASES this
interpreter has (0.20.0 ... 0.34.0; `--impl vllm==X` runs X from its own
environment, cli/vllm_version.py) and refuses a config that models another one.
Where vLLM's internal API moved between releases, one function bridges it,
named "Bridge (...)" in its docstring with both sides' source lines, each
tested per release in tests/test_vllm_releases.py.

vLLM is imported lazily, on the first `reset()`, so the rest of schedspec never
needs it.  Install it with `schedspec install-vllm` (cli/install/install-vllm.sh).
The first import takes about 10 s; every further `reset()` builds a new
Scheduler in a few milliseconds, so keep one process for many scenarios.

What vLLM decides, vLLM decides: every scenario config field is handed to
vLLM's own config classes (SchedulerConfig, CacheConfig, ModelConfig,
VllmConfig), and their rejection (pydantic ValidationError or ValueError)
becomes a one-line ValueError.  The engine start-up check that the pool holds
one max_model_len sequence (v1/core/kv_cache_planning.py
`check_enough_kv_cache_memory`, run by EngineCore before the scheduler exists)
is applied here too, since building a Scheduler directly skips it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, Mapping, Sequence

from schedspec.spec.config import SchedulerConfig
from schedspec.spec.request import Request, RequestStatus
from schedspec.spec.state import SchedulerOutput, SchedulerState
from schedspec.spec.versions import DEFAULT_RELEASE, ENCODER_INPUTS, FIELDS_SINCE, RELEASES, STRUCTURED_OUTPUT, \
    models, not_modelled, release_key, spec_release_for

from .vllm_lift import COMPARE_WITH_ENV
from .vllm_lift import SCHEDULER_CONFIG_FIELDS as LIFTED_SCHEDULER_CONFIG_FIELDS
from .vllm_lift import KV_ASYNC_ATTR, KV_CONNECTOR_ATTR, KV_SENDS_ATTR, LiftError, lift_output, lift_state, \
    loads_in_flight, mark_held, waiting_status

MODEL_CONFIG = Path(__file__).parent / "vllm_model" / "config.json"
VLLM_VERSION = DEFAULT_RELEASE  # the release `schedspec install-vllm` puts into .venv
MAX_MODEL_LEN = 2**24  # prompts up to 16 M tokens: a 128 MiB token list per request at most

# The spec's config fields that vLLM's SchedulerConfig takes under the same name:
# those the lift reads back from it, and two it takes but keeps elsewhere.
SCHEDULER_CONFIG_FIELDS = ("max_model_len",) + LIFTED_SCHEDULER_CONFIG_FIELDS + ("async_scheduling",
                                                                              "disable_chunked_mm_input")

_vllm: dict[str, Any] | None = None  # the lazily imported vLLM names
_model_dirs: dict[int, str] = {}  # max_position_embeddings -> model folder
_tmp_root: str | None = None
_base_config: dict[str, Any] | None = None


def import_vllm() -> dict[str, Any]:
    """Import the vLLM pieces once per process (about 10 s)."""
    global _vllm
    if _vllm is not None:
        return _vllm
    # Must be set before vLLM is imported: without a device vLLM cannot build
    # a VllmConfig ("Failed to infer device type"); no network, no tokenizer.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # vLLM's warnings about the missing GPU, Triton and compiled ops concern
    # the model runner, not the scheduler; keep them off the user's terminal.
    logging.getLogger("vllm").setLevel(logging.ERROR)
    import torch
    import vllm

    select_cpu_platform(vllm.__version__)
    from vllm.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig as VSchedulerConfig, SpeculativeConfig, VllmConfig
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import SamplingParams
    check_enough_kv_cache_memory = import_check_enough_kv_cache_memory()
    from vllm.v1.core.kv_cache_utils import get_block_hash, get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1 import outputs as vllm_outputs
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request as VRequest
    from vllm.v1.request import RequestStatus as VRequestStatus
    from vllm.v1.structured_output import StructuredOutputManager

    # KV connector output (finished loads): asynchronous loads are modelled from 0.33.0 on.
    KVConnectorOutput = getattr(vllm_outputs, "KVConnectorOutput", None)

    installed = getattr(vllm, "__version__", None)
    # A vLLM that is not a modelled release (a later one, a build of vLLM's main branch)
    # runs as the newest modelled release at or below it: its bridges, and the spec's
    # rules at that release (cli/vllm_version.py says so in one line).
    release = spec_release_for(installed or "")
    if release is None:
        raise ImportError(
            f"schedspec models vLLM {', '.join(RELEASES)} and compares later ones with the newest of those, but "
            f"vllm {installed or '?'} is installed; run `schedspec install-vllm` (or `--version X` for release X)")
    _vllm = dict(version=release, installed=installed,
        torch=torch, CacheConfig=CacheConfig, ModelConfig=ModelConfig,
        SchedulerConfig=VSchedulerConfig, VllmConfig=VllmConfig, SamplingParams=SamplingParams,
        check_enough_kv_cache_memory=check_enough_kv_cache_memory, Scheduler=Scheduler,
        AsyncScheduler=AsyncScheduler, get_block_hash=get_block_hash,
        get_request_block_hasher=get_request_block_hasher, init_none_hash=init_none_hash,
        get_hash_fn_by_name=get_hash_fn_by_name,
        FullAttentionSpec=FullAttentionSpec, KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec, ModelRunnerOutput=ModelRunnerOutput, KVConnectorOutput=KVConnectorOutput,
        SpeculativeConfig=SpeculativeConfig, DraftTokenIds=DraftTokenIds, LoRAConfig=LoRAConfig,
        LoRARequest=LoRARequest,
        Request=VRequest, RequestStatus=VRequestStatus,
        StructuredOutputManager=StructuredOutputManager,
    )
    return _vllm


# The first release (of RELEASES) whose platform detection reads VLLM_TARGET_DEVICE.
TARGET_DEVICE_READ_SINCE = "0.28.0"


def select_cpu_platform(version: str) -> bool:
    """Bridge (platform): from 0.28.0 `cpu_platform_plugin` takes VLLM_TARGET_DEVICE=cpu
    (0.28.0 platforms/__init__.py:164); 0.25.0 and earlier detect the CPU platform only
    from a vLLM build whose version names cpu, or macOS (0.25.0
    platforms/__init__.py:162-183), and a PyPI wheel on Linux gets no platform at all
    ("Failed to infer device type").  There the CPU platform is set by hand, as the
    plugin would have chosen it.  True when it was."""
    if version not in RELEASES or release_key(version) >= release_key(TARGET_DEVICE_READ_SINCE):
        return False
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    if isinstance(platforms.current_platform, CpuPlatform):
        return False
    # A module attribute: found before the module's lazy __getattr__ (PEP 562).
    platforms.current_platform = CpuPlatform()
    return True


def import_check_enough_kv_cache_memory():
    """Bridge (start-up check's home): EngineCore's check that the pool holds one
    max_model_len sequence is in v1/core/kv_cache_planning.py from 0.33.0
    (KP:196), in v1/core/kv_cache_utils.py before (0.32.0: line 1104; same
    signature: vllm_config, kv_cache_spec, available_memory)."""
    try:
        from vllm.v1.core.kv_cache_planning import check_enough_kv_cache_memory
    except ImportError:
        from vllm.v1.core.kv_cache_utils import check_enough_kv_cache_memory
    return check_enough_kv_cache_memory


def request_block_hasher(v: Mapping[str, Any], vllm_config: Any, block_size: int, hash_fn: Any,
                         lookahead: int = 0):
    """Bridge (block hasher): EngineCore passes `num_hash_lookahead_tokens` from
    0.33.0 (E:242-252); 0.32.0 and earlier have no such config attribute and
    build the hasher from the block size and hash function alone (0.32.0
    core.py:238-240).  `lookahead`: the scenario's, which vLLM derives from an
    EAGLE-family drafter (config/vllm.py:677-692) the adapter does not build; the
    hasher is given it as vLLM's own tests give it (test_scheduler.py:456-497)."""
    if getattr(vllm_config, "num_hash_lookahead_tokens", None) is None:
        return v["get_request_block_hasher"](block_size, hash_fn)
    return v["get_request_block_hasher"](block_size, hash_fn,
                                         max(lookahead, vllm_config.num_hash_lookahead_tokens))


def model_dir(max_model_len: int) -> str:
    """A folder holding OPT-125m's config.json with max_position_embeddings at
    least `max_model_len` (ModelConfig caps max_model_len by it).  One folder per
    power of two, so vLLM's per-path config caches stay valid."""
    global _tmp_root, _base_config
    if _base_config is None:
        _base_config = json.loads(MODEL_CONFIG.read_text())
    base = dict(_base_config)
    mpe = int(base.get("max_position_embeddings", 2048))
    while mpe < max_model_len:
        mpe *= 2
    if mpe not in _model_dirs:
        if _tmp_root is None:
            _tmp_root = tempfile.mkdtemp(prefix="schedspec-vllm-model-")
            atexit.register(shutil.rmtree, _tmp_root, True)
        d = Path(_tmp_root) / f"opt-125m-mpe{mpe}"
        d.mkdir(parents=True, exist_ok=True)
        base["max_position_embeddings"] = mpe
        (d / "config.json").write_text(json.dumps(base))
        _model_dirs[mpe] = str(d)
    return _model_dirs[mpe]


# The first release (of RELEASES) whose CPU platform refuses an x86 machine without Triton.
TRITON_CHECKED_SINCE = "0.34.0"


@contextlib.contextmanager
def triton_presumed():
    """Bridge (Triton check): from 0.34.0 the CPU platform's config hook refuses an
    x86 CPU without Triton ("vLLM on x86 CPUs requires Triton (triton-cpu)", 0.34.0
    platforms/cpu.py:239-243: it reads `vllm.triton_utils.HAS_TRITON` when called),
    because the x86 model runner's kernels are Triton ones; 0.33.0's hook has no such
    check.  That hook runs while a VllmConfig is built, before any scheduler exists,
    and the scheduler runs no kernel.  So for the duration of the hook alone, and
    only where that release's vLLM found no Triton, HAS_TRITON reads true; it is
    put back as found afterwards (nothing else reads it in the meantime: the
    hook's other lines, cpu.py:245-546, do not).  Triton itself is never
    installed or imported."""
    import vllm

    if release_key(spec_release_for(vllm.__version__) or TRITON_CHECKED_SINCE) < release_key(TRITON_CHECKED_SINCE):
        yield
        return
    import vllm.triton_utils as triton_utils

    if triton_utils.HAS_TRITON:
        yield
        return
    triton_utils.HAS_TRITON = True
    try:
        yield
    finally:
        triton_utils.HAS_TRITON = False


def check_without_triton(hook):
    """`hook` (a platform's check_and_update_config, or the function under its
    classmethod) run under `triton_presumed`; for vLLM's own tests (monitor/pytest_plugin.py)."""

    def check_and_update_config(*args, **kwargs):
        with triton_presumed():
            return hook(*args, **kwargs)

    check_and_update_config.schedspec_bridge = True
    return check_and_update_config


def bridge_cpu_platform_check() -> bool:
    """For code that builds its own VllmConfig (vLLM's tests, under peer-tests): the CPU
    platform class's config hook, run under `triton_presumed` from now on, for this
    process.  True when it was bridged now (not already)."""
    from vllm.platforms.cpu import CpuPlatform

    hook = CpuPlatform.__dict__.get("check_and_update_config")
    if not isinstance(hook, classmethod) or getattr(hook.__func__, "schedspec_bridge", False):
        return False
    CpuPlatform.check_and_update_config = classmethod(check_without_triton(hook.__func__))
    return True


@contextlib.contextmanager
def platform_keeps_async_scheduling():
    """While a VllmConfig is built: the CPU platform hook switches async
    scheduling off whatever was asked (platforms/cpu.py:348, called from
    config/vllm.py:2067), and no other platform touches it.  The scheduler does
    not depend on the device, so the value VllmConfig resolved before the hook
    (an explicit value, checked at config/vllm.py:1668-1684, or None resolved
    at 1685-1719) is put back, as a GPU platform would leave it.  The hook runs
    under `triton_presumed` (0.34.0's Triton check)."""
    from vllm.platforms import current_platform

    hook = current_platform.check_and_update_config

    def check_and_update_config(vllm_config):
        resolved = vllm_config.scheduler_config.async_scheduling
        with triton_presumed():
            hook(vllm_config)
        vllm_config.scheduler_config.async_scheduling = resolved

    current_platform.check_and_update_config = check_and_update_config  # shadows the classmethod
    try:
        yield
    finally:
        del current_platform.check_and_update_config


def _one_line(e: BaseException) -> str:
    """vLLM's rejection as one line (pydantic messages span several)."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            loc = ".".join(str(x) for x in first.get("loc", ()))
            msg = first.get("msg", "")
            got = first.get("input", None)
            msg = re.sub(r"^Value error, ", "", re.sub(r"\s+", " ", msg)).strip()
            if isinstance(got, (int, float, str, bool)) or got is None:
                msg = f"{msg} (got {got!r})"
            text = f"{loc}: {msg}" if loc else msg
            return f"vLLM {installed_version()} rejects the config: {text}"
        except Exception:  # noqa: BLE001 - fall back to the plain text
            pass
    text = re.sub(r"\s+", " ", str(e)).strip()
    return f"vLLM {installed_version()} rejects the config: {text}"


def installed_version() -> str:
    return import_vllm()["version"]


def scheduler_config_kwargs(v: Mapping[str, Any], c: SchedulerConfig) -> dict[str, Any]:
    """Bridge (fields): the config fields to hand to vLLM's SchedulerConfig.  A field
    the installed release lacks (the cache-aware admission window and threshold
    before 0.34.0, max_num_active_seqs before 0.31.0, watermark before 0.25.0:
    spec/versions.py FIELDS_SINCE) is left out when the config holds the value that
    means the older behaviour; any other value is handed over, and that release's
    pydantic refuses it ("Unexpected keyword argument"), as it refuses the flag
    from a user."""
    have = set(getattr(v["SchedulerConfig"], "__dataclass_fields__", ()))
    kwargs = {}
    for f in SCHEDULER_CONFIG_FIELDS:
        value = getattr(c, f)
        if f in have or value != FIELDS_SINCE.get(f, (None, SchedulerConfig.__dataclass_fields__[f].default))[1]:
            kwargs[f] = value
    # Prefill throttling's interval, applied by the scheduler itself on this engine
    # without data parallelism (S:403-407), and the adaptive long-prefill threshold;
    # only where set (the spec refuses both before 0.33.0, spec/config.py).
    if c.prefill_schedule_interval != 1:
        kwargs["prefill_schedule_interval"] = c.prefill_schedule_interval
    if c.long_prefill_token_threshold_adaptive:
        kwargs["long_prefill_token_threshold_adaptive"] = True
    return kwargs


def max_concurrent_batches(vllm_config: Any) -> int:
    """Bridge (batch queue size): VllmConfig.max_concurrent_batches from 0.25.0
    (V:560-566); in 0.20.0 the executor answers (0.20.0
    v1/executor/uniproc_executor.py:64-65 and multiproc_executor.py:475-478: 2 with
    async scheduling and no pipeline parallelism, else the pipeline size, 1 here)."""
    batches = getattr(vllm_config, "max_concurrent_batches", None)
    if batches is not None:
        return batches
    pp_size = vllm_config.parallel_config.pipeline_parallel_size
    return 2 if pp_size <= 1 and vllm_config.scheduler_config.async_scheduling else pp_size


def validation_errors() -> tuple[type[BaseException], ...]:
    """Bridge (VLLMError): SamplingParams refuses a value with VLLMValidationError, a
    ValueError up to 0.25.0 (0.25.0 vllm/exceptions.py:9) but a VLLMClientError <
    VLLMError < Exception, not a ValueError, from 0.28.0 on (0.28.0
    vllm/exceptions.py:27; 0.33.0 vllm/exceptions.py:10-28).  Both are caught as the
    rejection they are."""
    from vllm import exceptions

    return (ValueError, *(c for c in (getattr(exceptions, "VLLMError", None),) if c is not None))


def runner_index(output_cls: type, req_ids: Sequence[str]) -> dict[str, Any]:
    """Bridge (output index): up to 0.33.0 a ModelRunnerOutput carries `req_id_to_index`
    (0.33.0 v1/outputs.py:270-271), which update_from_output reads a request's row by;
    0.34.0 dropped the field (v1/outputs.py:267-275) and builds the index from `req_ids`
    itself (0.34.0 scheduler.py:2355-2358, read at :2387).  The keyword for the
    installed release: the index, or none."""
    if "req_id_to_index" in getattr(output_cls, "__dataclass_fields__", ()):
        return {"req_id_to_index": {rid: i for i, rid in enumerate(req_ids)}}
    return {}


# The first release (of RELEASES) whose drafters' rows in the target batch follow
# their method: no parallel n-gram drafter, a standalone draft model's one row.
DRAFTER_ROWS_BY_METHOD_SINCE = "0.34.0"


def drafter_kwargs(version: str, c: SchedulerConfig, model_config: Any) -> dict[str, Any]:
    """Bridge (drafter rows): the SpeculativeConfig arguments of a drafter with
    `c.num_speculative_tokens` drafts and `c.max_num_new_slots_for_drafting` rows of
    its own per scheduled request in the target batch.  0 rows: an n-gram drafter,
    as vLLM's tests build it (tests/v1/core/utils.py create_scheduler), no draft
    model to load; async scheduling takes the GPU n-gram drafter (0.33.0
    config/vllm.py:1655-1680).  Up to 0.33.0, K - 1 rows: a parallel drafter reusing
    the query (0.33.0 speculative.py:2085-2092), as vLLM's own test builds one over
    n-gram.  From 0.34.0 a drafter's rows are its method's (0.34.0
    speculative.py:1742-1751): parallel drafting is dflash's and dspark's alone, with
    no rows (:1688-1697), and 1 row is a standalone draft model's
    (spec_decode/standalone_ar/config.py:23-26), built here over the target's own
    config.json, whose weights are never loaded."""
    k, slots = c.num_speculative_tokens, c.max_num_new_slots_for_drafting
    method = "ngram_gpu" if c.async_scheduling else "ngram"
    ngram = dict(model=method, method=method, num_speculative_tokens=k, prompt_lookup_max=k, prompt_lookup_min=1)
    if release_key(version) < release_key(DRAFTER_ROWS_BY_METHOD_SINCE):
        if slots not in (0, k - 1):
            raise ValueError(f"config.max_num_new_slots_for_drafting: = {slots}: the vLLM adapter builds an "
                             f"n-gram drafter, with 0 rows, or a parallel one, with num_speculative_tokens - 1 = "
                             f"{k - 1}; use one of those")
        return {**ngram, "parallel_drafting": True} if slots else ngram
    if slots not in (0, 1):
        raise ValueError(f"config.max_num_new_slots_for_drafting: = {slots}: vLLM {version}'s drafters add 0 rows "
                         f"(n-gram, EAGLE, MTP, DFlash) or 1 (a standalone draft model); use one of those")
    if not slots:
        return ngram
    from vllm.config import ParallelConfig

    return dict(model=model_config.model, method="draft_model", num_speculative_tokens=k,
                target_model_config=model_config, target_parallel_config=ParallelConfig())


def finished_ids(done: Iterable[Any]) -> set[str]:
    """Bridge (finish_requests' answer): the finished requests themselves from 0.28.0
    (0.28.0 scheduler.py:2325-2327, `-> list[Request]`); (request_id, client_index)
    pairs in 0.25.0 and earlier (0.25.0 scheduler.py:2036-2038, :2100)."""
    return {d[0] if isinstance(d, tuple) else d.request_id for d in done}


_accepting_grammar: list[type] = []


def AcceptingGrammar():  # noqa: N802 - builds an instance, as a class would
    """A grammar that accepts every token: the fake model's outputs are free text to it,
    so structured output changes no decision but the wait for compilation (docs/formats.md)."""
    if not _accepting_grammar:
        from vllm.v1.structured_output.backend_types import StructuredOutputGrammar

        class Accepting(StructuredOutputGrammar):
            def accept_tokens(self, request_id, tokens):
                return True

            def validate_tokens(self, tokens):
                return list(tokens)

            def rollback(self, num_tokens):
                pass

            def fill_bitmask(self, bitmask, batch_index):
                pass

            def is_terminated(self):
                return False

            def reset(self):
                pass

        _accepting_grammar.append(Accepting)
    return _accepting_grammar[0]()


class ReportedSet(set):
    """The worker's finished_recving or finished_sending: a set, as vLLM types it, that
    vLLM iterates (S:3716, 3730) in the order given.  A plain set of strings iterates
    in an order that changes with the process's hash seed, and several frees in one
    update then reach the free queue, and later evictions, in that order."""

    def __init__(self, items=()):
        self.order = list(dict.fromkeys(items))
        super().__init__(self.order)

    def __iter__(self):
        return iter(self.order)


def _check_runnable(v: Mapping[str, Any], c: SchedulerConfig) -> None:
    """What the adapter refuses before vLLM sees the config: a prompt too long to hold,
    a release other than this interpreter's."""
    if c.max_model_len > MAX_MODEL_LEN:
        # vLLM's Request holds every prompt token id in a Python list.
        raise ValueError(f"config.max_model_len: = {c.max_model_len} is beyond what the vLLM adapter "
                         f"runs ({MAX_MODEL_LEN}): vLLM keeps every token id of a prompt in memory")
    # `schedspec keep-up X --against Y` compares vLLM X with the spec at an older Y.
    if c.vllm_version != v["version"] and c.vllm_version != os.environ.get(COMPARE_WITH_ENV):
        raise ValueError(f"config.vllm_version: = {c.vllm_version!r}, but this interpreter runs vLLM "
                         f"{v['installed']}; use --impl vllm=={c.vllm_version}")


def _vllm_config(v: Mapping[str, Any], c: SchedulerConfig) -> tuple[Any, Any]:
    """vLLM's VllmConfig for `c` and the KV cache spec of its one group; a config vLLM
    (or EngineCore's start-up check) rejects raises ValueError on one line."""
    try:
        scheduler_config = v["SchedulerConfig"](is_encoder_decoder=False, **scheduler_config_kwargs(v, c))
        model_config = v["ModelConfig"](
            model=model_dir(c.max_model_len) if isinstance(c.max_model_len, int) else "",
            skip_tokenizer_init=True,
            max_model_len=c.max_model_len,
            dtype="float16",
            seed=42,
        )
        cache_config = v["CacheConfig"](
            block_size=c.block_size,
            enable_prefix_caching=c.enable_prefix_caching,
        )
        # Speculative decoding with an n-gram drafter, as vLLM's tests build it
        # (tests/v1/core/utils.py create_scheduler): no draft model to load.  Async
        # scheduling takes the GPU n-gram drafter only (config/vllm.py:1655-1680);
        # neither has rows or lookahead of its own (speculative.py:2058-2098).
        # A drafter's rows in the target batch: see `drafter_kwargs`.
        speculative_config = v["SpeculativeConfig"](
            **drafter_kwargs(v["version"], c, model_config)) if c.num_speculative_tokens else None
        with platform_keeps_async_scheduling():
            vllm_config = v["VllmConfig"](
                scheduler_config=scheduler_config,
                model_config=model_config,
                cache_config=cache_config,
                speculative_config=speculative_config,
                # LoRA: the scheduler reads max_loras only; no adapter weights are loaded.
                lora_config=v["LoRAConfig"](max_loras=c.max_loras) if c.max_loras is not None else None,
            )
        if c.num_prefill_lookahead_tokens:
            _switch_to_eagle_family(v, c, vllm_config.speculative_config)
        # The engine core resolves the physical KV layout before sizing the
        # pool (v1/attention/backends/utils.py:293); a pre-set value is
        # honoured as is.  One block is one page whatever the layout.
        # Bridge (KV layout): CacheConfig.kv_cache_layout exists from 0.30.0
        # (0.30.0 config/cache.py:80); 0.28.0 and earlier size pages without it.
        if getattr(vllm_config.cache_config, "kv_cache_layout", "absent") is None:
            vllm_config.cache_config.kv_cache_layout = "LBNHC"
        kv_spec = v["FullAttentionSpec"](
            block_size=vllm_config.cache_config.block_size, num_kv_heads=1, head_size=1, dtype=v["torch"].float32)
        _check_enough_kv_cache(v, c, vllm_config, kv_spec)
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        raise ValueError(_one_line(e)) from None
    return vllm_config, kv_spec


def _switch_to_eagle_family(v: Mapping[str, Any], c: SchedulerConfig, spec: Any) -> None:
    """An EAGLE-family drafter: EAGLE-3 reads one prompt token past a chunk, a
    multi-module MTP drafter num_speculative_tokens (config/vllm.py:654-675).
    Building one needs a draft model, so the n-gram config is switched in place
    before the scheduler reads it, as vLLM's own
    test_block_drafters_cap_requests_instead_of_draft_slots does.  The request
    hashers take the scenario's lookahead (VllmScheduler.reset), so the scheduler's own is
    off, and its block drop follows the scenario (S:330-345, T:834-842)."""
    lookahead, k = c.num_prefill_lookahead_tokens, c.num_speculative_tokens
    if lookahead not in (1, k):
        raise ValueError(f"config.num_prefill_lookahead_tokens: = {lookahead}: the vLLM adapter builds "
                         f"an EAGLE-3 drafter, reading 1, or a multi-module MTP one, reading "
                         f"num_speculative_tokens = {k}; use one of those")
    if c.max_num_new_slots_for_drafting and \
            release_key(v["version"]) >= release_key(DRAFTER_ROWS_BY_METHOD_SINCE):
        raise ValueError(f"config.num_prefill_lookahead_tokens: = {lookahead} with "
                         f"max_num_new_slots_for_drafting = {c.max_num_new_slots_for_drafting}: vLLM "
                         f"{v['version']}'s EAGLE-family drafters add no rows (see drafter_kwargs)")
    object.__setattr__(spec, "method", "eagle3" if lookahead == 1 else "mtp")
    if lookahead > 1:
        # 0.33.0 counts the modules from num_nextn_predict_layers; 0.34.0 picks the
        # multi-module drafter from n_predict and the model type (0.34.0
        # config/speculative.py:1808-1827, spec_decode/mtp/config.py:31-40).
        object.__setattr__(spec, "draft_model_config", SimpleNamespace(
            hf_config=SimpleNamespace(num_nextn_predict_layers=k, n_predict=k,
                                      model_type="deepseek_mtp"), architectures=[]))
    object.__setattr__(spec, "disable_lookahead_block_hashes", True)
    object.__setattr__(spec, "disable_eagle_block_drop", not c.use_eagle_block_drop)


def _check_enough_kv_cache(v: Mapping[str, Any], c: SchedulerConfig, vllm_config: Any, kv_spec: Any) -> None:
    """EngineCore's start-up check (kv_cache_planning.py:151): a pool of
    num_gpu_blocks pages, less the null block, must hold one max_model_len sequence."""
    block_size = vllm_config.cache_config.block_size
    try:
        v["check_enough_kv_cache_memory"](
            vllm_config, {"layer": kv_spec}, c.num_gpu_blocks * kv_spec.page_size_bytes)
    except ValueError as e:
        need = -(-c.max_model_len // block_size)
        raise ValueError(
            f"engine start-up check: num_gpu_blocks = {c.num_gpu_blocks} leaves "
            f"{c.num_gpu_blocks - 1} usable blocks, fewer than the {need} one "
            f"max_model_len ({c.max_model_len}) sequence needs at block_size {block_size}. "
            f"vLLM says: {e}") from None


def _scheduler_class(v: Mapping[str, Any], vllm_config: Any) -> type:
    """The Scheduler class vLLM resolved (pydantic takes 1, "yes", ... as true; None =
    auto), checked against the engine loop's: AsyncScheduler with two batches in flight
    under async scheduling, Scheduler with one otherwise."""
    want_async = bool(vllm_config.scheduler_config.async_scheduling)
    scheduler_cls = vllm_config.scheduler_config.get_scheduler_cls()
    expected_cls = v["AsyncScheduler"] if want_async else v["Scheduler"]
    # EngineCore keeps max_concurrent_batches batches in flight (core.py:208);
    # formats.md's async engine loop is written for two.
    expected_batches = 2 if want_async else 1
    batches = max_concurrent_batches(vllm_config)
    if scheduler_cls is not expected_cls or batches != expected_batches:
        raise RuntimeError(
            f"vLLM adapter: async_scheduling={want_async} gives {scheduler_cls.__name__} with "
            f"max_concurrent_batches={batches}; expected "
            f"{expected_cls.__name__} with {expected_batches}")
    return scheduler_cls


def _check_drafter_built(sched: Any, spec: Any, c: SchedulerConfig) -> None:
    """The drafter vLLM built reads ahead, drops blocks and adds rows as the scenario asks."""
    built = (getattr(sched, "num_prefill_lookahead", 0), bool(getattr(sched, "use_eagle_block_drop", False)),
             # (a release without the property reads as the scenario's rows)
             getattr(spec, "max_num_new_slots_for_drafting", c.max_num_new_slots_for_drafting)
             if spec is not None else 0)
    if built != (c.num_prefill_lookahead_tokens, c.use_eagle_block_drop, c.max_num_new_slots_for_drafting):
        raise RuntimeError(f"vLLM adapter: the drafter built reads {built[0]} prompt tokens ahead, "
                           f"{'drops' if built[1] else 'keeps'} a prefix hit's last block and adds {built[2]} "
                           f"rows; the scenario asks {c.num_prefill_lookahead_tokens}, "
                           f"use_eagle_block_drop={c.use_eagle_block_drop} and "
                           f"max_num_new_slots_for_drafting={c.max_num_new_slots_for_drafting}")


def _set_drafter_lookahead(sched: Any, c: SchedulerConfig, block_size: int) -> None:
    """A drafter with its own forward pass (EAGLE, a draft model) reserves
    lookahead KV slots (config/vllm.py:626-653); building one needs its
    weights' config, so the adapter sets the one value the scheduler reads
    from it, once, at construction (S:300), as such a drafter would.  (The
    EAGLE-family switch (_switch_to_eagle_family) and 0.34.0's draft model made it
    num_speculative_tokens: the scenario's replaces it.)"""
    sched.num_lookahead_tokens = c.num_lookahead_tokens
    if not hasattr(sched, "use_v2_model_runner") and hasattr(sched, "can_skip_drafts"):
        # 0.34.0 derives from it, at construction, whether a step may skip drafting
        # (0.34.0 scheduler.py:321), which only the output's skip_drafts reports.
        sched.can_skip_drafts = c.num_lookahead_tokens > 0
    if hasattr(sched, "_spec_decode_step_blocks"):
        # 0.33.0 sizes one speculative step's blocks from it at construction (S:372-381),
        # which an asynchronous KV load leaves free (S:1489-1492): one full-attention group.
        step_tokens = 1 + c.num_speculative_tokens + c.num_lookahead_tokens
        sched._spec_decode_step_blocks = -(-step_tokens // block_size)


def _record_preemptions(sched: Any, preempted: list[str]) -> None:
    """vLLM keeps the ids preempted in a step in a set; record the order of
    `_preempt_request` calls in `preempted` instead (S:1853)."""
    original = sched._preempt_request

    def _preempt_request(request, *args, **kwargs):
        preempted.append(request.request_id)
        return original(request, *args, **kwargs)

    _preempt_request.schedspec_recorder = True  # an observer, not a change: the monitor's scope allows it
    sched._preempt_request = _preempt_request


class VllmScheduler:
    """vLLM's `Scheduler` (or `AsyncScheduler`), of the release this interpreter has,
    behind the implementation protocol (reference/impl.py)."""

    name = "vllm"

    def __init__(self) -> None:
        self._v = import_vllm()
        self.vllm_version = self._v["version"]  # the release this process runs (cli/vllm_version.py)
        self.config: SchedulerConfig | None = None
        self.sched = None
        self._block_hasher = None
        # Every vLLM SchedulerOutput not yet applied, by the identity of the spec
        # output made from it: under async scheduling two batches are in flight
        # and update_from_output() may be handed the older one.
        self._in_flight: dict[int, tuple[SchedulerOutput, Any]] = {}
        self._preempted: list[str] = []
        # vLLM keeps finished ids in a set (S:3194); the order they finished in.
        self._finish_order: list[str] = []
        self._token_seq = 0

    # -- construction -------------------------------------------------------

    def reset(self, config: SchedulerConfig) -> None:
        """Build a fresh vLLM Scheduler for `config`; a config vLLM rejects
        raises ValueError with vLLM's reason on one line."""
        self.close()
        v = self._v
        c = config
        _check_runnable(v, c)
        vllm_config, kv_spec = _vllm_config(v, c)
        block_size = vllm_config.cache_config.block_size
        want_caching = bool(vllm_config.cache_config.enable_prefix_caching)
        scheduler_cls = _scheduler_class(v, vllm_config)
        kv_cache_config = v["KVCacheConfig"](
            num_blocks=c.num_gpu_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[v["KVCacheGroupSpec"](["layer"], kv_spec)],
        )
        vllm_config.cache_config.num_gpu_blocks = c.num_gpu_blocks
        sched = scheduler_cls(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=v["StructuredOutputManager"](vllm_config),
            block_size=block_size,
            # One full-attention group: EngineCore's resolve_kv_cache_block_sizes
            # (core.py:176) gives hash block size = block size.
            hash_block_size=block_size,
            log_stats=True,
        )
        _check_drafter_built(sched, vllm_config.speculative_config, c)
        if c.num_lookahead_tokens or c.num_prefill_lookahead_tokens or getattr(sched, "num_lookahead_tokens", 0):
            _set_drafter_lookahead(sched, c, block_size)
        if models(v["version"], ENCODER_INPUTS):
            # Encoder inputs: the model directory is a text-only one, for which vLLM sizes
            # no encoder budget or cache (S:267-295); the adapter gives the scheduler the
            # scenario's, once, at construction, as vLLM's own scheduler tests do
            # (tests/v1/core/test_scheduler.py sets both attributes).
            from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

            sched.max_num_encoder_input_tokens = c.encoder_compute_budget
            sched.encoder_cache_manager = EncoderCacheManager(cache_size=c.encoder_cache_capacity)
        self._block_hasher = None
        if want_caching:
            # As EngineCore does (v1/engine/core.py:219-230).
            hash_fn = v["get_hash_fn_by_name"](vllm_config.cache_config.prefix_caching_hash_algo)
            v["init_none_hash"](hash_fn)
            self._block_hasher = request_block_hasher(v, vllm_config, block_size, hash_fn,
                                                      c.num_hash_lookahead_tokens)
        _record_preemptions(sched, self._preempted)
        self.sched = sched
        self.config = config
        self._vllm_config = vllm_config
        self._kv_cache_config = kv_cache_config
        self._kv_store = None  # the scenario connector's (vllm_connector.py), once a request needs one
        if config.requires_kv_delivery:
            from .vllm_connector import attach_scenario_connector

            self._kv_store = attach_scenario_connector(sched, vllm_config, kv_cache_config, requires_kv_delivery=True)
        self._in_flight = {}
        self._finish_order = []
        self._token_seq = 0

    # -- the four scheduler calls ------------------------------------------

    def add_request(self, request: Request) -> None:
        v = self._v
        try:
            params = v["SamplingParams"](max_tokens=request.max_tokens, stop_token_ids=list(request.stop_token_ids))
        except validation_errors() as e:  # the protocol's rejection: a one-line ValueError
            raise ValueError(f"vLLM {v['version']} rejects request {request.request_id}: {e}") from None
        # 0.33.0's Request takes no eos_token_id; the engine front end puts EOS
        # into SamplingParams (sampling_params.py:775, `_eos_token_id`), which
        # check_stop reads (sched/utils.py:101).
        if request.eos_token_id is not None:
            params.update_from_generation_config({}, eos_token_id=request.eos_token_id)
        kwargs = {}
        if self._block_hasher is not None:
            # The prompt decides which blocks are shared: the spec's own tokens.
            if len(request.prompt_token_ids) != request.num_prompt_tokens:
                raise ValueError(f"request {request.request_id}: prefix caching needs its "
                                 f"{request.num_prompt_tokens} prompt token ids")
            prompt = list(request.prompt_token_ids)
            kwargs["block_hasher"] = self._block_hasher
        else:
            # Distinct first tokens: no two requests share a prompt prefix.
            self._token_seq += 1
            first = 3 + (self._token_seq % 50000)
            prompt = [first] + [(first + k) % 50000 + 3 for k in range(1, request.num_prompt_tokens)]
        if request.lora_int_id:
            # The scheduler reads the adapter's id; its name is what prefix caching hashes.
            kwargs["lora_request"] = v["LoRARequest"](f"lora{request.lora_int_id}", request.lora_int_id,
                                                      "/schedspec/no-adapter-weights")
        if request.mm_features:
            from vllm.multimodal.inputs import MultiModalFeatureSpec, MultiModalKwargsItem, PlaceholderRange

            # As the input processor hands them on: sorted by offset (multimodal/utils.py:122-131).
            kwargs["mm_features"] = [
                MultiModalFeatureSpec(data=MultiModalKwargsItem.dummy(), modality="image", identifier=f.identifier,
                                      mm_position=PlaceholderRange(offset=f.offset, length=f.length))
                for f in request.mm_features]
        req = v["Request"](
            request_id=request.request_id,
            prompt_token_ids=prompt,
            sampling_params=params,
            pooling_params=None,
            arrival_time=float(request.arrival_time),
            priority=request.priority,
            **kwargs,
        )
        if request.grammar:
            self._await_grammar(req, request.grammar)
        if (request.kv_connector_tokens or request.kv_connector_sends) and self._kv_store is None:
            from .vllm_connector import attach_scenario_connector

            self._kv_store = attach_scenario_connector(self.sched, self._vllm_config, self._kv_cache_config)
        if request.kv_connector_sends:
            self._kv_store.sends.add(request.request_id)
            req.__dict__[KV_SENDS_ATTR] = True  # what the lift reads (observe)
        if request.kv_connector_tokens:
            self._kv_store.holds[request.request_id] = request.kv_connector_tokens
            if request.kv_connector_async:
                self._kv_store.async_loads.add(request.request_id)
            req.__dict__[KV_CONNECTOR_ATTR] = request.kv_connector_tokens  # what the lift reads (observe)
            req.__dict__[KV_ASYNC_ATTR] = request.kv_connector_async
        self.sched.add_request(req)

    def _await_grammar(self, req, grammar: str) -> None:
        """Structured output without a backend: the request's grammar is a future the
        engine resolves (grammar_compiled), as the manager's compile pool would; the
        status the front end gives such a request (RQ:120-121)."""
        from concurrent.futures import Future

        from vllm.sampling_params import StructuredOutputsParams
        from vllm.v1.structured_output.request import StructuredOutputRequest

        if not models(self._v["version"], STRUCTURED_OUTPUT):
            raise ValueError(f"request {req.request_id}: {not_modelled(self._v['version'], STRUCTURED_OUTPUT)}")
        so = StructuredOutputRequest(params=StructuredOutputsParams(regex="[0-9]+"))
        future: Future = Future()
        so.grammar = future
        req.structured_output_request = so
        req.status = self._v["RequestStatus"].WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
        if grammar != "compiling":
            self._resolve_grammar(future, grammar == "failed")

    @staticmethod
    def _resolve_grammar(future, failed: bool) -> None:
        if failed:
            future.set_exception(RuntimeError("schedspec: the grammar failed to compile"))
        else:
            future.set_result(AcceptingGrammar())

    def grammar_compiled(self, request_ids: Sequence[str], failed: bool = False) -> None:
        """The compilation of these requests' grammars finished: their futures resolve."""
        for rid in request_ids:
            r = self.sched.requests.get(rid)
            so = getattr(r, "structured_output_request", None) if r is not None else None
            future = getattr(so, "_grammar", None)
            if future is not None and hasattr(future, "done") and not future.done():
                self._resolve_grammar(future, failed)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[str]:
        ids = list(request_ids)
        loading = loads_in_flight(self.sched, ids)
        done = self.sched.finish_requests(ids, self._v["RequestStatus"][status.name])
        mark_held(self.sched, loading)
        finished = finished_ids(done)
        out = [rid for rid in dict.fromkeys(ids) if rid in finished]
        self._finish_order.extend(out)
        return out

    def schedule(self) -> SchedulerOutput:
        sched = self.sched
        pre_status = None
        # 0.33.0 with the V2 model runner sends resumed requests as new ones, told apart by
        # their status before the call; 0.34.0 always does, and the spec too (spec/versions.py
        # RESUMED_SENT_AS_NEW), so it needs none (0.34.0 scheduler.py:1619-1626, no switch).
        if getattr(sched, "use_v2_model_runner", False):
            pre_status = {rid: waiting_status(r) for rid, r in sched.requests.items()}
        # Requests holding blocks of a KV load: admitted without a prefix lookup (S:1301-1311).
        holders = [r.request_id for r in getattr(sched, "kv_holding_waiting", ())]
        self._preempted.clear()
        if self._kv_store is not None:
            self._kv_store.answers.clear()
        out = sched.schedule()
        # schedule() hands the finished ids to this batch and starts a new set
        # (S:1930); keep only those finished since.
        self._finish_order = [rid for rid in self._finish_order if rid in sched.finished_req_ids]
        try:
            output = lift_output(out, self._preempted, prefix_caching=self._block_hasher is not None,
                                 status_before=pre_status,
                                 external=self._kv_store.answers if self._kv_store is not None else None,
                                 holders=holders)
        except LiftError as e:
            raise RuntimeError(f"vLLM adapter: {e}") from None
        self._in_flight[id(output)] = (output, out)
        return output

    def update_from_output(
        self, output: SchedulerOutput, sampled_token_ids: Mapping[str, Sequence[int]],
        finished_recving: Sequence[str] = (), finished_sending: Sequence[str] = (),
    ) -> list[tuple[str, RequestStatus]]:
        entry = self._in_flight.pop(id(output), None)
        if entry is None or entry[0] is not output:
            raise RuntimeError("update_from_output() for an output this scheduler did not return "
                               "from schedule(), or one already applied")
        vout = entry[1]
        req_ids = list(vout.num_scheduled_tokens)
        held = {rid: self.sched.requests.get(rid) for rid in req_ids}
        was_finished = {rid for rid, r in held.items() if r is None or r.is_finished()}
        runner_output = self._v["ModelRunnerOutput"](
            # The model runner reports every request of the batch; one that
            # samples nothing (a prefill chunk, or dropped meanwhile) gets [].
            req_ids=req_ids,
            **runner_index(self._v["ModelRunnerOutput"], req_ids),
            sampled_token_ids=[list(sampled_token_ids.get(rid, ())) for rid in req_ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
            # The KV loads and sends the worker reports finished (S:2648, 3716-3733), each
            # set iterated in the engine's order, which the spec frees them in.
            kv_connector_output=self._v["KVConnectorOutput"](finished_recving=ReportedSet(finished_recving),
                                                              finished_sending=ReportedSet(finished_sending))
            if finished_recving or finished_sending else None,
        )
        # Releases before 0.28.0 have no grammar_compile_error_reqs (structured output
        # is modelled from 0.33.0 on, and never drawn for an older release).
        errors = {rid: self.sched.requests.get(rid)
                  for rid in getattr(self.sched, "grammar_compile_error_reqs", ())}
        self.sched.update_from_output(vout, runner_output)
        finished = []
        for rid in req_ids:
            r = held[rid]
            if rid in was_finished or not r.is_finished():
                continue
            finished.append((rid, RequestStatus[r.status.name]))
        # Requests whose grammar failed: finished with an error, after the batch's (S:2619-2641).
        finished += [(rid, RequestStatus[r.status.name]) for rid, r in errors.items()
                     if r is not None and r.is_finished() and rid not in held]
        self._finish_order.extend(rid for rid, _ in finished)
        return finished

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        """The drafter's proposals after a synchronous step (EngineCore.post_step, core.py:703-706)."""
        rids = list(draft_token_ids)
        self.sched.update_draft_token_ids(self._v["DraftTokenIds"](rids, [list(draft_token_ids[r]) for r in rids]))

    # -- state --------------------------------------------------------------

    def observe(self) -> SchedulerState:
        return lift_state(self.sched, self.config, self._finish_order)

    def close(self) -> None:
        if self.sched is not None:
            try:
                self.sched.shutdown()
            except Exception:  # noqa: BLE001 - nothing to release in the core scope
                pass
        self.sched = None
        self._in_flight = {}
