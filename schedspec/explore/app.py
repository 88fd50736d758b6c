"""The explorer's web app (starlette): the page's static files and its JSON API.

    GET  /                    the page
    GET  /api/meta            config fields and defaults, properties, examples, limits,
                              the seed presets, and the scenario given on the command line
    GET  /api/example/{name}  a shipped example's scenario file
    POST /api/run             {"scenario": {...}} -> the spec's trace and per-step verdicts
    POST /api/compare         {"scenario": {...}, "configs": [{...}, ...]} -> one result per config
    POST /api/seed            {"D", "P", "B", "M", "policy", "chunked", "steps"} -> the seeds'
                              scenario, its closed form, what the spec did

Errors are HTTP 4xx with {"error": one line, "field": "config.max_num_seqs" or null}.
The app keeps no state between calls and writes no file: exports are downloads
the browser saves where the user says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from . import core

STATIC_DIR = Path(__file__).parent / "static"


def _error(e: core.ApiError) -> JSONResponse:
    return JSONResponse({"error": core.one_line(str(e)), "field": e.field}, status_code=e.status)


async def _body(request: Request) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > core.MAX_BODY_BYTES:
        raise core.ApiError(f"request body: {declared} bytes; the explorer accepts at most "
                            f"{core.MAX_BODY_BYTES}", "body", status=413)
    raw = b""
    async for chunk in request.stream():  # counted as it arrives: the header may lie or be absent
        raw += chunk
        if len(raw) > core.MAX_BODY_BYTES:
            raise core.ApiError(f"request body: more than {core.MAX_BODY_BYTES} bytes, the explorer's "
                                "limit", "body", status=413)
    from ..reference.scenario import ScenarioError, parse_scenario_bytes

    try:
        # The scenario file reader's JSON rules: UTF-8, no NaN, no duplicate keys,
        # bounded nesting and integer sizes, so no body can raise past this point.
        return parse_scenario_bytes(raw)
    except ScenarioError as e:
        raise core.ApiError(f"request body: {e}", "body") from None


def _member(body: Any, key: str) -> Any:
    if not isinstance(body, dict) or key not in body:
        raise core.ApiError(f"request body: must be an object with {key!r}", "body")
    return body[key]


def _endpoint(work: Callable[[Any], Any]):
    async def endpoint(request: Request) -> Response:
        try:
            body = await _body(request)
            # The spec run is CPU work; a thread keeps the server answering meanwhile.
            return JSONResponse(await run_in_threadpool(work, body))
        except core.ApiError as e:
            return _error(e)
    return endpoint


LOCAL_HOSTS = ("127.0.0.1", "localhost")


def create_app(initial: dict[str, Any] | None = None, allowed_hosts: tuple[str, ...] = LOCAL_HOSTS) -> Starlette:
    """`initial`: a scenario file's JSON that the page opens with (may be invalid:
    the page shows its errors next to the fields).  Requests naming another host
    are refused, so a web page elsewhere cannot reach the API by DNS rebinding."""

    async def index(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    async def meta(request: Request) -> Response:
        return JSONResponse(core.meta(initial))

    async def example(request: Request) -> Response:
        try:
            return JSONResponse(core.example_json(request.path_params["name"]))
        except core.ApiError as e:
            return _error(e)

    routes = [
        Route("/", index),
        Route("/api/meta", meta),
        Route("/api/example/{name}", example),
        Route("/api/run", _endpoint(lambda b: core.run_json(_member(b, "scenario"))), methods=["POST"]),
        Route("/api/compare", _endpoint(
            lambda b: {"results": core.compare(_member(b, "scenario"), _member(b, "configs"))}), methods=["POST"]),
        Route("/api/seed", _endpoint(core.seed), methods=["POST"]),
        Route("/api/load", _endpoint(lambda b: {"scenario": core.load_text(_member(b, "name"), _member(b, "text"))}),
              methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))])
