"""What the command modules share: the parser with one-line errors, running a
parsed command, the implementation and scenario loaders, and flags several
commands take.

cli/main.py builds the `schedspec` parser from the command modules (diff,
prove, sweep, ...); they import this module, never main.py, and each can also
run alone (`python -m schedspec.cli.diff ...`) through `standalone_main`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .args import float_arg
from schedspec.reference.errors import UsageError, fail, status
from schedspec.spec.versions import DEFAULT_RELEASE


class Parser(argparse.ArgumentParser):
    """argparse with the project's promise: an error is one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.partition(" ")[2]
        fail(f"{command + ': ' if command else ''}{message} (`{self.prog} --help` for usage)")


def run_parsed(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse `argv` and run the chosen command's `func`: its exit status; a
    UsageError is one line on stderr and exit 2, Ctrl-C exit 130, a closed
    pipe (`| head`) exit 0."""
    args = parser.parse_args(argv)  # its errors: Parser.error, one line, exit 2
    try:
        from .vllm_version import apply

        # The vLLM release the command models (--impl vllm==X, --vllm-version X): the
        # commands pass it on to what reads or draws scenarios.
        args.modelled_release = apply(args)
        return int(args.func(args) or 0)
    except UsageError as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except BrokenPipeError:
        return 0


def standalone_main(command: str, register: Callable[[Any], None],
                    argv: Sequence[str] | None = None) -> int:
    """`schedspec COMMAND ...` without the other commands: a parser with only
    the command `register` adds, errors and help worded as under `schedspec`."""
    parser = Parser(prog="schedspec")
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return run_parsed(parser, [command, *(sys.argv[1:] if argv is None else argv)])


def load_impl_or_fail(name: str, device: str | None = None):
    """The implementation `--impl` names; a UsageError (one line) when it cannot be
    loaded, and a status line while vLLM loads."""
    from schedspec.reference.loader import ImplementationError, load_impl

    from .vllm_version import installed_vllm, split_impl

    base, release = split_impl(name)  # vllm==X: this process runs release X (vllm_version.py)
    try:
        # reference/loader.py's status line names no release; under vllm==X it loads X.
        shown_release = release or (installed_vllm() if base == "vllm" else None)
        say = status if shown_release is None else \
            (lambda m: status(m.replace("vLLM ", f"vLLM {shown_release} ", 1)))
        impl = load_impl(name, device=device, status=say)
    except ImplementationError as e:
        raise UsageError(str(e)) from None
    if base == "vllm":
        # Said apart so the load is not mistaken for the run's own time.
        status(f"vLLM loaded in {getattr(impl, 'load_seconds', 0.0):.1f} s (not part of the run's figures)")
    return impl


def load_scenario_or_fail(path_or_name: str, release: str = DEFAULT_RELEASE):
    """The scenario a SCENARIO argument names (a file, or a shipped example's
    name), modelling `release` unless its config names one; a UsageError (one
    line) when it cannot be read."""
    from schedspec.reference.example_files import resolve_scenario_path
    from schedspec.reference.scenario import ScenarioError, load_scenario

    try:
        return load_scenario(resolve_scenario_path(path_or_name), release)
    except ScenarioError as e:
        raise UsageError(str(e)) from None


def add_time_model_arguments(parser: argparse.ArgumentParser) -> None:
    """`--step-ms` and `--token-ms`: the step-time model of reference/metrics.py."""
    parser.add_argument("--step-ms", type=float_arg(0.0, 1e9, lo_open=True), default=20.0, metavar="MS",
                        help="step-time model for the ms figures: milliseconds per step (default 20, more than 0)")
    parser.add_argument("--token-ms", type=float_arg(0.0, 1e9), default=0.0, metavar="MS",
                        help="step-time model: extra milliseconds per scheduled token (default 0)")


__all__ = ["Parser", "add_time_model_arguments", "load_impl_or_fail", "load_scenario_or_fail", "run_parsed",
           "standalone_main"]
