"""`schedspec`: run, validate and check scenarios; differential-test implementations.

Every user error is one line on stderr and exit status 2 (schedspec/errors.py).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from .errors import Progress, UsageError, fail
from .examples import EXAMPLES_DIR, example_names, resolve_scenario_path


COMMAND_MODULES = (
    "schedspec.reference.diff_cli",
    "schedspec.reference.vllm_install",
    "schedspec.proofs.counterexample_cli",
    "schedspec.proofs.prove_cli",
    "schedspec.gpu.sweep_cli",
)


def _load(path_or_name: str):
    from .reference.scenario import ScenarioError, load_scenario

    try:
        return load_scenario(resolve_scenario_path(path_or_name))
    except ScenarioError as e:
        raise UsageError(str(e)) from None


def _impl(name: str, device: str | None = None):
    from .reference.impl import ImplementationError, load_impl

    try:
        return load_impl(name, device=device)
    except ImplementationError as e:
        raise UsageError(str(e)) from None


def _safe_output_path(path: str, inputs: list[Path], kind: str) -> Path:
    """An output may replace an earlier output of ours, never an input or a
    file we did not write."""
    out = Path(path)
    for p in inputs:
        if p.exists() and out.exists() and out.resolve() == p.resolve():
            raise UsageError(f"{kind} {path} is an input of this command; choose another file")
    if out.exists() and kind == "--trace-out":
        try:
            prior = json.loads(out.read_text())
            ok = isinstance(prior, dict) and str(prior.get("format", "")).startswith("schedspec.trace/")
        except (OSError, ValueError):
            ok = False
        if not ok:
            raise UsageError(f"--trace-out {path} exists and is not a schedspec trace; not overwriting it")
    if out.parent and not out.parent.exists():
        raise UsageError(f"{kind} {path}: folder {out.parent} does not exist")
    return out


def _run_trace(scenario, impl_name: str, baseline: str | None, on_step=None, device: str | None = None):
    if baseline:
        from .reference.baselines import run_baseline

        return run_baseline(scenario, baseline)
    from .reference.engine import run_scenario

    impl = _impl(impl_name, device)
    progress = Progress(f"{scenario.name}", scenario.max_steps, min_total=2000)
    try:
        return run_scenario(scenario, impl, on_step=on_step, progress=progress)
    finally:
        progress.close()
        close = getattr(impl, "close", None)
        if close:
            close()


def format_step(step: dict[str, Any]) -> str:
    grants = " ".join(f"{rid}:{n}" for rid, n in step["scheduled"]) or "-"
    total = sum(n for _, n in step["scheduled"])
    parts = [f"step {step['step']:>4}  {total:>5} tok  {grants}"]
    for key, label in (("new", "new"), ("resumed", "resumed"), ("preempted", "PREEMPTED")):
        if step[key]:
            parts.append(f"{label} {','.join(step[key])}")
    if step["finished"]:
        parts.append("finished " + ",".join(f"{rid}({why})" for rid, why in step["finished"]))
    if step["waiting"]:
        parts.append(f"waiting {len(step['waiting'])}")
    return "  | ".join(parts)


def print_timeline(trace: dict[str, Any], mode: str, out=None) -> None:
    out = out or sys.stdout  # looked up per call: the stream may be replaced after import
    steps = trace["steps"]
    limit = len(steps) if mode == "all" else 60
    if mode == "none":
        return
    for step in steps[:limit]:
        print(format_step(step), file=out)
    if len(steps) > limit:
        print(f"... {len(steps) - limit} more steps (--timeline all shows them)", file=out)


def cmd_run(args) -> int:
    from .gpu.device_flag import device_for

    device = device_for(args.device, [args.impl] if not args.policy_baseline else [args.policy_baseline])
    scenario = _load(args.scenario)
    trace = _run_trace(scenario, args.impl, args.policy_baseline, device=device)
    if "error" in trace:
        raise UsageError(f"{trace['implementation']} rejects {args.scenario}: {trace['error']}")
    inputs = [Path(resolve_scenario_path(args.scenario))]
    if args.trace_out:
        out = _safe_output_path(args.trace_out, inputs, "--trace-out")
        out.write_text(json.dumps(trace, indent=1) + "\n")
    if args.plot:
        from .reference.plot import plot_budget

        plot_path = _safe_output_path(args.plot, inputs, "--plot")
        plot_budget(trace, plot_path, token_budget=_token_budget(scenario), title=f"{scenario.name} ({trace['implementation']})")
    print(f"# {scenario.name} on {trace['implementation']}")
    if scenario.description:
        print(f"# {scenario.description}")
    print_timeline(trace, args.timeline)
    from .reference.metrics import compute_metrics, format_metrics

    print(format_metrics(compute_metrics(scenario, trace, step_ms=args.step_ms, token_ms=args.token_ms)))
    if args.trace_out:
        print(f"trace written to {args.trace_out}")
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def _token_budget(scenario) -> int | None:
    from .spec.config import ConfigError

    try:
        c = scenario.scheduler_config()
    except ConfigError:
        return None
    return min(c.token_budget, c.max_num_batched_tokens)


def cmd_validate(args) -> int:
    from .reference.scenario import validate_scenario
    from .spec.config import ConfigError

    scenario = _load(args.scenario)
    try:
        config = validate_scenario(scenario)
    except ConfigError as e:
        raise UsageError(f"{args.scenario}: {e}") from None
    print(f"{args.scenario}: valid ({len(scenario.requests)} requests, {len(scenario.aborts)} aborts, "
          f"token budget {config.token_budget}, max_num_seqs {config.max_num_seqs}, "
          f"{config.num_usable_blocks} usable KV blocks of {config.block_size} tokens)")
    return 0


def cmd_check(args) -> int:
    from .spec.properties import PROPERTIES, check_step

    from .gpu.device_flag import device_for

    device = device_for(args.device, [args.impl])
    scenario = _load(args.scenario)
    applicable = {name: 0 for name in PROPERTIES}
    first_violation: dict[str, tuple[int, Any]] = {}
    violations = {name: 0 for name in PROPERTIES}

    def on_step(t) -> None:
        for name, verdict in check_step(t.before, t.output, t.after).items():
            if verdict.applicable:
                applicable[name] += 1
            if not verdict.holds:
                violations[name] += 1
                first_violation.setdefault(name, (t.step, verdict))

    trace = _run_trace(scenario, args.impl, None, on_step=on_step, device=device)
    if "error" in trace:
        raise UsageError(f"{trace['implementation']} rejects {args.scenario}: {trace['error']}")
    steps = len(trace["steps"])
    print(f"# {scenario.name} on {trace['implementation']}: {steps} steps, {len(PROPERTIES)} properties")
    width = max(map(len, PROPERTIES))
    for name, p in PROPERTIES.items():
        if violations[name]:
            step, v = first_violation[name]
            values = ", ".join(f"{k}={v2}" for k, v2 in v.values.items())
            print(f"{name:<{width}}  VIOLATED  {violations[name]} of {applicable[name]} steps; first at step {step}: {v.detail} ({values})")
        elif applicable[name]:
            print(f"{name:<{width}}  pass      {applicable[name]} of {steps} steps")
        else:
            print(f"{name:<{width}}  vacuous   premise held in no step: not tested by this scenario")
    bad = sum(1 for n in violations if violations[n])
    print(f"{len(PROPERTIES) - bad} properties hold, {bad} violated")
    return 1 if bad else 0


def cmd_examples(args) -> int:
    """Run every shipped example and print the figures the seeds promise."""
    from .reference.engine import run_scenario
    from .reference.impl import SpecScheduler
    from .reference.metrics import compute_metrics
    from .reference.scenario import load_scenario

    print("schedspec: the seed examples on the executable spec of vLLM 0.33.0's V1 scheduler\n")
    for name in example_names():
        scenario = load_scenario(EXAMPLES_DIR / f"{name}.json")
        trace = run_scenario(scenario, SpecScheduler())
        print(f"== {name}: {scenario.description}")
        for step in trace["steps"][: args.steps]:
            print("   " + format_step(step))
        if len(trace["steps"]) > args.steps:
            print(f"   ... {len(trace['steps']) - args.steps} more steps")
        if name == "static-waste":
            for kind in ("static", "request", "iteration"):
                from .reference.baselines import run_baseline

                m = compute_metrics(scenario, run_baseline(scenario, kind))["overall"]
                print(f"   baseline {kind:<9}: {m['steps']} steps, wasted {m['wasted_ms']:.0f} ms of "
                      f"{m['held_ms']:.0f} ms slot time ({100 * m['waste_fraction']:.1f} %)")
            m = compute_metrics(scenario, trace)["overall"]
            print(f"   vLLM V1 (spec)    : {m['steps']} steps, wasted {m['wasted_ms']:.0f} ms of "
                  f"{m['held_ms']:.0f} ms slot time ({100 * m['waste_fraction']:.1f} %)")
        print()
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .gpu.device_flag import add_device_argument

    parser = argparse.ArgumentParser(prog="schedspec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a scenario, print the per-step timeline and the metrics")
    p.add_argument("scenario", help="a scenario file, or the name of a shipped example")
    p.add_argument("--impl", default="spec", help="spec (default), vllm, or module:Class")
    p.add_argument("--trace-out", metavar="FILE", help="write the trace (schedspec.trace/1) here")
    p.add_argument("--plot", metavar="FILE.png", help="draw the per-step token-budget chart")
    p.add_argument("--policy-baseline", choices=["static", "request", "iteration"],
                   help="run a batching baseline of the seeds' Table 1 instead of the V1 scheduler")
    p.add_argument("--timeline", choices=["auto", "all", "none"], default="auto")
    p.add_argument("--step-ms", type=float, default=20.0, help="step-time model: ms per step (default 20)")
    p.add_argument("--token-ms", type=float, default=0.0, help="step-time model: extra ms per scheduled token")
    add_device_argument(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("validate", help="check a scenario file and whether vLLM 0.33.0 accepts its config")
    p.add_argument("scenario")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("check", help="run a scenario and evaluate every property at every step")
    p.add_argument("scenario")
    p.add_argument("--impl", default="spec")
    add_device_argument(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("examples", help="run the shipped examples (the seeds' numbers)")
    p.add_argument("--steps", type=int, default=6, help="timeline steps to show per example")
    p.set_defaults(func=cmd_examples)

    # Each further command lives with the part of the project it belongs to and
    # registers itself; heavy imports (z3, torch, vLLM) wait until it runs.
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # argparse's own errors already print one usage line and exit 2.
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
