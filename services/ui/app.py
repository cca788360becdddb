"""The robotloop dashboard: fleet, releases, training runs, datasets and loop reports in the browser.

Pages are Jinja templates (autoescaped) holding no data; `static/app.js` fills them from the JSON routes below
with `textContent` only, and polls them for live updates. What the routes answer comes from
:class:`robotloop.ui.Dashboard`, which reads the services through their clients::

    GET  /, /fleet, /releases, /releases/{name}, /runs, /runs/{id}, /datasets, /reports, /reports/{id}   pages
    POST /api/session           {"token"} -> {"write"}: sets the session cookie (the token never comes back)
    GET  /api/session           {"write"} or 401;  DELETE /api/session: log out
    GET  /api/fleet             channels, releases, robots, recent events
    GET  /api/releases          per channel its release and history; every release
    GET  /api/releases/{name}   files, lineage (run, datasets, episodes with Xet hashes), robots, evaluations
    POST /api/channels/{c}/promote   {"release", "reason"}   (write sessions, same origin)
    POST /api/channels/{c}/rollback  {"reason"}              (write sessions, same origin)
    POST /api/robots/{r}/rollback    {"reason"}              (write sessions, same origin)
    GET  /api/runs, /api/runs/{id}?after=S, /api/checkpoints?output=URL
    GET  /api/buckets, /api/datasets?bucket=URL, /api/dataset?url=URL, /api/episode?url=URL&index=I
    GET  /api/reports[?run=URL] (a training run's loop reports: beside it in its bucket, or in the report
                                 folders), /api/reports/{id}
    GET  /media/bucket?url=URL  an mp4 from a bucket, by HTTP Range (proxied: only the bytes asked for travel)
    GET  /media/report/{id}/{name}   a figure or rollout video of a loop report (in a bucket or a folder)

Security: every route but the pages and /static needs a session (an HttpOnly, SameSite=Strict cookie holding a
random id, made by POST /api/session from a token of the tokens file) or ``Authorization: Bearer <token>``. The
token itself is never put in a URL, a cookie or a log. Write routes (and the login) need the header
``X-Robotloop-UI: 1``, which no cross-site form can send and no cross-site script may send without the
preflight this app never answers, plus a same-origin ``Origin``/``Sec-Fetch-Site`` when the browser sends them;
promote and roll back need a write token. A Content-Security-Policy allows only this origin's scripts.

Example::

    robotloop ui --tokens ui.tokens --port 8790 --reports loop-report --namespace lab
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

from fastapi import Body, Depends, FastAPI, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from robotloop.auth import WILDCARD, Forbidden, TokenStore, Unauthorized, bearer_from_header
from robotloop.config import Settings
from robotloop.errors import CATEGORY_STATUS, BadValue, lookup
from robotloop.service_client import ServiceError
from robotloop.storage import BucketUrl, StorageError
from robotloop.ui import Dashboard, DatasetViews
from services import ranges
from services.errors import error_response, json_errors
from services.limits import BodyLimit
from services.ranges import RangeNotSatisfiable
from services.serve import serve_app
from services.ui import UiOptions

log = logging.getLogger("robotloop.ui")
HERE = Path(__file__).parent
COOKIE = "robotloop_ui"
SESSION_S = 12 * 3600
CSRF_HEADER = "x-robotloop-ui"
MAX_RANGE_BYTES = 2 * 2**20  # one answer to an open-ended video range: the browser asks for the rest as it plays
MAX_BODY_BYTES = 64 * 1024
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; media-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
PAGES = {
    "/": "fleet",
    "/fleet": "fleet",
    "/releases": "releases",
    "/runs": "runs",
    "/datasets": "datasets",
    "/reports": "reports",
}


@dataclass(frozen=True)
class Viewer:
    """Who is looking: a session (or a bearer token) and whether it may promote and roll back."""

    write: bool

    def require_write(self) -> None:
        if not self.write:
            raise Forbidden("this token is read-only; promoting and rolling back need a 'write' token")


class Sessions:
    """Session ids (random, in the cookie) to what their token may do; the tokens themselves are not kept."""

    def __init__(self, ttl_s: float = SESSION_S) -> None:
        self.ttl_s, self._ids, self._lock = ttl_s, {}, threading.Lock()

    def open(self, write: bool) -> str:
        sid = secrets.token_urlsafe(32)
        with self._lock:
            now = time.monotonic()
            self._ids = {k: v for k, v in self._ids.items() if v[1] > now}  # forget expired ones
            self._ids[sid] = (write, now + self.ttl_s)
        return sid

    def get(self, sid: str | None) -> Viewer | None:
        with self._lock:
            found = self._ids.get(sid or "")
        return Viewer(found[0]) if found and found[1] > time.monotonic() else None

    def close(self, sid: str | None) -> None:
        with self._lock:
            self._ids.pop(sid or "", None)


def check_token(tokens: TokenStore, token: str) -> Viewer:
    """The viewer a token of the tokens file makes. Raises Unauthorized (unknown) or Forbidden (scoped)."""
    who = tokens.principal(token)
    if who.anonymous:
        raise Unauthorized("a token is required")
    if who.namespace != WILDCARD:  # the dashboard shows every namespace the services show it
        raise Forbidden("the dashboard's tokens are '<token> <read|write> *' lines")
    return Viewer(write=who.write)


def viewer(request: Request) -> Viewer:
    """The session's (or bearer token's) viewer. Raises Unauthorized: neither, or an expired session."""
    token = bearer_from_header(request.headers.get("authorization"))
    if token:
        return check_token(request.app.state.tokens, token)
    found = request.app.state.sessions.get(request.cookies.get(COOKIE))
    if found is None:
        raise Unauthorized("sign in with a dashboard token")
    return found


def same_origin(request: Request) -> None:
    """The CSRF guard of every state-changing route (see the module docstring). Raises Forbidden."""
    if request.headers.get(CSRF_HEADER) != "1":
        raise Forbidden(f"missing the {CSRF_HEADER} header: changes come from the dashboard's own pages")
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise Forbidden(f"a cross-site request ({site}) may not change anything")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        raise Forbidden("a request from another origin may not change anything")


Who = Annotated[Viewer, Depends(viewer)]
Guarded = Depends(same_origin)


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """`[start, end)` of a video request's `Range` (`services.ranges`), an open end clipped to MAX_RANGE_BYTES;
    None for no header or one this does not serve: then the whole file goes, as RFC 9110 lets a server answer.

    Raises:
        RangeNotSatisfiable: a range past the end of the file.
    """
    try:
        byte_range = ranges.parse_range(header)
    except RangeNotSatisfiable:
        return None
    return None if byte_range is None else ranges.span(byte_range, size, MAX_RANGE_BYTES)


def create_app(settings: Settings, tokens_file: Path | str, dashboard: Dashboard | None = None) -> FastAPI:
    """The dashboard app; `dashboard` reads the services (default: one over `settings`).

    Raises:
        TokensFileError: a missing or malformed tokens file.
    """
    tokens = TokenStore.from_file(Path(tokens_file))
    board = dashboard or Dashboard(settings)
    namespaces = list(settings.ui.namespaces)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The datasets page reads episodes with the trainer's catalog, which imports torch (seconds), and plots
        # them with pyarrow.dataset, which imports pandas: import both now, beside serving, so that the first
        # dataset shown does not wait for them.
        threading.Thread(target=_import_catalog, name="robotloop-ui-warmup", daemon=True).start()
        yield

    # Its schema as every service's (no docs page: Swagger's assets would come from a CDN); the routes it lists
    # still need a session.
    app = FastAPI(
        title="robotloop dashboard", docs_url=None, redoc_url=None, openapi_url="/openapi.json", lifespan=lifespan
    )
    app.state.tokens, app.state.sessions, app.state.board = tokens, Sessions(), board
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    templates = Jinja2Templates(directory=HERE / "templates")  # autoescape on for .html
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    @app.middleware("http")
    async def headers(request: Request, call_next):
        response = await call_next(request)
        response.headers.setdefault("content-security-policy", CSP)
        response.headers.setdefault("x-content-type-options", "nosniff")
        response.headers.setdefault("referrer-policy", "no-referrer")
        if request.url.path.startswith(("/api/", "/media/")):
            response.headers.setdefault("cache-control", "no-store")
        return response

    def page(request: Request, name: str, **context: Any) -> HTMLResponse:
        return templates.TemplateResponse(request, f"{name}.html", {"page": name, **context})

    def static_page(name: str):
        def show(request: Request) -> HTMLResponse:
            return page(request, name)

        return show

    for path, name in PAGES.items():
        app.add_api_route(path, static_page(name), methods=["GET"], include_in_schema=False)

    @app.get("/releases/{name}", include_in_schema=False)
    def release_page(request: Request, name: str) -> HTMLResponse:
        return page(request, "release", item=name)

    @app.get("/runs/{job_id}", include_in_schema=False)
    def run_page(request: Request, job_id: str) -> HTMLResponse:
        return page(request, "run", item=job_id)

    @app.get("/reports/{report_id}", include_in_schema=False)
    def report_page(request: Request, report_id: str) -> HTMLResponse:
        return page(request, "report", item=report_id)

    @app.get("/api/health")
    def health() -> dict[str, Any]:
        return {"status": "ok"}

    # -- sessions ------------------------------------------------------------------------------------------
    @app.post("/api/session", dependencies=[Guarded])
    def login(request: Request, token: Annotated[str, Body(embed=True, max_length=512)]) -> JSONResponse:
        who = check_token(tokens, token.strip())
        response = JSONResponse({"write": who.write})
        response.set_cookie(
            COOKIE,
            app.state.sessions.open(who.write),
            max_age=SESSION_S,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    @app.get("/api/session")
    def session(who: Who) -> dict[str, Any]:
        return {"write": who.write}

    @app.delete("/api/session", dependencies=[Guarded])
    def logout(request: Request) -> JSONResponse:
        app.state.sessions.close(request.cookies.get(COOKIE))
        response = JSONResponse({"ok": True})
        response.delete_cookie(COOKIE, path="/")
        return response

    # -- fleet and releases --------------------------------------------------------------------------------
    @app.get("/api/fleet")
    def fleet(who: Who) -> dict[str, Any]:
        return board.fleet.overview()

    @app.get("/api/releases")
    def releases(who: Who) -> dict[str, Any]:
        return board.fleet.releases()

    @app.get("/api/releases/{name}")
    def release(name: str, who: Who) -> dict[str, Any]:
        return board.fleet.release(name)

    @app.post("/api/channels/{channel}/promote", dependencies=[Guarded])
    def promote(
        channel: str,
        who: Who,
        release: Annotated[str, Body(max_length=200)],
        reason: Annotated[str, Body(max_length=2000)] = "",
    ) -> dict[str, Any]:
        who.require_write()
        log.warning("dashboard: promote %s to %s (%s)", release, channel, reason)
        return board.fleet.promote(channel, release, reason)

    @app.post("/api/channels/{channel}/rollback", dependencies=[Guarded])
    def rollback_channel(
        channel: str, who: Who, reason: Annotated[str, Body(embed=True, max_length=2000)] = ""
    ) -> dict[str, Any]:
        who.require_write()
        log.warning("dashboard: roll back channel %s (%s)", channel, reason)
        return board.fleet.rollback(channel, None, reason)

    @app.post("/api/robots/{robot}/rollback", dependencies=[Guarded])
    def rollback_robot(
        robot: str, who: Who, reason: Annotated[str, Body(embed=True, max_length=2000)] = ""
    ) -> dict[str, Any]:
        who.require_write()
        log.warning("dashboard: roll back robot %s (%s)", robot, reason)
        return board.fleet.rollback(None, robot, reason)

    # -- training ------------------------------------------------------------------------------------------
    @app.get("/api/runs")
    def runs(who: Who) -> dict[str, Any]:
        return {"jobs": board.runs.jobs()}

    @app.get("/api/runs/{job_id}")
    def run(job_id: str, who: Who, after: Annotated[int, Query(ge=-1)] = -1) -> dict[str, Any]:
        return board.runs.job(job_id, after)

    @app.get("/api/checkpoints")
    def checkpoints(who: Who, output: str) -> dict[str, Any]:
        return {"checkpoints": board.runs.checkpoints(output)}

    # -- datasets ------------------------------------------------------------------------------------------
    @app.get("/api/buckets")
    def buckets(who: Who) -> dict[str, Any]:
        return {"namespaces": namespaces, "buckets": board.data.buckets(namespaces)}

    @app.get("/api/datasets")
    def datasets(who: Who, bucket: str) -> dict[str, Any]:
        return {"bucket": bucket, "datasets": board.data.datasets(bucket)}

    @app.get("/api/dataset")
    def dataset(who: Who, url: str) -> dict[str, Any]:
        return board.data.dataset(url)

    @app.get("/api/episode")
    def episode(who: Who, url: str, index: Annotated[int, Query(ge=0)]) -> dict[str, Any]:
        return board.data.episode(url, index)

    @app.get("/media/bucket")
    def bucket_video(request: Request, who: Who, url: str) -> Response:
        if not BucketUrl.parse(url).path.endswith(".mp4"):
            raise BadValue("only a dataset's mp4 videos are served here")
        entry = board.data.file_entry(url)
        span = parse_range(request.headers.get("range"), entry.size)
        common = {"accept-ranges": "bytes", "etag": f'"{entry.xet_hash}"', "cache-control": "private, max-age=60"}
        if span is None:
            chunks = _chunks(board.data, url, entry.size)
            return StreamingResponse(
                chunks, media_type="video/mp4", headers={**common, "content-length": str(entry.size)}
            )
        start, end = span
        body = board.data.read_range(url, start, end)
        return Response(
            body,
            status_code=206,
            media_type="video/mp4",
            headers={**common, "content-range": f"bytes {start}-{start + len(body) - 1}/{entry.size}"},
        )

    # -- reports -------------------------------------------------------------------------------------------
    @app.get("/api/reports")
    def reports(who: Who, run: str | None = None) -> dict[str, Any]:
        if run is not None:  # a training run's page: its loop reports only
            return {"reports": board.runs.reports(run), "evaluations": []}
        return {"reports": board.runs.reports(), "evaluations": board.runs.evaluations()}

    @app.get("/api/reports/{report_id}")
    def report(report_id: str, who: Who) -> dict[str, Any]:
        found = board.runs.report(report_id)
        return {**found, "html": render_markdown(found["markdown"], report_id)}

    # One path segment: a report's files are addressed by name alone. (Starlette's `path` convertor is `.*`,
    # which stops at a newline: such a path then matched no route and got 404 before the session check.)
    @app.get("/media/report/{report_id}/{name}")
    def report_file(report_id: str, name: str, who: Who) -> FileResponse:
        path = board.runs.report_file(report_id, name)  # a bucket report's file is its read-cache entry: no suffix
        return FileResponse(path, media_type="video/mp4" if name.endswith(".mp4") else "image/png")

    json_errors(app)

    async def backend_error(request: Request, err: ServiceError) -> JSONResponse:
        # A service's refusal (a read-only deploy token, an unknown release) keeps its 4xx; no answer is a 502.
        status = err.status if 400 <= err.status < 500 and err.status != 401 else 502
        return error_response(status, str(err))

    async def storage_error(request: Request, err: StorageError) -> JSONResponse:
        # The bucket server's refusal keeps its category's status (a URL the page asked for that holds no file is
        # a 404, not the 502 the storing services answer with); its failure or silence is a 502.
        status = lookup(err, CATEGORY_STATUS)
        return error_response(status if 400 <= status < 500 and status != 401 else 502, str(err))

    app.add_exception_handler(ServiceError, backend_error)
    app.add_exception_handler(StorageError, storage_error)
    return app


def render_markdown(text: str, report_id: str) -> str:
    """A report's Markdown as HTML: raw HTML in it is escaped (markdown-it's html=False), links are checked by
    markdown-it, and images point at this report's own files."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(text)
    for token in tokens:
        for child in token.children or []:
            if child.type == "image":
                name = str(child.attrGet("src") or "").rsplit("/", 1)[-1]
                child.attrSet("src", f"/media/report/{quote(report_id)}/{quote(name)}")
    return md.renderer.render(tokens, md.options, {})


def _import_catalog() -> None:
    import pyarrow.dataset  # noqa: F401 - pq.read_table's (an episode's plot), which imports pandas

    from robotloop.ui.datasets import dataset_source_class

    dataset_source_class()


def _chunks(data: DatasetViews, url: str, size: int, chunk: int = MAX_RANGE_BYTES):
    for start in range(0, size, chunk):
        yield data.read_range(url, start, min(size, start + chunk))


def serve(options: UiOptions, settings: Settings) -> None:
    """Run the dashboard with uvicorn until interrupted; options left None come from `settings.ui`.

    Raises:
        ValueError: no tokens file (there is no open mode: the pages show the whole fleet).
        TokensFileError: a malformed or missing tokens file. PortInUse: a busy port.
    """
    cfg = settings.ui
    update: dict[str, Any] = {}
    if options.reports:
        update["reports"] = list(options.reports)
    if options.namespaces:
        update["namespaces"] = list(options.namespaces)
    settings = settings.model_copy(update={"ui": cfg.model_copy(update=update)})
    tokens_file = options.tokens or cfg.tokens_file
    if tokens_file is None:
        raise BadValue("the dashboard needs viewer tokens: pass --tokens FILE ('<token> <read|write> *' per line)")
    host, port = options.host or cfg.host, options.port or cfg.port
    app = create_app(settings, tokens_file)
    serve_app(app, host, port, log, f"robotloop dashboard on http://{host}:{port}")
