"""`schedspec`: run, validate and check scenarios; differential-test implementations.

Every user error is one line on stderr and exit status 2 (reference/errors.py, cli/common.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from schedspec.reference.errors import UsageError, fail, shown
from .args import int_arg
from schedspec.reference.progress import Progress
from schedspec.spec.versions import DEFAULT_RELEASE, RELEASES
from schedspec.reference.example_files import EXAMPLES_DIR, example_names, resolve_scenario_path

from . import changes, counterexample, diff, explore, install_vllm, keep_up, peer_tests, prove, sweep, vectors
from .common import (Parser, add_time_model_arguments, load_impl_or_fail, load_scenario_or_fail,
                     run_parsed)
from .device_flag import add_device_argument, device_for
from .vllm_version import add_vllm_version_argument

# Each further command lives in its own module and registers itself; heavy
# imports (z3, torch, vLLM) wait until it runs.
COMMAND_MODULES = (diff, install_vllm, counterexample, prove, sweep, explore, vectors, peer_tests, changes, keep_up)


def _run_trace(scenario, impl_name: str, baseline: str | None, on_step=None, device: str | None = None,
               sink=None):
    """The run's trace; with `sink` (reference/trace_io.py) the steps stream to
    it and the returned trace lists none."""
    if baseline:
        from schedspec.reference.baselines import run_baseline

        return run_baseline(scenario, baseline, sink=sink)
    from schedspec.reference.campaign import close_impl
    from schedspec.reference.engine import run_scenario

    impl = load_impl_or_fail(impl_name, device)
    progress = Progress(f"{scenario.name}", scenario.max_steps, min_total=2000)
    at = [0]  # the step being run, for a crash's message

    def track(step: int, total: int) -> None:
        at[0] = step
        progress(step, total)

    try:
        return run_scenario(scenario, impl, on_step=on_step, progress=track, sink=sink)
    except Exception as e:  # noqa: BLE001 - an implementation that raises: one line, exit 1
        # Not a user error: the scheduler itself failed (vLLM asserts on one
        # speculative-decoding case, docs/rules.md; the spec raises there too).
        fail(f"{impl_name} raised at step {at[0]} of {shown(scenario.name)}: {type(e).__name__}: "
             f"{shown(str(e), 200) or '(no message)'}", code=1)
    finally:
        progress.close()
        close_impl(impl)


def format_step(step: dict[str, Any]) -> str:
    # Ids are the user's text: escaped, so a newline or an escape code cannot
    # break the timeline or the terminal.
    grants = " ".join(f"{shown(rid, 40)}:{n}" for rid, n in step["scheduled"]) or "-"
    total = sum(n for _, n in step["scheduled"])
    parts = [f"step {step['step']:>4}  {total:>5} tok  {grants}"]
    for key, label in (("new", "new"), ("resumed", "resumed"), ("preempted", "PREEMPTED")):
        if step[key]:
            parts.append(f"{label} {','.join(shown(r, 40) for r in step[key])}")
    hits = {rid: h for rid, h in (step.get("prefix_hits") or {}).items() if h}
    if hits:
        parts.append("cache hit " + ",".join(f"{shown(rid, 40)}:{h}" for rid, h in hits.items()))
    if step.get("schedule_called") is False:
        parts.append("no schedule()")
    if step.get("applied_step") is not None and step["applied_step"] != step["step"]:
        parts.append(f"applied batch {step['applied_step']}")
    if step["finished"]:
        parts.append("finished " + ",".join(f"{shown(rid, 40)}({why})" for rid, why in step["finished"]))
    if step["waiting"]:
        parts.append(f"waiting {len(step['waiting'])}")
    return "  | ".join(parts)


class _Timeline:
    """The timeline as a trace sink: the first TIMELINE_STEPS steps in memory,
    or with mode "all" every line spooled to a temporary file, so that the
    run's output order stays the same without keeping the trace."""

    def __init__(self, mode: str):
        self.mode = mode
        self.count = 0
        self.lines: list[str] = []
        self.spool = None
        if mode == "all":
            import tempfile

            self.spool = tempfile.TemporaryFile("w+", encoding="utf-8")

    def begin(self, header) -> None:
        pass

    def step(self, record) -> None:
        self.count += 1
        if self.spool is not None:
            self.spool.write(format_step(record) + "\n")
        elif self.mode == "auto" and self.count <= TIMELINE_STEPS:
            self.lines.append(format_step(record))

    def end(self, trace) -> None:
        pass

    def print(self, out=None) -> None:
        out = out or sys.stdout
        if self.spool is not None:
            self.spool.seek(0)
            for line in self.spool:
                out.write(line)
            self.spool.close()
            return
        for line in self.lines:
            print(line, file=out)
        if self.mode == "auto" and self.count > TIMELINE_STEPS:
            print(f"... {self.count - TIMELINE_STEPS} more steps (--timeline all shows them)", file=out)


TIMELINE_STEPS = 60


class _no_writer:
    """`with` stand-in for TraceWriter when no trace is written."""

    def __enter__(self):
        return None

    def __exit__(self, *exc) -> None:
        return None


def cmd_run(args) -> int:
    device = device_for(args.device, [args.impl] if not args.policy_baseline else [args.policy_baseline])
    scenario = load_scenario_or_fail(args.scenario, args.modelled_release)
    # Every output path is checked before the run: a bad one costs nothing.
    from schedspec.reference.outputs import check_plot_path, check_trace_path

    inputs = [Path(resolve_scenario_path(args.scenario))]
    trace_path = check_trace_path(args.trace_out, "--trace-out", inputs) if args.trace_out is not None else None
    plot_path = check_plot_path(args.plot, "--plot", inputs) if args.plot is not None else None
    # Everything the run prints or writes is built as the steps stream by
    # (trace file, metrics, timeline, plot data), so a long run never holds
    # its trace in memory.
    from schedspec.reference.metrics import MetricsAccumulator, format_metrics
    from schedspec.reference.trace_io import Tee, TraceWriter

    metrics = MetricsAccumulator(scenario, step_ms=args.step_ms, token_ms=args.token_ms)
    timeline = _Timeline(args.timeline)
    plot_data = None
    if plot_path is not None:
        from schedspec.reference.plot import PlotData

        plot_data = PlotData(scenario)
    # The writer replaces trace_path only when the run ends with a trace.
    with TraceWriter(trace_path) if trace_path is not None else _no_writer() as writer:
        trace = _run_trace(scenario, args.impl, args.policy_baseline, device=device,
                           sink=Tee(writer, metrics, timeline, plot_data))
        if "error" in trace:
            raise UsageError(f"{trace['implementation']} rejects {shown(args.scenario)}: {trace['error']}")
    if plot_path is not None:
        from schedspec.reference.plot import draw

        progress = Progress("drawing the plot", 4, min_total=1)
        try:
            draw(plot_data, plot_path, token_budget=_token_budget(scenario),
                 title=f"{scenario.name} ({trace['implementation']})", progress=progress)
        finally:
            progress.close()
    print(f"# {shown(scenario.name)} on {trace['implementation']}")
    if scenario.description:
        print(f"# {shown(scenario.description, 2000)}")
    timeline.print()
    print(format_metrics(metrics.result()))
    if trace_path is not None:
        print(f"trace written to {shown(str(trace_path), 300)}")
    if plot_path is not None:
        print(f"plot written to {shown(str(plot_path), 300)}")
    return 0


def _token_budget(scenario) -> int | None:
    from schedspec.spec.config import ConfigError, step_budget

    try:
        c = scenario.scheduler_config()
    except ConfigError:
        return None
    return step_budget(c)


def cmd_validate(args) -> int:
    from schedspec.reference.scenario import validate_scenario
    from schedspec.spec.config import ConfigError

    scenario = load_scenario_or_fail(args.scenario, args.modelled_release)
    try:
        config = validate_scenario(scenario)
    except ConfigError as e:
        raise UsageError(f"{shown(args.scenario)}: {e}") from None
    print(f"{shown(args.scenario)}: valid ({len(scenario.requests)} requests, {len(scenario.aborts)} aborts, "
          f"token budget {config.token_budget}, max_num_seqs {config.max_num_seqs}, "
          f"{config.num_usable_blocks} usable KV blocks of {config.block_size} tokens)")
    return 0


def cmd_check(args) -> int:
    from schedspec.spec.properties import PROPERTIES, check_step

    device = device_for(args.device, [args.impl])
    scenario = load_scenario_or_fail(args.scenario, args.modelled_release)
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

    counted = _Timeline("none")  # counts the steps; the trace itself is not kept
    trace = _run_trace(scenario, args.impl, None, on_step=on_step, device=device, sink=counted)
    if "error" in trace:
        raise UsageError(f"{trace['implementation']} rejects {shown(args.scenario)}: {trace['error']}")
    steps = counted.count
    print(f"# {shown(scenario.name)} on {trace['implementation']}: {steps} steps, {len(PROPERTIES)} properties")
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
    tested = sum(1 for n in PROPERTIES if applicable[n] and not violations[n])
    vacuous = len(PROPERTIES) - bad - tested
    if tested == 0 and bad == 0:
        # Nothing was tested: "hold" would be a claim the run cannot back.
        print(f"vacuous: no property's premise held in any of the {steps} steps, so this scenario tests "
              "none of them (nothing violated, nothing shown); add requests that reach the situations "
              "the properties are about")
    else:
        print(f"{tested} properties hold, {bad} violated, {vacuous} vacuous (premise held in no step: untested)")
    return 1 if bad else 0


def cmd_examples(args) -> int:
    """Run every shipped example and print the figures the seeds promise."""
    from schedspec.reference.engine import run_scenario
    from schedspec.reference.impl import SpecScheduler
    from schedspec.reference.metrics import compute_metrics
    from schedspec.reference.scenario import load_scenario

    print(f"schedspec: the seed examples on the executable spec of vLLM {DEFAULT_RELEASE}'s V1 scheduler\n")
    for name in example_names():
        scenario = load_scenario(EXAMPLES_DIR / f"{name}.json")
        trace = run_scenario(scenario, SpecScheduler())
        print(f"== {name}: {shown(scenario.description, 2000)}")
        for step in trace["steps"][: args.steps]:
            print("   " + format_step(step))
        if len(trace["steps"]) > args.steps:
            print(f"   ... {len(trace['steps']) - args.steps} more steps")
        if name == "static-waste":
            for kind in ("static", "request", "iteration"):
                from schedspec.reference.baselines import run_baseline

                m = compute_metrics(scenario, run_baseline(scenario, kind))["overall"]
                print(f"   baseline {kind:<9}: {m['steps']} steps, wasted {m['wasted_ms']:.0f} ms of "
                      f"{m['held_ms']:.0f} ms slot time ({100 * m['waste_fraction']:.1f} %)")
            m = compute_metrics(scenario, trace)["overall"]
            print(f"   vLLM V1 (spec)    : {m['steps']} steps, wasted {m['wasted_ms']:.0f} ms of "
                  f"{m['held_ms']:.0f} ms slot time ({100 * m['waste_fraction']:.1f} %)")
        print()
    return 0


DESCRIPTION = f"""Run, validate and check scheduler scenarios against an executable
specification of vLLM's V1 scheduler ({DEFAULT_RELEASE} unless --vllm-version names one of
{', '.join(RELEASES)}), and compare implementations step by step.  A user error is
one line on stderr and exit status 2."""

SCENARIO_HELP = ("a scenario file (JSON, see docs/formats.md) or the name of a shipped example "
                 "(`schedspec examples` lists them)")
IMPL_HELP = ("the scheduler to run: spec (default, the executable specification), vllm (the installed vLLM's "
             "own scheduler; loading it takes about 20 s), vllm==X (release X, from its own environment: "
             "schedspec install-vllm --version X), torch, or module:Class for your own class")


def build_parser() -> argparse.ArgumentParser:
    from schedspec import __version__

    parser = Parser(prog="schedspec", description=DESCRIPTION)
    parser.add_argument("--version", action="version",
                        version=f"schedspec {__version__} (specification of vLLM's V1 scheduler, {RELEASES[0]} to "
                                f"{RELEASES[-1]})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run a scenario, print the per-step timeline and the metrics",
                       description="Run a scenario on an implementation and print what it scheduled at "
                                   "each step and the latency, throughput and waste figures.")
    p.add_argument("scenario", help=SCENARIO_HELP)
    p.add_argument("--impl", default="spec", help=IMPL_HELP)
    p.add_argument("--trace-out", metavar="FILE",
                   help="also write the step-by-step trace (format schedspec.trace/1) to FILE, streamed as the "
                        "run goes; a name ending in .gz is written gzip-compressed; an existing "
                        "FILE is replaced only if it is a schedspec trace")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw the tokens each request got at each step to FILE (.png, .pdf or .svg); an "
                        "existing FILE is replaced only if schedspec drew it")
    p.add_argument("--policy-baseline", choices=["static", "request", "iteration"],
                   help="instead of vLLM's scheduler, run a textbook batching policy: static (a fixed batch "
                        "runs until its longest request ends), request (a finished request's slot is "
                        "refilled only at batch boundaries) or iteration (refilled every step)")
    p.add_argument("--timeline", choices=["auto", "all", "none"], default="auto",
                   help="steps printed: auto (the first 60, default), all, or none")
    add_time_model_arguments(p)
    add_device_argument(p)
    add_vllm_version_argument(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("validate", help="check a scenario file and whether vLLM accepts its config",
                       description="Check a scenario file against its format and the modelled vLLM release's config "
                                   "rules without running it.")
    p.add_argument("scenario", help=SCENARIO_HELP)
    add_vllm_version_argument(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("check", help="run a scenario and evaluate every property at every step",
                       description="Run a scenario and evaluate each scheduler property at each step. A "
                                   "property whose premise holds in no step is reported vacuous (untested). "
                                   "Exit 1 when a property is violated.")
    p.add_argument("scenario", help=SCENARIO_HELP)
    p.add_argument("--impl", default="spec", help=IMPL_HELP)
    add_device_argument(p)
    add_vllm_version_argument(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("examples", help="run the shipped example scenarios and print their figures",
                       description="Run every shipped example on the specification and print its first "
                                   "steps (and, for static-waste, the batching baselines' waste).")
    p.add_argument("--steps", type=int_arg(0, 1_000_000), default=6, metavar="N",
                   help="timeline steps to show per example (default 6; 0 shows none)")
    p.set_defaults(func=cmd_examples)

    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from schedspec.reference.errors import fail

    from .vllm_version import reexec_if_needed

    try:  # `--impl vllm==X` runs under release X's own interpreter (cli/vllm_version.py)
        reexec_if_needed(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        fail(str(e))
    return run_parsed(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
