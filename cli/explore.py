"""`schedspec explore [SCENARIO] [--port N] [--no-browser]`: the interactive page.

Serves cli/page/ on 127.0.0.1 only and opens it in the browser.  The
page runs every scenario on the spec through the server, so what it shows is
what `schedspec run` and `schedspec check` print.  Ctrl-C stops the server.
"""

from __future__ import annotations

import errno
import json
import socket
import sys
import threading
import time

from schedspec.reference.errors import UsageError

from .args import int_arg
from schedspec.reference.example_files import resolve_scenario_path

HOST = "127.0.0.1"  # never another interface: the API runs whatever scenario it is sent
DEFAULT_PORT = 8765


def _initial(path_or_name: str | None):
    if path_or_name is None:
        return None
    from schedspec.reference.scenario import ScenarioError, load_scenario

    path = resolve_scenario_path(path_or_name)
    try:
        load_scenario(path)  # the file's structure, worded as `schedspec run` words it
    except ScenarioError as e:
        raise UsageError(str(e)) from None
    # The raw object, not the parsed one: a config vLLM would reject still opens,
    # with its errors next to the fields, so it can be fixed in the page.
    with open(path) as f:
        return json.load(f)


def _bind(port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise UsageError(f"--port: = {port}, must be in [0, 65535] (0 picks a free port)")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as e:
        sock.close()
        why = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound: {e.strerror or e}"
        raise UsageError(f"--port: {HOST}:{port} {why}; choose another port, or --port 0 for a free one") from None
    sock.listen(128)
    return sock


def _open_when_ready(server, url: str) -> None:
    import webbrowser

    def wait_then_open() -> None:
        for _ in range(200):
            if server.started:
                if not webbrowser.open(url):
                    print(f"could not open a browser; open {url} yourself", flush=True)
                return
            if server.should_exit:
                return
            time.sleep(0.05)

    threading.Thread(target=wait_then_open, daemon=True).start()


def cmd_explore(args) -> int:
    initial = _initial(args.scenario)
    try:
        import uvicorn

        from .page.app import create_app
    except ImportError as e:
        raise UsageError(f"explore needs starlette and uvicorn ({e}); reinstall schedspec: "
                         "pip install -e .") from None
    sock = _bind(args.port)
    port = sock.getsockname()[1]
    url = f"http://{HOST}:{port}/"
    config = uvicorn.Config(create_app(initial), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    print(f"schedspec explore: serving {url}  (Ctrl-C stops it)", flush=True)
    if not args.no_browser:
        _open_when_ready(server, url)
    try:
        # uvicorn turns Ctrl-C into a graceful shutdown, then raises it again once
        # stopped; here Ctrl-C is the normal way to stop, so it ends with status 0.
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    print("schedspec explore: stopped", flush=True)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "explore", help="the interactive page in a browser: the starvation knobs (decodes D, prompt P, budget B, max_num_seqs M), any scenario, step by step",
        description="Start a local web server on 127.0.0.1 and open the explorer page: the "
                    "starvation problem (D running decodes, a P-token prompt, token budget B, max_num_seqs M) with its closed form, any scenario file with its config editable, "
                    "the step timeline, every property's verdict per step, configs side by side. "
                    "Every number comes from the spec. Ctrl-C stops the server.")
    p.add_argument("scenario", nargs="?", metavar="SCENARIO",
                   help="a scenario file or a shipped example's name to open with (optional)")
    p.add_argument("--port", type=int_arg(0, 65535), default=DEFAULT_PORT,
                   help=f"port on 127.0.0.1 (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--no-browser", action="store_true", help="print the URL, do not open a browser")
    p.set_defaults(func=cmd_explore)


def main(argv: list[str] | None = None) -> int:
    from .common import standalone_main

    return standalone_main("explore", register, argv)


if __name__ == "__main__":
    sys.exit(main())
