"""Differential testing: run two implementations on the same scenarios and
compare their traces field by field, step by step.

    schedspec diff --impl vllm [--against spec] SCENARIO...
    schedspec diff --impl vllm --scenarios 2000 --seed 7 [-o DIR] [--json]
    schedspec diff --impl vllm --configs 500 --seed 7

`compare_traces(a, b)` returns the first `Divergence` or None.  On a
divergence the scenario is written to `-o DIR` (default ./divergences, never
overwriting a file); a random scenario is also shrunk (greedy delta debugging)
to a small one that still diverges, whose `description` is the command that
reproduces it.  Exit status: 0 all agree, 1 some divergence, 2 user error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import Progress, UsageError
from ..spec.config import ConfigError, SchedulerConfig, config_from_dict
from .engine import run_scenario
from .impl import ImplementationError, load_impl
from .scenario import Abort, RequestSpec, Scenario, ScenarioError, load_scenario, save_scenario

# Fields of a trace step in the order a divergence is looked for.
STEP_FIELDS = ("step", "scheduled", "new", "resumed", "preempted", "finished", "running",
               "waiting", "num_computed_tokens", "num_free_blocks")


@dataclass(frozen=True)
class Divergence:
    """The first place two traces differ."""

    field: str  # "error", "steps", a step field (maybe "num_computed_tokens.r3"), or "summary.…"
    a: Any
    b: Any
    step: int | None = None  # the engine step, when the difference is inside a step
    a_name: str = "a"
    b_name: str = "b"

    @property
    def kind(self) -> str:
        return self.field if self.field in ("error", "crash") else "trace"

    def describe(self) -> str:
        where = f"step {self.step}, " if self.step is not None else ""
        return (f"{where}field {self.field}\n"
                f"  {self.a_name}: {json.dumps(self.a)}\n"
                f"  {self.b_name}: {json.dumps(self.b)}")

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "field": self.field, self.a_name: self.a, self.b_name: self.b}


def _first_difference(field: str, x: Any, y: Any) -> tuple[str, Any, Any]:
    """Narrow a differing dict value down to its first differing key."""
    if isinstance(x, dict) and isinstance(y, dict):
        for k in list(x) + [k for k in y if k not in x]:
            if k not in x:
                return f"{field}.{k}", "<absent>", y[k]
            if k not in y:
                return f"{field}.{k}", x[k], "<absent>"
            if x[k] != y[k]:
                return _first_difference(f"{field}.{k}", x[k], y[k])
    return field, x, y


def _ordered_common(x: dict, y: dict, first: tuple[str, ...] = ()) -> list[str]:
    keys = [k for k in first if k in x and k in y]
    keys += sorted(k for k in x if k in y and k not in keys)
    return keys


def compare_traces(a: dict[str, Any], b: dict[str, Any]) -> Divergence | None:
    """The first difference between two traces, comparing every field both
    report, step by step, then the summary; None when they agree.  Two error
    traces agree (messages are not compared); an error trace and a run do not;
    a trace that ends early or runs longer is a divergence."""
    an, bn = a.get("implementation", "a"), b.get("implementation", "b")
    if an == bn:
        an, bn = f"{an} (a)", f"{bn} (b)"
    mk = lambda field, x, y, step=None: Divergence(field, x, y, step, an, bn)  # noqa: E731
    ea, eb = "error" in a, "error" in b
    if ea and eb:
        return None
    if ea or eb:
        return mk("error", a.get("error", "<accepts the scenario>"), b.get("error", "<accepts the scenario>"))
    sa, sb = a.get("steps", []), b.get("steps", [])
    for x, y in zip(sa, sb):
        for k in _ordered_common(x, y, STEP_FIELDS):
            if x[k] != y[k]:
                field, vx, vy = _first_difference(k, x[k], y[k])
                return mk(field, vx, vy, x.get("step"))
    if len(sa) != len(sb):
        at = min(len(sa), len(sb))
        last = (sa or sb)[at - 1].get("step", at - 1) + 1 if at else 0
        return mk("steps", f"{len(sa)} steps", f"{len(sb)} steps", last)
    ma, mb = a.get("summary"), b.get("summary")
    if isinstance(ma, dict) and isinstance(mb, dict):
        for k in _ordered_common(ma, mb, ("steps", "finished", "unfinished", "requests")):
            if ma[k] != mb[k]:
                field, vx, vy = _first_difference(f"summary.{k}", ma[k], mb[k])
                return mk(field, vx, vy)
    elif (ma is None) != (mb is None):
        return mk("summary", ma, mb)
    return None


# ---------------------------------------------------------------------------
# Running implementations with timing


class _Timed:
    """Wraps an implementation and adds up the time spent in its scheduler
    calls (add_request, finish_requests, schedule, update_from_output);
    construction (reset) and state read-back (observe) are not counted."""

    def __init__(self, impl):
        self.impl = impl
        self.name = getattr(impl, "name", type(impl).__name__)
        self.seconds = 0.0
        self.steps = 0

    def _timed(self, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t

    def reset(self, config):
        return self.impl.reset(config)

    def add_request(self, request):
        return self._timed(self.impl.add_request, request)

    def finish_requests(self, ids, status):
        return self._timed(self.impl.finish_requests, ids, status)

    def schedule(self):
        self.steps += 1
        return self._timed(self.impl.schedule)

    def update_from_output(self, output, sampled):
        return self._timed(self.impl.update_from_output, output, sampled)

    def observe(self):
        return self.impl.observe()

    def close(self):
        close = getattr(self.impl, "close", None)
        if close:
            close()


def _crash_trace(scenario: Scenario, impl, e: BaseException) -> dict[str, Any]:
    return {"scenario": scenario.name, "implementation": getattr(impl, "name", "?"), "steps": [],
            "crash": f"{type(e).__name__}: {e}"}


def _run_guarded(scenario: Scenario, a, b) -> tuple[dict, dict, Divergence | None]:
    """Like run_pair, but an implementation that raises is a divergence
    (field "crash"), not the end of the campaign."""
    traces = []
    for impl in (a, b):
        try:
            traces.append(run_scenario(scenario, impl))
        except Exception as e:  # noqa: BLE001 - report it with the scenario
            traces.append(_crash_trace(scenario, impl, e))
    ta, tb = traces
    if "crash" in ta or "crash" in tb:
        return ta, tb, Divergence("crash", ta.get("crash", "<no crash>"), tb.get("crash", "<no crash>"), None,
                                  getattr(a, "name", "a"), getattr(b, "name", "b"))
    return ta, tb, compare_traces(ta, tb)


def run_pair(scenario: Scenario, a, b) -> tuple[dict, dict, Divergence | None]:
    ta = run_scenario(scenario, a)
    tb = run_scenario(scenario, b)
    return ta, tb, compare_traces(ta, tb)


# ---------------------------------------------------------------------------
# Shrinking


def _valid_structure(s: Scenario) -> bool:
    last = 0
    ids = {}
    for r in s.requests:
        if r.arrival_step < last or r.id in ids or r.prompt_len < 1:
            return False
        if r.max_tokens is not None and r.max_tokens < 1:
            return False
        if r.output_len is not None and r.output_len < 1:
            return False
        last = r.arrival_step
        ids[r.id] = r
    return all(a.id in ids and a.step > ids[a.id].arrival_step for a in s.aborts) and s.max_steps >= 1


def _smaller(v: int, lo: int) -> list[int]:
    out = []
    for c in (lo, (lo + v) // 2, v - 1):
        if lo <= c < v and c not in out:
            out.append(c)
    return out


def shrink(scenario: Scenario, a, b, divergence: Divergence, *, budget_s: float = 120.0,
           max_runs: int = 3000) -> tuple[Scenario, Divergence]:
    """Greedy delta debugging: keep any simplification that still diverges the
    same way (error vs trace), until none helps or the budget runs out."""
    deadline = time.monotonic() + budget_s
    runs = 0
    best, best_div = scenario, divergence

    def diverges(s: Scenario) -> Divergence | None:
        nonlocal runs
        if not _valid_structure(s) or runs >= max_runs or time.monotonic() > deadline:
            return None
        runs += 1
        try:
            _, _, d = run_pair(s, a, b)
        except Exception:  # noqa: BLE001 - a crash is not the divergence we shrink
            return None
        return d if d is not None and d.kind == divergence.kind else None

    def attempt(s: Scenario) -> bool:
        nonlocal best, best_div
        if s == best:
            return False
        d = diverges(s)
        if d is None:
            return False
        best, best_div = s, d
        if d.step is not None and best.max_steps > d.step + 1:
            best = dataclasses.replace(best, max_steps=d.step + 1)
        return True

    def without_requests(s: Scenario, drop: set[str]) -> Scenario:
        return dataclasses.replace(
            s, requests=tuple(r for r in s.requests if r.id not in drop),
            aborts=tuple(x for x in s.aborts if x.id not in drop))

    if best_div.step is not None and best.max_steps > best_div.step + 1:
        attempt(dataclasses.replace(best, max_steps=best_div.step + 1))

    changed = True
    while changed and time.monotonic() < deadline and runs < max_runs:
        changed = False
        # 1. drop requests, in chunks, then one by one
        n = len(best.requests)
        chunk = max(1, n // 2)
        while chunk >= 1 and len(best.requests) > 1:
            ids = [r.id for r in best.requests]
            progressed = False
            for i in range(0, len(ids), chunk):
                drop = set(ids[i:i + chunk])
                if len(drop) < len(ids) and attempt(without_requests(best, drop)):
                    changed = progressed = True
                    break
            if not progressed:
                chunk //= 2
        # 2. drop aborts
        for ab in list(best.aborts):
            if ab in best.aborts:
                changed |= attempt(dataclasses.replace(
                    best, aborts=tuple(x for x in best.aborts if x != ab)))
        # 3. simplify requests
        for idx in range(len(best.requests)):
            for make in _request_edits(best, idx):
                while True:
                    cand = make(best)
                    if cand is None or not attempt(cand):
                        break
                    changed = True
        # 4. abort steps earlier
        for k in range(len(best.aborts)):
            ab = best.aborts[k]
            arrival = next(r.arrival_step for r in best.requests if r.id == ab.id)
            for step in _smaller(ab.step, arrival + 1):
                aborts = list(best.aborts)
                aborts[k] = Abort(ab.id, step)
                if attempt(dataclasses.replace(best, aborts=tuple(aborts))):
                    changed = True
                    break
        # 5. simplify the config
        for key in list(best.config):
            if key in ("max_model_len", "num_gpu_blocks", "max_num_batched_tokens", "max_num_seqs", "block_size"):
                continue
            cfg = {k: v for k, v in best.config.items() if k != key}
            changed |= attempt(dataclasses.replace(best, config=cfg))
        for key, lo in (("max_model_len", 2), ("num_gpu_blocks", 2), ("max_num_batched_tokens", 1),
                        ("max_num_seqs", 1), ("max_num_scheduled_tokens", 1), ("max_num_active_seqs", 1),
                        ("long_prefill_token_threshold", 1), ("block_size", 1)):
            while isinstance(best.config.get(key), int):
                for v in _smaller(best.config[key], lo):
                    if attempt(dataclasses.replace(best, config={**best.config, key: v})):
                        changed = True
                        break
                else:
                    break
    return best, best_div


def _request_edits(s: Scenario, idx: int) -> list[Callable[[Scenario], Scenario | None]]:
    """Edits of request `idx` that make it simpler, each returning None when
    there is nothing left to do."""
    rid = s.requests[idx].id

    def edit(field: str, values: Callable[[RequestSpec, Scenario, int], list[Any]]):
        def make(cur: Scenario) -> Scenario | None:
            reqs = list(cur.requests)
            i = next((j for j, r in enumerate(reqs) if r.id == rid), None)
            if i is None:
                return None
            for v in values(reqs[i], cur, i):
                reqs2 = list(reqs)
                reqs2[i] = dataclasses.replace(reqs[i], **{field: v})
                cand = dataclasses.replace(cur, requests=tuple(reqs2))
                if cand != cur:
                    return cand
            return None
        return make

    def ints(attr: str, lo: int):
        def values(r: RequestSpec, cur: Scenario, i: int) -> list[Any]:
            v = getattr(r, attr)
            return _smaller(v, lo)[:1] if isinstance(v, int) else []
        return values

    def halving(attr: str, lo: int):
        def values(r: RequestSpec, cur: Scenario, i: int) -> list[Any]:
            v = getattr(r, attr)
            if not isinstance(v, int) or v <= lo:
                return []
            return [max(lo, v // 2)] if v // 2 >= lo and v // 2 < v else [v - 1]
        return values

    def minus_one(attr: str, lo: int):
        def values(r: RequestSpec, cur: Scenario, i: int) -> list[Any]:
            v = getattr(r, attr)
            return [v - 1] if isinstance(v, int) and v - 1 >= lo else []
        return values

    def earlier_arrival(r: RequestSpec, cur: Scenario, i: int) -> list[Any]:
        # As early as the request listed before it (arrivals stay in list order).
        floor = cur.requests[i - 1].arrival_step if i > 0 else 0
        return [floor] if floor < r.arrival_step else []

    return [
        edit("output_len", lambda r, cur, i: [None] if r.output_len is not None else []),
        edit("priority", lambda r, cur, i: [0] if r.priority else []),
        edit("arrival_time", lambda r, cur, i: [float(i)] if r.arrival_time != float(i) else []),
        edit("prompt_len", ints("prompt_len", 1)),
        edit("prompt_len", halving("prompt_len", 1)),
        edit("prompt_len", minus_one("prompt_len", 1)),
        edit("max_tokens", ints("max_tokens", 1)),
        edit("max_tokens", halving("max_tokens", 1)),
        edit("max_tokens", minus_one("max_tokens", 1)),
        edit("output_len", halving("output_len", 1)),
        edit("output_len", minus_one("output_len", 1)),
        edit("arrival_step", earlier_arrival),
    ]


# ---------------------------------------------------------------------------
# Coverage of a campaign (what the agreeing traces exercised)


def _coverage(scenario: Scenario, trace: dict, cov: dict[str, int]) -> None:
    if "error" in trace:
        cov["rejected scenarios"] = cov.get("rejected scenarios", 0) + 1
        return
    L = scenario.config.get("max_model_len", 8192)
    specs = {r.id: r for r in scenario.requests}
    preempted_waiting: set[str] = set()
    prev_running: list[str] = []

    def bump(key: str, n: int = 1) -> None:
        cov[key] = cov.get(key, 0) + n

    for st in trace["steps"]:
        for rid, reason in st["finished"]:
            if reason == "aborted":
                if rid in prev_running:
                    bump("aborts of running requests")
                elif rid in preempted_waiting:
                    bump("aborts of preempted requests")
                else:
                    bump("aborts of waiting requests")
        if st["preempted"]:
            bump("steps with preemption")
            bump("preemptions", len(st["preempted"]))
            if any(rid in st["preempted"] for rid, _ in st["scheduled"]):
                bump("preempted and rescheduled in one step")
        preempted_waiting |= set(st["preempted"])
        preempted_waiting -= set(st["resumed"])
        if st["resumed"]:
            bump("resumptions", len(st["resumed"]))
        prev_running = st["running"]
    for rid, s in trace["summary"]["requests"].items():
        reason = s["finish_reason"]
        if reason == "length":
            r = specs[rid]
            if r.prompt_len + s["num_output_tokens"] >= L and (r.max_tokens is None or s["num_output_tokens"] < r.max_tokens):
                bump("finished: max_model_len")
            else:
                bump("finished: max_tokens")
        elif reason:
            bump(f"finished: {reason}")
        else:
            bump("unfinished at max_steps")


# ---------------------------------------------------------------------------
# The command


def _load_impl(name: str):
    try:
        return load_impl(name)
    except ImplementationError as e:
        raise UsageError(str(e)) from None


def _unique_path(directory: Path, stem: str) -> Path:
    p = directory / f"{stem}.json"
    k = 2
    while p.exists():
        p = directory / f"{stem}-{k}.json"
        k += 1
    return p


def _repro_command(impl: str, against: str, path: Path) -> str:
    cmd = f"schedspec diff --impl {impl}"
    if against != "spec":
        cmd += f" --against {against}"
    return f"{cmd} {path}"


def _resolve(path: str) -> str:
    try:
        from ..examples import resolve_scenario_path
    except ImportError:
        return path
    return resolve_scenario_path(path)


def _scenarios(args) -> Iterator[tuple[Scenario, bool]]:
    """(scenario, is_random) in run order."""
    for f in args.files:
        try:
            yield load_scenario(_resolve(f)), False
        except ScenarioError as e:
            raise UsageError(str(e)) from None
    if args.num_scenarios:
        from .generator import generate_scenario, scenario_rng

        for i in range(args.num_scenarios):
            s = generate_scenario(scenario_rng(args.seed, i), i)
            yield dataclasses.replace(
                s, name=f"random-s{args.seed}-{i}",
                description=f"random scenario {i} of seed {args.seed} (schedspec diff --scenarios N --seed "
                            f"{args.seed}, N > {i})"), True


def _accepts(impl_name: str, impl, raw: dict[str, Any]) -> tuple[bool, str]:
    if impl_name == "spec":
        try:
            config_from_dict(raw)
            return True, ""
        except ConfigError as e:
            return False, str(e)
    try:
        cfg = SchedulerConfig(**{k: (float(v) if k == "watermark" else v) for k, v in raw.items()})
        impl.reset(cfg)
        return True, ""
    except (ConfigError, ValueError) as e:
        return False, str(e)


def run_config_agreement(args, impl_a, impl_b, out) -> dict[str, Any]:
    from .generator import config_rng, generate_config_dict

    res = {"configs": args.configs, "both_accept": 0, "both_reject": 0, "disagreements": []}
    progress = Progress("configs", args.configs)
    try:
        for i in range(args.configs):
            rng = config_rng(args.seed, i)
            raw = generate_config_dict(rng, valid_bias=0.5)
            ok_a, why_a = _accepts(args.impl, impl_a, raw)
            ok_b, why_b = _accepts(args.against, impl_b, raw)
            if ok_a and ok_b:
                res["both_accept"] += 1
            elif not ok_a and not ok_b:
                res["both_reject"] += 1
            else:
                res["disagreements"].append({"index": i, "config": raw,
                                             args.impl: why_a or "accepts", args.against: why_b or "accepts"})
                if not args.json:
                    print(f"CONFIG DISAGREEMENT (config {i} of seed {args.seed}): {json.dumps(raw)}", file=out)
                    print(f"  {args.impl}: {why_a or 'accepts'}", file=out)
                    print(f"  {args.against}: {why_b or 'accepts'}", file=out)
            progress(i + 1, args.configs)
    finally:
        progress.close()
    return res


def cmd_diff(args) -> int:
    out = sys.stdout
    if args.files and args.num_scenarios:
        raise UsageError("give scenario files or --scenarios N, not both")
    if not args.files and not args.num_scenarios and not args.configs:
        raise UsageError("nothing to compare: give scenario files, --scenarios N or --configs N")
    for flag, v in (("--scenarios", args.num_scenarios), ("--configs", args.configs)):
        if v is not None and v < 1:
            raise UsageError(f"{flag} must be at least 1, got {v}")
    if args.impl == args.against:
        raise UsageError(f"--impl and --against are both {args.impl!r}; compare two implementations")
    outdir = Path(args.out)
    if outdir.exists() and not outdir.is_dir():
        raise UsageError(f"-o {args.out} exists and is not a folder")
    # Load the scenario files first, so a bad file fails before the slow imports.
    scenarios = list(_scenarios(argparse.Namespace(files=args.files, num_scenarios=None, seed=args.seed)))
    impl_a, impl_b = _load_impl(args.impl), _load_impl(args.against)
    a, b = _Timed(impl_a), _Timed(impl_b)
    report: dict[str, Any] = {"implementations": [args.impl, args.against]}
    status = 0
    try:
        if args.configs:
            res = run_config_agreement(args, impl_a, impl_b, out)
            report["config_agreement"] = res
            if res["disagreements"]:
                status = 1
            if not args.json:
                print(f"configs: {res['configs']}  both accept: {res['both_accept']}  both reject: "
                      f"{res['both_reject']}  disagreements: {len(res['disagreements'])}", file=out)
        if args.files or args.num_scenarios:
            res = _run_scenarios(args, scenarios, a, b, outdir, out)
            report.update(res)
            if res["divergences"]:
                status = 1
    finally:
        a.close()
        b.close()
    if args.json:
        print(json.dumps(report, indent=1), file=out)
    return status


def _run_scenarios(args, files: list[tuple[Scenario, bool]], a: _Timed, b: _Timed, outdir: Path, out) -> dict:
    total = len(files) + (args.num_scenarios or 0)
    progress = Progress("diff", total, min_total=20)
    divergences = []
    steps = 0
    coverage: dict[str, int] = {}
    t0 = time.monotonic()
    source: Iterator[tuple[Scenario, bool]] = iter(files) if files else _scenarios(
        argparse.Namespace(files=[], num_scenarios=args.num_scenarios, seed=args.seed))
    try:
        for k, (scenario, is_random) in enumerate(source, 1):
            ta, tb, d = _run_guarded(scenario, a, b)
            steps += min(len(ta.get("steps", [])), len(tb.get("steps", [])))
            _coverage(scenario, tb, coverage)
            if d is not None:
                progress.close() if progress.enabled else None
                divergences.append(_report_divergence(args, scenario, is_random, d, a.impl, b.impl, outdir, out))
            progress(k, total)
    finally:
        progress.close()
    elapsed = time.monotonic() - t0
    per_step = {x.name: (1000.0 * x.seconds / x.steps if x.steps else None) for x in (a, b)}
    res = {
        "scenarios": total,
        "steps_compared": steps,
        "divergences": divergences,
        "ms_per_step": per_step,
        "seconds": round(elapsed, 1),
        "coverage": dict(sorted(coverage.items())),
    }
    if not args.json:
        pa, pb = per_step[a.name], per_step[b.name]
        ratio = f"  ({a.name}/{b.name} = {pa / pb:.1f}x)" if pa and pb else ""
        fmt = lambda x: f"{x:.3f} ms" if x is not None else "-"  # noqa: E731
        print(f"scenarios: {total}  steps compared: {steps}  divergences: {len(divergences)}  "
              f"time: {elapsed:.1f} s", file=out)
        print(f"time per step in scheduler calls: {a.name} {fmt(pa)}, {b.name} {fmt(pb)}{ratio}", file=out)
        if coverage:
            print("coverage: " + ", ".join(f"{k} {v}" for k, v in sorted(coverage.items())), file=out)
    return res


def _report_divergence(args, scenario: Scenario, is_random: bool, d: Divergence, impl_a, impl_b,
                       outdir: Path, out) -> dict[str, Any]:
    outdir.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {"scenario": scenario.name, **d.to_json()}
    path = _unique_path(outdir, scenario.name)
    save_scenario(dataclasses.replace(
        scenario, description=(scenario.description + " | " if scenario.description else "")
        + f"Reproduce: {_repro_command(args.impl, args.against, path)}"), path)
    entry["file"] = str(path)
    if not args.json:
        print(f"DIVERGENCE in {scenario.name}: {d.describe()}", file=out)
        print(f"  scenario written to {path}", file=out)
    if is_random and not args.no_shrink and d.kind != "crash":
        small, sd = shrink(scenario, impl_a, impl_b, d, budget_s=args.shrink_seconds)
        mpath = _unique_path(outdir, f"{scenario.name}-min")
        small = dataclasses.replace(
            small, name=f"{scenario.name}-min",
            description=(f"Shrunk from {scenario.name} ({scenario.description}): {args.impl} and "
                         f"{args.against} first differ at "
                         + (f"step {sd.step}, " if sd.step is not None else "")
                         + f"field {sd.field}. Reproduce: {_repro_command(args.impl, args.against, mpath)}"))
        save_scenario(small, mpath)
        entry["minimal"] = {"file": str(mpath), "requests": len(small.requests),
                            "max_steps": small.max_steps, **sd.to_json()}
        if not args.json:
            print(f"  shrunk to {len(small.requests)} request(s), {small.max_steps} step(s): {mpath}", file=out)
            print(f"  {sd.describe()}".replace("\n", "\n  "), file=out)
            print(f"  reproduce: {_repro_command(args.impl, args.against, mpath)}", file=out)
    return entry


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "diff", help="differential test: two implementations on the same scenarios",
        description="Run two implementations (default: vllm against the spec) on the same scenarios "
                    "and compare their traces step by step. Exit 1 on any divergence.")
    p.add_argument("files", nargs="*", metavar="SCENARIO", help="scenario files or example names")
    p.add_argument("--impl", default="vllm", help="the implementation under test (default vllm)")
    p.add_argument("--against", default="spec", help="the reference implementation (default spec)")
    p.add_argument("--scenarios", dest="num_scenarios", type=int, metavar="N",
                   help="N random scenarios (reproducible with --seed)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random scenarios and configs (default 0)")
    p.add_argument("--configs", type=int, metavar="N",
                   help="config agreement: N random configs near the acceptance boundaries")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-o", "--out", default="divergences", metavar="DIR",
                   help="where diverging scenarios are written (default ./divergences)")
    p.add_argument("--no-shrink", action="store_true", help="do not shrink diverging random scenarios")
    p.add_argument("--shrink-seconds", type=float, default=120.0, metavar="S",
                   help="time budget for shrinking one divergence (default 120)")
    p.set_defaults(func=cmd_diff)


def main(argv: list[str] | None = None) -> int:
    """`schedspec diff ...` without the `schedspec` front: python -m schedspec.reference.diff."""
    from ..cli import main as cli_main

    return cli_main(["diff", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
