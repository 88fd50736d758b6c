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

Only the page this server served may POST (each POST runs the spec, so any web
page the user has open could otherwise make the machine compute, and a
`text/plain` form post needs no CORS preflight): a POST whose Origin is not the
server's own, or whose Sec-Fetch-Site says it comes from another site, is
refused with 403, and so is one without the token the server made when it
started and wrote into the page it serves (X-Schedspec-Token).  The Host check
keeps DNS rebinding out of every route.
"""

from __future__ import annotations

import html
import secrets
from pathlib import Path
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
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
    from schedspec.reference.scenario import ScenarioError, parse_scenario_bytes

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
TOKEN_HEADER = "X-Schedspec-Token"
TOKEN_META = '<meta name="schedspec-token" content="">'  # index.html's slot for the token
SAFE_METHODS = ("GET", "HEAD")


class PostGuard:
    """Refuses, before any body is read, a request that changes or computes
    something (every method but GET and HEAD) unless it comes from this
    server's own page: same origin, and carrying the server's token."""

    def __init__(self, app, token: str, hosts: tuple[str, ...]):
        self.app, self.token, self.hosts = app, token, hosts

    def own_origins(self, scope) -> list[str]:
        port = (scope.get("server") or (None, None))[1]  # the socket's port, whatever Host says
        origins = [f"http://{h}:{port}" for h in self.hosts]
        if port == 80:  # a browser leaves the default port out of Origin
            origins += [f"http://{h}" for h in self.hosts]
        return origins

    def refusal(self, scope) -> str | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        own = self.own_origins(scope)
        if origin is not None and origin not in own:
            return (f"request refused: it comes from {core.one_line(origin)[:200]}, not from this server's "
                    f"page ({own[0]}); the explorer's API answers only its own page")
        site = headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return (f"request refused: the browser marks it {core.one_line(site)[:40]} (Sec-Fetch-Site); "
                    "the explorer's API answers only its own page")
        given = headers.get(TOKEN_HEADER.lower())
        if given is None or not secrets.compare_digest(given.encode("utf-8", "replace"), self.token.encode()):
            why = "no" if given is None else "a wrong"
            return (f"request refused: {why} {TOKEN_HEADER} header; reload the page (the server makes a "
                    "new token each time it starts)")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            why = self.refusal(scope)
            if why is not None:
                await JSONResponse({"error": why, "field": None}, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def index_html(token: str) -> str:
    page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    if TOKEN_META not in page:  # the page could not send a POST the guard accepts
        raise RuntimeError(f"{STATIC_DIR / 'index.html'}: no {TOKEN_META} to put the token in")
    return page.replace(TOKEN_META, f'<meta name="schedspec-token" content="{html.escape(token)}">', 1)


def create_app(initial: dict[str, Any] | None = None, allowed_hosts: tuple[str, ...] = LOCAL_HOSTS,
               token: str | None = None) -> Starlette:
    """`initial`: a scenario file's JSON that the page opens with (may be invalid:
    the page shows its errors next to the fields).  Requests naming another host
    are refused, so a web page elsewhere cannot reach the API by DNS rebinding.
    `token`: the one POSTs must carry; a fresh random one when not given."""
    token = token if token is not None else secrets.token_urlsafe(32)

    async def index(request: Request) -> Response:
        return HTMLResponse(index_html(token), headers={"Cache-Control": "no-store"})

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
    return Starlette(routes=routes, middleware=[
        Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)),
        Middleware(PostGuard, token=token, hosts=allowed_hosts),
    ])
