"""Step time of the executable spec against vLLM 0.33.0's own scheduler, side by side.

One process holds both: the spec (schedspec.spec.scheduler, pure functions over a
SchedulerState) and vLLM's real `Scheduler` / `AsyncScheduler`, built offline the
way reference/vllm_adapter.py builds it.  For each mode and each N, both
sides get the same N requests (short prompts, 8-32 tokens), are stepped in lock
step until every request is a running decode, then K steps are timed on each side,
the two sides alternating step by step (and which side goes first alternating too)
to spread machine noise evenly over both.

One step = schedule() + update_from_output() with every scheduled request sampling
one non-EOS token.  Only the scheduler calls are timed (what they return, and the
states the spec replaces, are freed outside the timed regions): on the vLLM side
`Scheduler.schedule()` and `Scheduler.update_from_output()` themselves, called on
vLLM's scheduler object directly (the adapter's conversions are not used in the
loop); the ModelRunnerOutput for a batch, and the spec's sampled-token dict, are
built between the two timed calls, outside the timed regions.

Modes (--modes):
  off           enable_prefix_caching=false, async_scheduling=false (Scheduler)
  prefix        enable_prefix_caching=true,  async_scheduling=false (Scheduler)
  async         enable_prefix_caching=true,  async_scheduling=true  (AsyncScheduler):
                vLLM 0.33.0's default engine (CacheConfig.enable_prefix_caching
                defaults to True; async scheduling resolves to on for a GPU
                generate model).
  async-noprefix  async_scheduling=true without prefix caching (not in the default set).
Under async scheduling both sides run vLLM's EngineCore.step_with_batch_queue loop
with two batches in flight (v1/engine/core.py; reference/engine.py `_async_step`):
each step schedules a new batch, then applies the older batch's output; one step's
time is that schedule() plus that update_from_output().

vLLM's scheduler is built with log_stats=True, as the adapter builds it and as
`vllm serve` runs it (update_from_output then also builds SchedulerStats); the
garbage collector stays on unless --gc-off.

Before and after timing, both sides must agree on every request's computed and
output token counts; every timed step must schedule exactly N tokens (one decode
token for each of the N running requests) on both sides, with no admission,
preemption or finish; otherwise the run stops with an error.

    python benchmarks/spec_vs_vllm.py                      # N = 10,100,1000,10000, modes off,prefix,async
    python benchmarks/spec_vs_vllm.py --n 10,100 --modes off --steps 200 --repeat 3 --json out.json

Progress goes to stderr; the markdown table to stdout.  This is a script, not a
test (pytest collects tests/ only).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from schedspec.spec import scheduler as S  # noqa: E402
from schedspec.spec.config import SchedulerConfig  # noqa: E402
from schedspec.spec.input_processor import make_request  # noqa: E402
from schedspec.spec.state import SchedulerState  # noqa: E402
from schedspec.reference.vllm_adapter import runner_index  # noqa: E402

TOKEN = 100  # the non-EOS token every request samples (EOS is 2)
BLOCK_SIZE = 16
SHARED_PREFIX = tuple(range(1000, 1000 + BLOCK_SIZE))  # one full block shared by long prompts
MODES = {
    # name: (enable_prefix_caching, async_scheduling)
    "off": (False, False),
    "prefix": (True, False),
    "async": (True, True),
    "async-noprefix": (False, True),
}
DEFAULT_NS = (10, 100, 1000, 10000)
DEFAULT_MODES = ("off", "prefix", "async")

perf = time.perf_counter


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Mismatch(RuntimeError):
    """The two sides are not doing the same work: the comparison would be void."""


# -- workload ---------------------------------------------------------------------

def auto_steps(n: int) -> int:
    """Timed steps per repeat when --steps is not given: about 300 at small N, 50
    at N=1000, 10 at N=10000 (where one spec step takes about half a second)."""
    return max(10, min(300, 50_000 // n))


def prompt_len(i: int) -> int:
    return 8 + (i * 7) % 25  # 8..32, spread so block boundaries fall on different steps


def prompt_tokens(i: int, length: int) -> list[int]:
    """Prompts longer than one block share their first block (prefix cache hits at
    admission); the rest of each prompt is distinct to the request."""
    head = list(SHARED_PREFIX) if length > BLOCK_SIZE else []
    tail = [3 + (i * 131 + k * 17) % 49_000 for k in range(length - len(head))]
    return head + tail


def make_config(n: int, caching: bool, async_: bool, horizon: int) -> SchedulerConfig:
    """Everything fits: N seqs, every prefill in one step, a pool that never runs
    dry, and a max_model_len no request reaches within `horizon` steps."""
    max_model_len = 2048
    while max_model_len < 64 + 2 * horizon:
        max_model_len *= 2
    per_request = -(-(32 + horizon + 2 * BLOCK_SIZE) // BLOCK_SIZE)
    return SchedulerConfig(
        max_num_batched_tokens=max(2048, 32 * n),  # >= N decodes; all prefills in one step
        max_num_seqs=n,
        max_model_len=max_model_len,
        block_size=BLOCK_SIZE,
        # + one max_model_len sequence (vLLM's engine start-up check) + the null block
        num_gpu_blocks=n * per_request + max_model_len // BLOCK_SIZE + 2,
        enable_prefix_caching=caching,
        async_scheduling=async_,
    )


def make_requests(config: SchedulerConfig, n: int):
    reqs = []
    for i in range(n):
        length = prompt_len(i)
        reqs.append(make_request(config, f"r{i}", length, config.max_model_len - length,
                                 arrival_time=float(i),
                                 prompt_token_ids=prompt_tokens(i, length) if config.enable_prefix_caching else None))
    return reqs


# -- the two sides -------------------------------------------------------------------

class SpecSide:
    name = "spec"

    def __init__(self, config: SchedulerConfig, requests) -> None:
        self.async_ = config.async_scheduling
        state = SchedulerState(config)
        for r in requests:
            state = S.add_request(state, r)
        self.state = state
        self.in_flight: deque = deque()  # async: (output, ids that sample)

    def step(self, check_n: int | None = None) -> tuple[float, float]:
        # `before` holds the old state until the step ends, so that freeing it
        # (the spec builds new states) falls outside the timed calls, as freeing
        # vLLM's SchedulerOutput and ModelRunnerOutput does on the other side.
        before = self.state  # noqa: F841
        t0 = perf()
        out, mid = S.schedule(self.state)
        t1 = perf()
        if check_n is not None:
            _check_batch("spec", check_n, out.total_num_scheduled_tokens, len(out.num_scheduled_tokens),
                         len(mid.running), bool(out.preempted_req_ids or out.admitted))
        if not self.async_:
            sampled = {rid: [TOKEN] for rid, _ in out.num_scheduled_tokens
                       if mid.requests[rid].num_computed_tokens >= mid.requests[rid].num_tokens}
            t2 = perf()
            finished, self.state = S.update_from_output(mid, out, sampled)
            t3 = perf()
        else:
            self.in_flight.append((out, [rid for rid, _ in out.num_scheduled_tokens
                                         if not mid.requests[rid].is_prefill_chunk]))
            if len(self.in_flight) < 2:
                self.state = mid
                return t1 - t0, 0.0
            batch, sampling = self.in_flight.popleft()
            sampled = {rid: [TOKEN] for rid in sampling if rid in mid.requests}
            t2 = perf()
            finished, self.state = S.update_from_output(mid, batch, sampled)
            t3 = perf()
        if check_n is not None and (finished or len(self.state.running) != check_n):
            raise Mismatch(f"spec: {len(finished)} requests finished during the measurement, "
                           f"{len(self.state.running)} running")
        return t1 - t0, t3 - t2

    def counts(self) -> dict[str, tuple[int, int]]:
        return {rid: (r.num_computed_tokens, r.num_output_tokens) for rid, r in self.state.requests.items()}

    def running(self) -> int:
        return len(self.state.running)

    def free_blocks(self) -> int:
        return self.state.num_free_blocks


class VllmSide:
    name = "vllm"

    def __init__(self, config: SchedulerConfig, requests) -> None:
        from schedspec.reference.vllm_adapter import VllmScheduler

        # The adapter builds vLLM's own config objects and Scheduler/AsyncScheduler
        # (and the block hasher EngineCore gives requests under prefix caching);
        # after that only `self.sched` is used.
        self.adapter = VllmScheduler()
        self.adapter.reset(config)
        for r in requests:
            self.adapter.add_request(r)
        self.sched = self.adapter.sched
        self.ModelRunnerOutput = self.adapter._v["ModelRunnerOutput"]
        self.async_ = config.async_scheduling
        expected = "AsyncScheduler" if self.async_ else "Scheduler"
        if type(self.sched).__name__ != expected:
            raise Mismatch(f"vLLM built {type(self.sched).__name__}, expected {expected}")
        self.in_flight: deque = deque()

    def _runner_output(self, vout, sampling) -> object:
        ids = list(vout.num_scheduled_tokens)
        return self.ModelRunnerOutput(
            req_ids=ids,
            **runner_index(self.ModelRunnerOutput, ids),  # 0.34.0 has no req_id_to_index
            sampled_token_ids=[[TOKEN] if rid in sampling else [] for rid in ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
        )

    def step(self, check_n: int | None = None) -> tuple[float, float]:
        sched = self.sched
        t0 = perf()
        vout = sched.schedule()
        t1 = perf()
        if check_n is not None:
            _check_batch("vLLM", check_n, vout.total_num_scheduled_tokens, len(vout.num_scheduled_tokens),
                         len(sched.running), bool(vout.preempted_req_ids or vout.scheduled_new_reqs))
        reqs = sched.requests
        # Which requests sample is fixed at schedule time (is_prefill_chunk).
        sampling = {rid for rid in vout.num_scheduled_tokens if not reqs[rid].is_prefill_chunk}
        if self.async_:
            self.in_flight.append((vout, sampling))
            if len(self.in_flight) < 2:
                return t1 - t0, 0.0
            vout, sampling = self.in_flight.popleft()
        runner_output = self._runner_output(vout, sampling)
        t2 = perf()
        sched.update_from_output(vout, runner_output)
        t3 = perf()
        if check_n is not None and (len(sched.running) != check_n or len(sched.requests) != check_n):
            raise Mismatch(f"vLLM: {len(sched.running)} running, {len(sched.requests)} requests held "
                           f"after update_from_output, expected {check_n}")
        return t1 - t0, t3 - t2

    def counts(self) -> dict[str, tuple[int, int]]:
        return {rid: (r.num_computed_tokens, r.num_output_tokens) for rid, r in self.sched.requests.items()
                if not r.is_finished()}

    def running(self) -> int:
        return len(self.sched.running)

    def free_blocks(self) -> int:
        return self.sched.kv_cache_manager.block_pool.get_num_free_blocks()

    def close(self) -> None:
        self.adapter.close()


def _check_batch(side: str, n: int, tokens: int, nreqs: int, running: int, churn: bool) -> None:
    if tokens != n or nreqs != n or running != n or churn:
        raise Mismatch(f"{side}: a timed step scheduled {tokens} tokens for {nreqs} requests with "
                       f"{running} running (admissions/preemptions: {churn}); expected {n} decodes of one "
                       "token each")


def compare_states(spec: SpecSide, vllm: VllmSide, n: int, when: str) -> str | None:
    """Token counts must agree request by request (else: Mismatch); a different
    free-block count is returned as a warning."""
    a, b = spec.counts(), vllm.counts()
    if len(a) != n or len(b) != n or spec.running() != n or vllm.running() != n:
        raise Mismatch(f"{when}: spec holds {len(a)} requests ({spec.running()} running), vLLM "
                       f"{len(b)} ({vllm.running()} running); expected {n}")
    bad = [rid for rid in a if a[rid] != b.get(rid)]
    if bad:
        rid = bad[0]
        raise Mismatch(f"{when}: {len(bad)} requests differ in (num_computed_tokens, num_output_tokens), "
                       f"e.g. {rid}: spec {a[rid]}, vLLM {b.get(rid)}")
    fs, fv = spec.free_blocks(), vllm.free_blocks()
    if fs != fv:
        return f"{when}: free KV blocks differ: spec {fs}, vLLM {fv}"
    return None


def in_decode(spec: SpecSide, vllm: VllmSide, n: int) -> bool:
    """Every request past its prefill with at least one output token applied, and
    (async) one batch in flight, on both sides."""
    if spec.running() != n or vllm.running() != n:
        return False
    if any(o < 1 for _, o in spec.counts().values()) or any(o < 1 for _, o in vllm.counts().values()):
        return False
    if spec.async_ and (len(spec.in_flight) != 1 or len(vllm.in_flight) != 1):
        return False
    return True


# -- one measurement ------------------------------------------------------------------

def measure(mode: str, n: int, steps: int, repeat: int, gc_off: bool) -> dict:
    caching, async_ = MODES[mode]
    warmup = max(3, steps // 10)
    horizon = 8 + warmup + steps * repeat
    config = make_config(n, caching, async_, horizon)
    t_setup = perf()
    log(f"[{mode} N={n}] setup: {n} requests on both sides")
    requests = make_requests(config, n)
    spec = SpecSide(config, requests)
    vllm = VllmSide(config, requests)
    try:
        for k in range(8):
            if in_decode(spec, vllm, n):
                break
            spec.step()
            vllm.step()
        else:
            raise Mismatch(f"[{mode} N={n}] not every request is a running decode after 8 steps: "
                           f"spec {spec.running()} running, vLLM {vllm.running()}")
        compare_states(spec, vllm, n, "after prefill")
        log(f"[{mode} N={n}] in decode after {k} steps ({perf() - t_setup:.1f}s); warm-up {warmup} steps")
        for i in range(warmup):
            # Warm-up runs the checked path too, alternating as the timed steps do.
            if i % 2:
                vllm.step(n), spec.step(n)
            else:
                spec.step(n), vllm.step(n)
        warnings = [w for w in [compare_states(spec, vllm, n, "before timing")] if w]

        samples = {"spec": [], "vllm": []}  # per repeat: list of (schedule s, update s)
        last_progress = perf()
        for rep in range(repeat):
            # As vLLM's engine does after start-up (EngineCore.__init__ ->
            # vllm/utils/gc_utils.py freeze_gc_heap): the static heap (torch, vLLM,
            # both sides' set-up) is frozen, so collections during serving scan
            # only what the steps themselves allocate.
            gc.collect()
            gc.freeze()
            if gc_off:
                gc.disable()
            sp, vl = [], []
            try:
                for i in range(steps):
                    if i % 2:
                        vl.append(vllm.step(n))
                        sp.append(spec.step(n))
                    else:
                        sp.append(spec.step(n))
                        vl.append(vllm.step(n))
                    if perf() - last_progress > 5:
                        last_progress = perf()
                        log(f"[{mode} N={n}] repeat {rep + 1}/{repeat}: step {i + 1}/{steps}")
            finally:
                gc.unfreeze()
                if gc_off:
                    gc.enable()
            samples["spec"].append(sp)
            samples["vllm"].append(vl)
        w = compare_states(spec, vllm, n, "after timing")
        if w:
            warnings.append(w)
        for w in warnings:
            log(f"[{mode} N={n}] WARNING {w}")
    finally:
        vllm.close()

    def summary(reps: list[list[tuple[float, float]]]) -> dict:
        totals = [[(a + b) * 1e3 for a, b in rep] for rep in reps]
        medians = [statistics.median(t) for t in totals]
        flat = sorted(x for t in totals for x in t)
        return {
            "ms_per_step": statistics.median(medians),
            "repeat_medians_ms": medians,
            "mean_ms": statistics.fmean(flat),
            "p10_ms": flat[len(flat) // 10],
            "p90_ms": flat[(len(flat) * 9) // 10],
            "schedule_ms": statistics.median(a * 1e3 for rep in reps for a, _ in rep),
            "update_ms": statistics.median(b * 1e3 for rep in reps for _, b in rep),
        }

    s, v = summary(samples["spec"]), summary(samples["vllm"])
    result = {"mode": mode, "n": n, "enable_prefix_caching": caching, "async_scheduling": async_,
              "steps": steps, "warmup": warmup, "repeat": repeat,
              "tokens_per_step": n, "spec": s, "vllm": v, "ratio": s["ms_per_step"] / v["ms_per_step"],
              "warnings": warnings, "wall_s": perf() - t_setup,
              "config": {"max_num_batched_tokens": config.max_num_batched_tokens,
                         "max_num_seqs": config.max_num_seqs, "max_model_len": config.max_model_len,
                         "num_gpu_blocks": config.num_gpu_blocks, "block_size": config.block_size}}
    log(f"[{mode} N={n}] spec {s['ms_per_step']:.3f} ms/step, vLLM {v['ms_per_step']:.3f} ms/step, "
        f"ratio {result['ratio']:.2f} ({result['wall_s']:.1f}s)")
    return result


# -- report -----------------------------------------------------------------------------

def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        import vllm
        vllm_version = vllm.__version__
    except Exception:  # noqa: BLE001
        vllm_version = "?"
    spec_dir = ROOT / "spec"
    digest = hashlib.sha256()
    for p in sorted(spec_dir.glob("*.py")):
        digest.update(p.name.encode() + b"\0" + p.read_bytes())
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable,
            "python": platform.python_version(), "implementation": platform.python_implementation(),
            "platform": platform.platform(), "vllm": vllm_version,
            # The spec is being edited: which version of spec/*.py was measured.
            "spec_sha256": digest.hexdigest()[:16]}


def fmt_ms(x: float) -> str:
    return f"{x:.3f}" if x < 100 else f"{x:.1f}"


def table(results: list[dict], info: dict, args, wall: float) -> str:
    lines = [
        f"Machine: {info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable), "
        f"{info['implementation']} {info['python']}, vLLM {info['vllm']}, spec files sha256 {info['spec_sha256']}",
        f"Steps: K timed steps per (mode, N) x {args.repeat} repeat(s), median per step "
        f"(median of the repeats' medians); K = "
        + ", ".join(f"{r['n']}: {r['steps']}" for r in {r['n']: r for r in results}.values())
        + f" (by N); warm-up excluded. Wall time {wall:.0f}s.",
        "Modes: off = no prefix caching, sync; prefix = prefix caching, sync; "
        "async = AsyncScheduler + prefix caching (vLLM's default engine), 2 batches in flight; "
        "async-noprefix = AsyncScheduler without prefix caching.",
        "",
        "| mode | N | spec ms/step | vLLM ms/step | spec/vLLM |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r['mode']} | {r['n']} | {fmt_ms(r['spec']['ms_per_step'])} | "
                     f"{fmt_ms(r['vllm']['ms_per_step'])} | {r['ratio']:.2f} |")
    lines += ["", "Breakdown (median ms of each call; p10-p90 of the step):", "",
              "| mode | N | spec schedule | spec update | spec p10-p90 | vLLM schedule | vLLM update | vLLM p10-p90 |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        s, v = r["spec"], r["vllm"]
        lines.append(f"| {r['mode']} | {r['n']} | {fmt_ms(s['schedule_ms'])} | {fmt_ms(s['update_ms'])} | "
                     f"{fmt_ms(s['p10_ms'])}-{fmt_ms(s['p90_ms'])} | {fmt_ms(v['schedule_ms'])} | "
                     f"{fmt_ms(v['update_ms'])} | {fmt_ms(v['p10_ms'])}-{fmt_ms(v['p90_ms'])} |")
    warned = [(r, w) for r in results for w in r["warnings"]]
    if warned:
        lines += ["", "Warnings:"] + [f"- {r['mode']} N={r['n']}: {w}" for r, w in warned]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", default=",".join(map(str, DEFAULT_NS)),
                   help="comma-separated numbers of running decodes (default %(default)s)")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help=f"comma-separated, of {', '.join(MODES)} (default %(default)s)")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per repeat for every N (default: max(10, min(300, 50000 // N)))")
    p.add_argument("--repeat", type=int, default=1, help="timed windows per (mode, N) (default 1)")
    p.add_argument("--gc-off", action="store_true", help="disable the garbage collector while timing")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = p.parse_args(argv)
    ns = [int(x) for x in args.n.split(",") if x.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    if any(n < 1 for n in ns) or args.repeat < 1 or (args.steps is not None and args.steps < 1):
        p.error("--n, --steps and --repeat must be positive")

    start = perf()
    log("importing vLLM (about 10 s) ...")
    from schedspec.reference.vllm_adapter import import_vllm
    import_vllm()
    info = machine()
    log(f"vLLM {info['vllm']} imported in {perf() - start:.1f}s")
    results = []
    try:
        for n in ns:
            for mode in modes:
                steps = args.steps if args.steps is not None else auto_steps(n)
                results.append(measure(mode, n, steps, args.repeat, args.gc_off))
    except Mismatch as e:
        log(f"FAILED: {e}")
        return 1
    wall = perf() - start
    print(table(results, info, args, wall))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "argv": sys.argv[1:], "wall_s": wall,
                                               "gc_off": args.gc_off, "results": results}, indent=2) + "\n")
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
