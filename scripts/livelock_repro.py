#!/usr/bin/env python3
"""Reproduce the chunked-off resume livelock of vLLM's V1 scheduler (0.33.0 and 0.34.0).

Uses vLLM's own API only (no schedspec import).  The Scheduler is built the way
vLLM's unit tests build one (tests/v1/core/utils.py `create_scheduler`): a
VllmConfig from SchedulerConfig / ModelConfig / CacheConfig, an offline model
config (an OPT-125m config.json, no weights, no tokenizer), one full-attention
KV cache group of `--num-gpu-blocks` blocks, and a fake model runner that
samples one non-EOS token for every request whose prefill is complete.

The default scenario is schedspec's committed counterexample
tests/counterexamples/liveness-finishes-resume.json:

    max_model_len 16, block_size 2, num_gpu_blocks 10, max_num_batched_tokens 16,
    max_num_scheduled_tokens 8, max_num_seqs 4, chunked prefill OFF,
    prefix caching off, synchronous scheduling, FCFS;
    r0: prompt 6, max_tokens 4;  r1: prompt 7, max_tokens 3 (both at step 0).

r0 and r1 are admitted (each prompt fits the budget of 8), the pool runs out,
r1 is preempted at 9 tokens (7 prompt + 2 outputs), and a resumed request must
replay all its tokens in one step (S:1356) which, with chunked prefill off,
must fit the step budget of 8 (S:1387-1394, a `break`).  It never does, so from
then on every step is empty and the scheduler state repeats forever.

`--scenario blocks-queue` runs tests/counterexamples/liveness-waits-while-fits-resume.json
instead: the preempted request sits at the head of the FCFS queue and a request
behind it (r2) that fits the budget and an empty pool is never admitted either.
`--scenario evicted-cache --enable-prefix-caching --async-scheduling --scale 8`
shows vLLM's default engine (prefix caching and async scheduling on, block size
16) trapped the same way once the preempted request's cached blocks are evicted.
`--check-cli` first hands the equivalent `vllm serve` flags to vLLM's own
EngineArgs parser and create_engine_config.

Exit status: 0 the livelock reproduces (a scheduler state repeats with requests
unfinished, and every later state up to --steps repeats that cycle); 1 no
livelock (every request finished, or no state repeated within --steps); 2 bad
input or a config vLLM rejects (one line on stderr).

Line citations are to the vLLM 0.34.0 release: S = vllm/v1/core/sched/scheduler.py,
C = vllm/config/scheduler.py, V = vllm/config/vllm.py, E = vllm/v1/engine/core.py,
KP = vllm/v1/core/kv_cache_planning.py (schedspec's docs/rules.md, section 0.1).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# An OPT-125m config.json with no weights: ModelConfig reads only the config.
DEFAULT_MODEL_DIR = REPO / "reference" / "vllm_model"
NON_EOS_TOKEN_ID = 100  # OPT's EOS is 2; no stop tokens are set, so only max_tokens ends a request

# The committed counterexamples: (request id, prompt length, max_tokens).
# max_tokens None = the front end's default, max_model_len - prompt
# (vllm/v1/engine/input_processor.py:476-480).
SCENARIOS = {
    "resume": [("r0", 6, 4), ("r1", 7, 3)],
    "blocks-queue": [("r0", 2, 8), ("r1", 2, None), ("r2", 5, 3)],
    # Not a committed file: found by this script's author with prefix caching on
    # (vLLM's default).  r0 keeps running after r1's preemption and its new blocks
    # evict r1's cached blocks, so the resume has no hit to shorten its replay.
    "evicted-cache": [("r0", 3, 13), ("r1", 7, 6)],
}


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + error
        print(f"livelock_repro.py: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="resume",
                   help="resume and blocks-queue are schedspec's committed counterexamples; evicted-cache is for "
                        "prefix caching on (default: resume)")
    p.add_argument("--max-model-len", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=16)
    p.add_argument("--max-num-scheduled-tokens", type=int, default=8,
                   help="the step token budget (S:137-141, S:735); 16 = max_model_len removes the livelock")
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--block-size", type=int, default=2)
    p.add_argument("--num-gpu-blocks", type=int, default=10, help="counts vLLM's null block")
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=False,
                   help="default off, as in the counterexample; on removes the livelock")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=False,
                   help="default off, as in the counterexample")
    p.add_argument("--long-prefill-token-threshold", type=int, default=0,
                   help="default 0 (none); no cure: it caps only while 2 or more requests are eligible (S:773-779)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=False,
                   help="AsyncScheduler with two batches in flight, as EngineCore runs it (vLLM's GPU default); "
                        "default off, as in the counterexample")
    p.add_argument("--scale", type=int, default=1,
                   help="multiply every token count (prompts, max_tokens, block size, max_model_len and both "
                        "budgets) by K, the number of blocks unchanged; e.g. 8 gives block_size 16")
    p.add_argument("--steps", type=int, default=200, help="engine steps to run (default 200)")
    p.add_argument("--model", default=str(DEFAULT_MODEL_DIR),
                   help="a folder with the model's config.json (default: the repository's offline OPT-125m config)")
    p.add_argument("--check-cli", action="store_true",
                   help="first hand the equivalent `vllm serve` flags to vLLM's own EngineArgs parser and "
                        "create_engine_config, and check they resolve to this config")
    p.add_argument("--quiet", action="store_true", help="print only the verdict")
    a = p.parse_args(argv)
    for name in ("max_model_len", "max_num_batched_tokens", "max_num_scheduled_tokens", "max_num_seqs",
                 "block_size", "num_gpu_blocks", "steps", "scale", "long_prefill_token_threshold"):
        low = 0 if name == "long_prefill_token_threshold" else 1
        if getattr(a, name) < low:
            p.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(a, name)}")
    if not (Path(a.model) / "config.json").is_file():
        p.error(f"--model {a.model}: no config.json there")
    for name in ("max_model_len", "max_num_batched_tokens", "max_num_scheduled_tokens", "block_size"):
        setattr(a, name, getattr(a, name) * a.scale)
    return a


def import_vllm():
    # As schedspec's adapter does for CPU-only use: without a device vLLM cannot
    # build a VllmConfig ("Failed to infer device type"); no network, no tokenizer.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # vLLM's and torch's warnings about the missing GPU and Triton concern the
    # model runner, not the scheduler.
    logging.getLogger("vllm").setLevel(logging.ERROR)
    logging.getLogger("torch").setLevel(logging.ERROR)
    import torch
    import vllm
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_planning import check_enough_kv_cache_memory
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    return dict(**locals())


@contextlib.contextmanager
def cpu_without_triton():
    """vLLM 0.34.0's CPU platform refuses an x86 machine without Triton while a
    VllmConfig is built (vllm/platforms/cpu.py:239-243), for the model runner's kernels;
    the scheduler runs none.  So while the config is built Triton reads as found, and
    what vLLM found is put back after.  Triton is never imported."""
    try:
        import vllm.triton_utils as triton_utils
    except ImportError:  # releases before the check
        yield
        return
    found = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        yield
    finally:
        triton_utils.HAS_TRITON = found


def cli_flags(a) -> list[str]:
    """The `vllm serve` / EngineArgs flags that give this run's config."""
    flags = ["--enable-chunked-prefill" if a.enable_chunked_prefill else "--no-enable-chunked-prefill",
             "--max-num-scheduled-tokens", str(a.max_num_scheduled_tokens),
             "--max-model-len", str(a.max_model_len),
             "--max-num-batched-tokens", str(a.max_num_batched_tokens),
             "--max-num-seqs", str(a.max_num_seqs),
             "--block-size", str(a.block_size),
             "--num-gpu-blocks-override", str(a.num_gpu_blocks),
             "--enable-prefix-caching" if a.enable_prefix_caching else "--no-enable-prefix-caching",
             "--async-scheduling" if a.async_scheduling else "--no-async-scheduling"]
    if a.long_prefill_token_threshold:
        flags += ["--long-prefill-token-threshold", str(a.long_prefill_token_threshold)]
    return flags


def check_cli(a) -> str:
    """Parse the flags with vLLM's EngineArgs (vllm/engine/arg_utils.py) and build
    the engine config from them; a mismatch or a rejection raises ValueError."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    flags = cli_flags(a)
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    ns = parser.parse_args(["--model", a.model, "--skip-tokenizer-init", *flags])
    with cpu_without_triton():
        config = EngineArgs.from_cli_args(ns).create_engine_config()
    s, c = config.scheduler_config, config.cache_config
    got = dict(enable_chunked_prefill=s.enable_chunked_prefill, max_num_scheduled_tokens=s.max_num_scheduled_tokens,
               max_model_len=config.model_config.max_model_len, max_num_batched_tokens=s.max_num_batched_tokens,
               max_num_seqs=s.max_num_seqs, block_size=c.block_size, num_gpu_blocks=c.num_gpu_blocks_override,
               enable_prefix_caching=c.enable_prefix_caching,
               long_prefill_token_threshold=s.long_prefill_token_threshold)
    # async_scheduling is left out: the CPU platform hook turns it off (platforms/cpu.py:348).
    bad = {k: (x, getattr(a, k)) for k, x in got.items() if x != getattr(a, k)}
    if bad:
        raise ValueError("vLLM's CLI resolves the flags differently: "
                         + ", ".join(f"{k}={x} (wanted {w})" for k, (x, w) in bad.items()))
    return "vllm serve MODEL " + " ".join(flags)


def build_scheduler(v, a):
    """A Scheduler for the counterexample's config; vLLM's rejection -> ValueError."""
    scheduler_config = v["SchedulerConfig"](
        is_encoder_decoder=False,
        max_model_len=a.max_model_len,
        max_num_batched_tokens=a.max_num_batched_tokens,
        max_num_scheduled_tokens=a.max_num_scheduled_tokens,
        max_num_seqs=a.max_num_seqs,
        enable_chunked_prefill=a.enable_chunked_prefill,
        long_prefill_token_threshold=a.long_prefill_token_threshold,
        async_scheduling=a.async_scheduling,
    )  # __post_init__ runs verify_max_model_len (C:361-406): the config is accepted
    model_config = v["ModelConfig"](model=a.model, skip_tokenizer_init=True,
                                    max_model_len=a.max_model_len, dtype="float16", seed=42)
    cache_config = v["CacheConfig"](block_size=a.block_size, enable_prefix_caching=a.enable_prefix_caching)
    with cpu_without_triton():
        vllm_config = v["VllmConfig"](scheduler_config=scheduler_config, model_config=model_config,
                                      cache_config=cache_config)
    # The CPU platform hook switches async scheduling off whatever was asked
    # (vllm/platforms/cpu.py:348, called at V:1979); the scheduler does not
    # depend on the device, so put the asked value back, as a GPU platform leaves it.
    vllm_config.scheduler_config.async_scheduling = a.async_scheduling
    if getattr(vllm_config.cache_config, "kv_cache_layout", "absent") is None:
        vllm_config.cache_config.kv_cache_layout = "LBNHC"  # one block is one page whatever the layout
    kv_spec = v["FullAttentionSpec"](block_size=a.block_size, num_kv_heads=1, head_size=1,
                                     dtype=v["torch"].float32)
    # EngineCore's start-up check (KP:196): the pool, less the null block, holds
    # one max_model_len sequence.  Building a Scheduler directly skips it, so run
    # it here: the engine would start with this pool.
    v["check_enough_kv_cache_memory"](vllm_config, {"layer": kv_spec}, a.num_gpu_blocks * kv_spec.page_size_bytes)
    kv_cache_config = v["KVCacheConfig"](num_blocks=a.num_gpu_blocks, kv_cache_tensors=[],
                                         kv_cache_groups=[v["KVCacheGroupSpec"](["layer"], kv_spec)])
    vllm_config.cache_config.num_gpu_blocks = a.num_gpu_blocks
    cls = v["AsyncScheduler"] if a.async_scheduling else v["Scheduler"]
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                          structured_output_manager=v["StructuredOutputManager"](vllm_config),
                          block_size=a.block_size, hash_block_size=a.block_size, log_stats=True)


def add_requests(v, sched, a):
    block_hasher = None
    if a.enable_prefix_caching:  # as EngineCore does (v1/engine/core.py:219-230)
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        hash_fn = get_hash_fn_by_name(sched.vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        block_hasher = get_request_block_hasher(a.block_size, hash_fn,
                                                sched.vllm_config.num_hash_lookahead_tokens)
    for i, (rid, prompt_len, max_tokens) in enumerate(SCENARIOS[a.scenario]):
        prompt_len, max_tokens = prompt_len * a.scale, None if max_tokens is None else max_tokens * a.scale
        if prompt_len >= a.max_model_len:  # the front end's check (input_processor.py:593)
            raise ValueError(f"request {rid}: prompt of {prompt_len} tokens needs --max-model-len > {prompt_len}")
        if max_tokens is None:
            max_tokens = a.max_model_len - prompt_len
        first = 1000 * (i + 1)  # distinct prompts: no shared prefix between requests
        kwargs = {"block_hasher": block_hasher} if block_hasher is not None else {}
        sched.add_request(v["Request"](
            request_id=rid, prompt_token_ids=list(range(first, first + prompt_len)),
            sampling_params=v["SamplingParams"](max_tokens=max_tokens), pooling_params=None,
            arrival_time=float(i), **kwargs))


def state_key(sched, batch_queue):
    """What the next step reads, for the requests and the pool: each request's
    status and counters, the queue and running order, free blocks, and under
    async scheduling the placeholders and the grants of the batches in flight."""
    reqs = tuple(sorted((rid, r.status.name, r.num_computed_tokens, r.num_tokens, r.num_output_tokens)
                        + ((r.num_output_placeholders,) if batch_queue is not None else ())
                        for rid, r in sched.requests.items()))
    in_flight = tuple(tuple(sorted(out.num_scheduled_tokens.items())) for out, _ in batch_queue or ())
    return (reqs, tuple(r.request_id for r in sched.waiting), tuple(r.request_id for r in sched.running),
            sched.kv_cache_manager.block_pool.get_num_free_blocks(), in_flight)


def describe(key) -> str:
    reqs, waiting, running, free, in_flight = key
    parts = [f"{rid} {status} computed={ncomp} tokens={ntok} outputs={nout}"
             + (f" placeholders={rest[0]}" if rest else "")
             for rid, status, ncomp, ntok, nout, *rest in reqs]
    flight = f" in_flight={[dict(b) for b in in_flight]}" if in_flight else ""
    return (f"waiting={list(waiting)} running={list(running)} free_blocks={free}{flight}; "
            + ("; ".join(parts) if parts else "no requests"))


def apply(v, sched, out, sampling):
    """The fake model's output for batch `out`: one non-EOS token for each request
    in `sampling`, none for a prefill chunk; then update_from_output."""
    req_ids = list(out.num_scheduled_tokens)
    sampled = [[NON_EOS_TOKEN_ID] if rid in sampling else [] for rid in req_ids]
    # 0.34.0's ModelRunnerOutput has no req_id_to_index: a request's row is its place in
    # req_ids (v1/core/sched/scheduler.py:2355-2358); 0.33.0's needs it.
    index = {"req_id_to_index": {rid: i for i, rid in enumerate(req_ids)}} \
        if "req_id_to_index" in getattr(v["ModelRunnerOutput"], "__dataclass_fields__", {}) else {}
    runner_output = v["ModelRunnerOutput"](
        req_ids=req_ids, **index,
        sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=None)
    held = {rid: sched.requests.get(rid) for rid in req_ids}
    was_finished = {rid for rid, r in held.items() if r is None or r.is_finished()}
    sched.update_from_output(out, runner_output)
    return [f"{rid}({r.status.name})" for rid, r in held.items() if rid not in was_finished and r.is_finished()]


def step(v, sched, batch_queue):
    """One EngineCore step.  Synchronous (batch_queue None): schedule, the fake
    model, update_from_output (E:713-743).  Async: step_with_batch_queue with two
    batches in flight (E:758-871, V:560-566): schedule a batch; return at once if
    the queue is not full and it ran something or requests remain; else apply the
    oldest batch.  Returns (the batch scheduled or None, the requests finished)."""
    out = None
    if sched.has_requests():
        out = sched.schedule()
        # Which requests sample is fixed at schedule time: those whose prefill is
        # complete once the grant is added (the advance, S:1899-1931).
        sampling = {rid for rid in out.num_scheduled_tokens if not sched.requests[rid].is_prefill_chunk}
        if batch_queue is None:
            return out, apply(v, sched, out, sampling)
        batch_queue.appendleft((out, sampling))
        if len(batch_queue) < 2 and (out.total_num_scheduled_tokens > 0 or sched.has_requests()):
            return out, []
    elif not batch_queue:
        return None, []
    done, sampling = batch_queue.pop()
    # A request finished or aborted meanwhile samples nothing (S:2373).
    return out, apply(v, sched, done, {rid for rid in sampling if rid in sched.requests})


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        v = import_vllm()
    except Exception as e:  # noqa: BLE001 - ImportError, or vLLM failing to pick a platform
        print(f"livelock_repro.py: error: vLLM cannot be imported: {' '.join(str(e).split())[:400]}",
              file=sys.stderr)
        return 2
    if v["vllm"].__version__ not in ("0.33.0", "0.34.0"):
        print(f"# note: written against vLLM 0.33.0 and 0.34.0, running {v['vllm'].__version__}", file=sys.stderr)
    if a.check_cli:
        try:
            serve = check_cli(a)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - argparse exits; pydantic/ValueError reject
            print(f"livelock_repro.py: error: vLLM {v['vllm'].__version__}'s CLI rejects the flags: "
                  f"{' '.join(str(e).split())[:400]}", file=sys.stderr)
            return 2
        print(f"# vLLM's own CLI parser and config checks accept: {serve}")
    try:
        sched = build_scheduler(v, a)
    except Exception as e:  # noqa: BLE001 - pydantic ValidationError, ValueError: vLLM refuses the config
        msg = " ".join(str(e).split())
        print(f"livelock_repro.py: error: vLLM {v['vllm'].__version__} rejects the config: {msg[:400]}",
              file=sys.stderr)
        return 2
    try:
        add_requests(v, sched, a)
    except Exception as e:  # noqa: BLE001 - the front end's prompt check, or vLLM refusing SamplingParams
        print(f"livelock_repro.py: error: {' '.join(str(e).split())[:400]}", file=sys.stderr)
        return 2

    say = (lambda *x: None) if a.quiet else print
    say(f"# vLLM {v['vllm'].__version__}, scenario {a.scenario}: max_model_len={a.max_model_len} "
        f"block_size={a.block_size} num_gpu_blocks={a.num_gpu_blocks} "
        f"max_num_batched_tokens={a.max_num_batched_tokens} "
        f"max_num_scheduled_tokens={a.max_num_scheduled_tokens} max_num_seqs={a.max_num_seqs} "
        f"enable_chunked_prefill={a.enable_chunked_prefill} "
        f"long_prefill_token_threshold={a.long_prefill_token_threshold} enable_prefix_caching={a.enable_prefix_caching} "
        f"async_scheduling={a.async_scheduling} ({type(sched).__name__})")
    batch_queue = deque() if a.async_scheduling else None
    keys: list = []  # the state before each step
    seen: dict = {}  # state -> the first step it was seen before
    first_repeat = None  # (a, z): the state before step z equals the one before step a
    for t in range(a.steps):
        if not sched.has_requests() and not batch_queue:
            break
        key = state_key(sched, batch_queue)
        keys.append(key)
        if key in seen and first_repeat is None:
            first_repeat = (seen[key], t)
            say(f"# state before step {t} equals the state before step {seen[key]}: "
                f"steps {seen[key]}..{t - 1} repeat forever")
        seen.setdefault(key, t)
        out, finished = step(v, sched, batch_queue)
        if first_repeat is None or t < first_repeat[1] + 2:
            grants = " ".join(f"{rid}:{n}" for rid, n in out.num_scheduled_tokens.items()) if out else ""
            extra = ""
            if out is not None and out.preempted_req_ids:
                extra += f" | PREEMPTED {' '.join(sorted(out.preempted_req_ids))}"
            if finished:
                extra += f" | finished {' '.join(finished)}"
            total = out.total_num_scheduled_tokens if out else 0
            say(f"step {t:3d}  {total:2d} tok  {grants or '-'}{extra} | {describe(key)}")
        elif t == first_repeat[1] + 2:
            say("... (every further step repeats the cycle)")

    unfinished = sorted(sched.requests)
    if not unfinished:
        print(f"NO LIVELOCK: every request finished within {len(keys)} steps")
        return 1
    if first_repeat is None:
        print(f"NO LIVELOCK SHOWN: {len(unfinished)} request(s) unfinished after {a.steps} steps "
              "but no state repeated (a long run, not a proven livelock)")
        return 1
    a0, z = first_repeat
    period = z - a0
    keys.append(state_key(sched, batch_queue))  # the state after the last step
    if any(keys[t] != keys[a0 + (t - a0) % period] for t in range(a0, len(keys))):
        print(f"NO LIVELOCK: the state before step {z} repeated the one before step {a0}, "
              "but the run left that cycle later")
        return 1
    print(f"LIVELOCK: the scheduler state before step {z} equals the state before step {a0}, "
          f"and every state up to step {a.steps} repeats that cycle of {period} step(s)")
    for k in keys[a0:z]:
        print(f"  repeating state: {describe(k)}")
    waiting = {r.request_id: r for r in sched.waiting}
    for rid in unfinished:
        r = sched.requests[rid]
        why = ""
        if rid in waiting and not a.enable_chunked_prefill:
            # A resumed request replays all its tokens (S:1356), less a prefix-cache
            # hit (at most num_tokens - 1, vllm/v1/core/kv_cache_manager.py:302).
            hit = sched.kv_cache_manager.get_computed_blocks(r)[1] if a.enable_prefix_caching else 0
            need = r.num_tokens - max(r.num_computed_tokens, hit)
            budget = min(a.max_num_scheduled_tokens, a.max_num_batched_tokens)  # S:1345
            if need > budget:
                why = (f": needs {need} tokens in one step (num_tokens {r.num_tokens}"
                       + (f", prefix-cache hit {hit}" if a.enable_prefix_caching else "")
                       + f", S:1356) > token budget {budget} with chunked prefill off (S:1387-1394)")
            else:
                why = f": queued behind {sched.waiting.peek_request().request_id} (FCFS head, `break`)"
        print(f"  never finishes: {rid} ({r.status.name}, {r.num_output_tokens} of "
              f"{r.sampling_params.max_tokens} outputs){why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
