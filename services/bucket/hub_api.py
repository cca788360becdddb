"""Hub-compatible bucket API: the HTTP routes unmodified ``huggingface_hub`` 1.x calls.

Thin layer: parse the request, authorize with :class:`TokenStore`, call :class:`BucketStore`,
and shape the JSON/headers exactly as ``huggingface_hub`` parses them. Errors follow the Hub
conventions the client relies on: a JSON body ``{"error": msg}`` plus ``X-Error-Message`` and,
where the client branches on it, ``X-Error-Code`` (``RepoNotFound`` -> ``BucketNotFoundError``,
``EntryNotFound`` -> ``RemoteEntryNotFoundError``).

Route table (client method -> route):

=============================================  =====================================================
``whoami``                                     ``GET  /api/whoami-v2``
``create_bucket``                              ``POST /api/buckets/{ns}/{name}``  (``ns`` may be ``me``)
``list_buckets``                               ``GET  /api/buckets/{ns}?search=&cursor=`` (Link paging)
``bucket_info``                                ``GET  /api/buckets/{ns}/{name}``
``delete_bucket``                              ``DELETE /api/buckets/{ns}/{name}``
``update_bucket_settings``                     ``PUT  /api/buckets/{ns}/{name}/settings``
``move_bucket``                                ``POST /api/repos/move`` (``type == "bucket"`` only)
``list_bucket_tree``                           ``GET  /api/buckets/{ns}/{name}/tree[/{prefix}]?recursive=&cursor=``
``get_bucket_paths_info``                      ``POST /api/buckets/{ns}/{name}/paths-info``
``batch_bucket_files``                         ``POST /api/buckets/{ns}/{name}/batch`` (NDJSON)
hf_xet token refresh (uploads / downloads)     ``GET  /api/buckets/{ns}/{name}/xet-{read,write}-token``
``get_bucket_file_metadata`` / HfFileSystem    ``HEAD|GET /buckets/{ns}/{name}/resolve/{path}`` (Range)
=============================================  =====================================================
"""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from robotloop.auth import AuthError, Principal, TokenStore, Unauthorized, bearer_from_header
from robotloop.errors import RobotloopError
from robotloop.storage.server.buckets import (
    PAGE_SIZE,
    AddFile,
    BatchRejected,
    BucketError,
    BucketExists,
    BucketNotFound,
    BucketRecord,
    BucketStore,
    CopyFile,
    DeleteFile,
    EntryNotFound,
    FileRecord,
    FolderRecord,
    Operation,
    tree_cursor,
)
from robotloop.storage.server.cas import CasError
from services.errors import http_status
from services.ranges import byte_position

FileReader = Callable[[str, int, int], Iterator[bytes]]
"""``read(xet_hash, start, end_exclusive) -> byte chunks`` of a stored file (from the CAS)."""

CasUrlFn = Callable[[Request], str]
"""Base URL that hf_xet must use for the CAS API, given the incoming request."""

_RANGE_RE = re.compile(r"^bytes=([0-9]*)-([0-9]*)$")
# huggingface_hub sends at most 1,000 operations (or paths) per request; ten times that is plenty.
MAX_BATCH_OPS = 10_000
MAX_BATCH_BYTES = 16 * 2**20
MAX_JSON_BYTES = 4 * 2**20


class HubError(Exception):
    """An error already shaped for the client: HTTP status, message, optional X-Error-Code."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def error_response(status: int, message: str, code: str | None = None, headers: dict | None = None) -> JSONResponse:
    """JSON error in the Hub's shape; header values are made latin-1 safe (paths may be unicode)."""
    text = message.encode("ascii", "backslashreplace").decode()
    safe = "".join(c if " " <= c <= "~" else " " for c in text)  # no control byte (NUL, CR, LF) in a header
    out = {"X-Error-Message": safe, **(headers or {})}
    if code:
        out["X-Error-Code"] = code
    return JSONResponse({"error": message}, status_code=status, headers=out)


def _hub_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn store/auth exceptions into Hub-shaped error responses (routers cannot own exception handlers).

    Works for sync and async route functions (FastAPI inspects the wrapper, so it must stay a
    coroutine function for async routes and a plain one for sync routes, which run in a thread).
    """
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - re-raised below unless it is one of ours
                return _as_response(err)

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            return _as_response(err)

    return wrapper


def _as_response(err: Exception) -> Response:
    """Map a known error to its response in the Hub's shape; re-raise anything else (a bug -> 500 in the logs)."""
    if isinstance(err, HubError):
        return error_response(err.status, err.message, err.code)
    if isinstance(err, BatchRejected):  # the Hub lists each failure under "failed", without the header
        return JSONResponse({"error": str(err), "failed": err.failures}, status_code=http_status(err))
    if isinstance(err, RobotloopError):
        return error_response(http_status(err), str(err), _HUB_CODES.get(type(err)))
    raise err


# The Hub's X-Error-Code values: huggingface_hub raises RepositoryNotFoundError / EntryNotFoundError on them.
_HUB_CODES = {BucketNotFound: "RepoNotFound", EntryNotFound: "EntryNotFound"}


def iso(ts: float | None) -> str | None:
    """Unix seconds -> the Hub's ``2024-09-25T15:31:02.346Z`` format."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def bucket_json(b: BucketRecord) -> dict[str, Any]:
    """``BucketInfo`` JSON (``id, private, createdAt, size, totalFiles``)."""
    return {
        "id": b.id,
        "private": b.private,
        "createdAt": iso(b.created_at),
        "size": b.size,
        "totalFiles": b.total_files,
    }


def entry_json(e: FileRecord | FolderRecord) -> dict[str, Any]:
    """``BucketFile`` / ``BucketFolder`` JSON."""
    if isinstance(e, FolderRecord):
        return {"type": "directory", "path": e.path, "uploadedAt": iso(e.uploaded_at)}
    mtime = e.mtime_ms / 1000 if e.mtime_ms is not None else e.uploaded_at
    out = {
        "type": "file",
        "path": e.path,
        "size": e.size,
        "xetHash": e.xet_hash,
        "mtime": iso(mtime),
        "uploadedAt": iso(e.uploaded_at),
    }
    if e.content_type:
        out["contentType"] = e.content_type
    return out


def loads_text(raw: bytes) -> Any:
    """A request's JSON, every string in it (object keys too) Unicode text.

    JSON lets a string escape a lone UTF-16 surrogate (`"\\ud800"`), and Python's parser decodes raw surrogate bytes
    too; such a string is no text: SQLite, a header or the JSON of the answer cannot carry it, so it is refused
    here, where the request is read, rather than failing deep in a handler.

    Raises:
        ValueError: not JSON (JSONDecodeError), or a string holding a lone surrogate (named in the message).
        RecursionError: nested deeper than the parser goes.
    """
    value = json.loads(raw)
    pending = [value]
    while pending:  # a loop, not recursion: the parser already went as deep as Python's stack allows
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"string {item[:60]!r} holds a lone UTF-16 surrogate: it is not text") from None
        elif isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return value


def parse_batch(body: bytes) -> list[Operation]:
    """Parse the NDJSON body of ``/batch`` into operations.

    Raises:
        HubError(400): invalid JSON, a string that is no text (a lone surrogate), unknown ``type``, or missing
            fields (message names the line).
        HubError(413): more than MAX_BATCH_OPS lines.
    """
    if body.count(b"\n") >= MAX_BATCH_OPS:  # counted before any parsing: each line becomes Python objects
        raise HubError(413, f"a batch holds at most {MAX_BATCH_OPS} operations; split it")
    ops: list[Operation] = []
    for lineno, line in enumerate(body.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = loads_text(line)
            ops.append(_operation(item))
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as err:  # 1e400 sizes, deep nesting
            raise HubError(400, f"batch line {lineno}: {type(err).__name__}: {err}") from None
    return ops


# Milliseconds since 1970 up to the end of year 9999: what the listings can turn back into dates.
MAX_MTIME_MS = 253_402_300_799_999
MAX_SIZE = 2**53  # file sizes the JSON clients read exactly


def _operation(item: dict[str, Any]) -> Operation:
    """One batch line as an operation, every field checked for type and range here: the store keeps nothing that a
    later listing or read could not serve (a year-10000 mtime broke every listing of its bucket)."""
    if not isinstance(item, dict):
        raise TypeError(f"a batch line must be a JSON object, got {type(item).__name__}")
    kind, path = _field(item, "type", str), _field(item, "path", str)
    if kind == "deleteFile":
        return DeleteFile(path)
    mtime = item.get("mtime")
    mtime_ms = None if mtime is None else _number(mtime, "mtime", MAX_MTIME_MS)
    if kind == "addFile":
        size = item.get("size")
        content_type = item.get("contentType")
        if content_type is not None and not (
            isinstance(content_type, str)
            and 0 < len(content_type) <= 255
            and content_type.isascii()
            and content_type.isprintable()
        ):
            raise ValueError(f"'contentType' must be printable ASCII of at most 255 characters, got {content_type!r}")
        size_value = None if size is None else _number(size, "size", MAX_SIZE)
        return AddFile(path, _field(item, "xetHash", str), mtime_ms, size_value, content_type)
    if kind == "copyFile":
        source = _field(item, "sourceRepoType", str), _field(item, "sourceRepoId", str)
        return CopyFile(path, _field(item, "xetHash", str), *source, mtime_ms)
    raise ValueError(f"unknown operation type {kind!r} (expected addFile, copyFile or deleteFile)")


def _field(item: dict[str, Any], name: str, kind: type) -> Any:
    value = item[name]  # KeyError names a missing field
    if not isinstance(value, kind):
        raise TypeError(f"'{name}' must be a {kind.__name__}, got {type(value).__name__}")
    return value


def _number(value: Any, name: str, limit: int) -> int:
    """A whole number in [0, limit]; floats are accepted when whole (JSON has one number type)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or not 0 <= value <= limit:
        raise ValueError(f"'{name}' must be a number from 0 to {limit}, got {value!r}")
    return int(value)


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``Range`` header -> ``(start, end_exclusive)``; None means "whole file".

    Multi-range requests are answered with the whole file (allowed by RFC 9110).

    Raises:
        HubError(416): a syntactically valid but unsatisfiable range.
    """
    if not header:
        return None
    m = _RANGE_RE.match(header.strip())
    if m is None:
        return None
    first, last = m.groups()
    if not first and not last:
        return None
    if not first:  # suffix range: last N bytes
        n = byte_position(last)
        if n == 0:
            raise HubError(416, f"unsatisfiable range {header!r} for a {size}-byte file")
        return max(0, size - n), size
    start = byte_position(first)
    end = min(byte_position(last) + 1, size) if last else size
    if start >= size or end <= start:
        raise HubError(416, f"unsatisfiable range {header!r} for a {size}-byte file")
    return start, end


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def _next_link(request: Request, cursor: str) -> dict[str, str]:
    params = dict(request.query_params)
    params["cursor"] = cursor
    url = f"{_base_url(request)}{quote(request.url.path)}?{urlencode(params)}"
    return {"Link": f'<{url}>; rel="next"'}


class _Access:
    """Per-request authorization helpers shared by the routes."""

    def __init__(self, buckets: BucketStore, tokens: TokenStore) -> None:
        self.buckets, self.tokens = buckets, tokens

    @staticmethod
    def bearer(request: Request) -> str | None:
        return bearer_from_header(request.headers.get("authorization"))

    def namespace(self, request: Request, namespace: str) -> str:
        """Resolve the ``me`` alias to the caller's namespace."""
        if namespace != "me":
            return namespace
        who = self.tokens.principal(self.bearer(request))
        if who.name is None:
            raise Unauthorized("authentication required to use the 'me' namespace")
        return who.name

    def read(self, request: Request, namespace: str, name: str) -> BucketRecord:
        """The bucket, if the caller may read it.

        Missing and hidden buckets look alike to anonymous callers (401 RepoNotFound), so
        probing does not reveal which private buckets exist.
        """
        bucket = self.buckets.find_bucket(namespace, name)
        try:
            self.tokens.authorize(
                self.bearer(request), namespace, write=False, bucket_public=bool(bucket and not bucket.private)
            )
        except Unauthorized as err:
            if self.bearer(request) is None:  # anonymous: answer like the Hub does for hidden repos
                raise HubError(
                    401, f"bucket '{namespace}/{name}' not found or private: {err}", "RepoNotFound"
                ) from None
            raise
        if bucket is None:
            raise BucketNotFound(f"bucket '{namespace}/{name}' not found")
        return bucket

    def write(self, request: Request, namespace: str) -> Principal:
        """The caller, if it may write in ``namespace`` (checked before any existence test)."""
        return self.tokens.authorize(self.bearer(request), namespace, write=True, bucket_public=False)

    def can_read(self, request: Request, namespace: str, name: str) -> bool:
        try:
            self.read(request, namespace, name)
            return True
        except (HubError, BucketError, AuthError):
            return False


def hub_router(
    buckets: BucketStore,
    tokens: TokenStore,
    cas_base_url_fn: CasUrlFn,
    read_file: FileReader | None = None,
) -> APIRouter:
    """Build the Hub-compatible bucket routes (see module docstring for the table).

    Args:
        buckets: bucket metadata store.
        tokens: Hub-token checks and CAS-token minting.
        cas_base_url_fn: CAS base URL handed to hf_xet in the xet token responses.
        read_file: byte-range reader over the CAS, used by ``GET .../resolve/...``; without
            it, resolve GETs answer 501 (HEAD still works: it needs metadata only).
    """
    router = APIRouter()
    access = _Access(buckets, tokens)

    @router.get("/api/whoami-v2")
    @_hub_errors
    def whoami(request: Request) -> Any:
        who = tokens.principal(access.bearer(request))
        if who.anonymous:
            raise Unauthorized("Invalid credentials in Authorization header")
        role = "write" if who.write else "read"
        return {
            "type": "user",
            "id": who.name,
            "name": who.name,
            "fullname": who.name,
            "orgs": [],
            "auth": {"type": "access_token", "accessToken": {"displayName": "robotloop", "role": role}},
        }

    @router.post("/api/buckets/{namespace}/{name}")
    @_hub_errors
    async def create_bucket(request: Request, namespace: str, name: str) -> Any:
        body = await _json_body(request)
        private = body.get("private")
        return await run_in_threadpool(_create, request, namespace, name, True if private is None else bool(private))

    def _create(request: Request, namespace: str, name: str, private: bool) -> Any:
        namespace = access.namespace(request, namespace)
        access.write(request, namespace)
        url = f"{_base_url(request)}/buckets/{namespace}/{name}"
        try:
            bucket = buckets.create_bucket(namespace, name, private=private)
        except BucketExists as err:
            # create_bucket(exist_ok=True) reads "url" from the 409 body too.
            return JSONResponse({"error": str(err), "url": url}, status_code=409, headers={"X-Error-Message": str(err)})
        return {"url": url, "id": bucket.id, "name": bucket.id}

    @router.get("/api/buckets/{namespace}")
    @_hub_errors
    def list_buckets(request: Request, namespace: str, search: str | None = None, cursor: str | None = None) -> Any:
        namespace = access.namespace(request, namespace)
        page = buckets.list_buckets(namespace, search=search, after=cursor, limit=PAGE_SIZE)
        visible = [b for b in page if not b.private or access.can_read(request, namespace, b.name)]
        headers = _next_link(request, page[-1].name) if len(page) == PAGE_SIZE else {}
        return JSONResponse([bucket_json(b) for b in visible], headers=headers)

    @router.get("/api/buckets/{namespace}/{name}")
    @_hub_errors
    def bucket_info(request: Request, namespace: str, name: str) -> Any:
        return bucket_json(access.read(request, namespace, name))

    @router.delete("/api/buckets/{namespace}/{name}")
    @_hub_errors
    def delete_bucket(request: Request, namespace: str, name: str) -> Any:
        access.write(request, namespace)
        buckets.delete_bucket(namespace, name)
        return {"deleted": f"{namespace}/{name}"}

    @router.put("/api/buckets/{namespace}/{name}/settings")
    @_hub_errors
    async def update_settings(request: Request, namespace: str, name: str) -> Any:
        body = await _json_body(request)
        if not isinstance(body.get("private"), bool):
            raise HubError(400, 'settings body must be {"private": true|false}')
        return await run_in_threadpool(_set_private, request, namespace, name, body["private"])

    def _set_private(request: Request, namespace: str, name: str, private: bool) -> Any:
        access.write(request, namespace)
        buckets.set_private(namespace, name, private)
        return {"id": f"{namespace}/{name}", "private": private}

    @router.post("/api/repos/move")
    @_hub_errors
    async def move(request: Request) -> Any:
        body = await _json_body(request)
        if body.get("type") != "bucket":
            raise HubError(400, "this server hosts buckets only: 'type' must be 'bucket'")
        return await run_in_threadpool(_move, request, str(body.get("fromRepo", "")), str(body.get("toRepo", "")))

    def _move(request: Request, from_id: str, to_id: str) -> Any:
        (src_ns, _, src), (dst_ns, _, dst) = from_id.partition("/"), to_id.partition("/")
        access.write(request, src_ns)
        access.write(request, dst_ns)
        buckets.move_bucket(src_ns, src, dst_ns, dst)
        return {"url": f"{_base_url(request)}/buckets/{dst_ns}/{dst}"}

    @router.get("/api/buckets/{namespace}/{name}/tree")
    @router.get("/api/buckets/{namespace}/{name}/tree/{prefix:path}")
    @_hub_errors
    def tree(
        request: Request,
        namespace: str,
        name: str,
        prefix: str = "",
        recursive: bool = False,
        cursor: str | None = None,
    ) -> Any:
        access.read(request, namespace, name)
        entries = buckets.list_tree(namespace, name, prefix, recursive=recursive, after=cursor, limit=PAGE_SIZE)
        headers = _next_link(request, tree_cursor(entries[-1])) if len(entries) >= PAGE_SIZE else {}
        return JSONResponse([entry_json(e) for e in entries], headers=headers)

    @router.post("/api/buckets/{namespace}/{name}/paths-info")
    @_hub_errors
    async def paths_info(request: Request, namespace: str, name: str) -> Any:
        body = await _json_body(request)
        paths = body.get("paths")
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise HubError(400, 'paths-info body must be {"paths": [str, ...]}')
        if len(paths) > MAX_BATCH_OPS:
            raise HubError(413, f"paths-info takes at most {MAX_BATCH_OPS} paths; split the request")
        return await run_in_threadpool(_paths_info, request, namespace, name, paths)

    def _paths_info(request: Request, namespace: str, name: str, paths: list[str]) -> Any:
        access.read(request, namespace, name)
        return [entry_json(f) for f in buckets.paths_info(namespace, name, paths)]

    @router.post("/api/buckets/{namespace}/{name}/batch")
    @_hub_errors
    async def batch(request: Request, namespace: str, name: str) -> Any:
        # Parsed here (async) because reading the body needs the event loop; the store call is sync. The token is
        # checked first, so nobody without write access makes the server read and parse a large batch.
        access.write(request, namespace)
        body = await _read_limited(request, MAX_BATCH_BYTES)
        return await run_in_threadpool(_batch, request, namespace, name, parse_batch(body))

    def _batch(request: Request, namespace: str, name: str, ops: list[Operation]) -> Any:  # `batch` checked the token
        result = buckets.apply_batch(
            namespace, name, ops, can_read_source=lambda ns, n: access.can_read(request, ns, n)
        )
        return {
            "success": True,
            "added": result.added,
            "copied": result.copied,
            "deleted": result.deleted,
            "failed": [],
        }

    @router.get("/api/buckets/{namespace}/{name}/xet-read-token")
    @_hub_errors
    def xet_read_token(request: Request, namespace: str, name: str) -> Any:
        access.read(request, namespace, name)
        return _xet_token(request, namespace, name, write=False)

    @router.get("/api/buckets/{namespace}/{name}/xet-write-token")
    @_hub_errors
    def xet_write_token(request: Request, namespace: str, name: str) -> Any:
        access.write(request, namespace)
        buckets.get_bucket(namespace, name)  # 404 for a missing bucket
        return _xet_token(request, namespace, name, write=True)

    def _xet_token(request: Request, namespace: str, name: str, write: bool) -> Response:
        # hf_xet decodes the JSON body (casUrl/exp/accessToken); huggingface_hub's Python helper
        # reads the X-Xet-* headers. Send both.
        token, exp = tokens.mint_cas_token(namespace, name, write)
        cas_url = cas_base_url_fn(request)
        headers = {"X-Xet-Cas-Url": cas_url, "X-Xet-Access-Token": token, "X-Xet-Token-Expiration": str(exp)}
        return JSONResponse({"casUrl": cas_url, "exp": exp, "accessToken": token}, headers=headers)

    @router.api_route("/buckets/{namespace}/{name}/resolve/{path:path}", methods=["GET", "HEAD"])
    @_hub_errors
    def resolve(request: Request, namespace: str, name: str, path: str) -> Any:
        access.read(request, namespace, name)
        f = buckets.get_file(namespace, name, path)
        token_url = f"{_base_url(request)}/api/buckets/{namespace}/{name}/xet-read-token"
        headers = {
            "X-Xet-Hash": f.xet_hash,
            "Link": f'<{token_url}>; rel="xet-auth"',
            "ETag": f'"{f.xet_hash}"',
            "Accept-Ranges": "bytes",
            "Content-Type": f.content_type or "application/octet-stream",
        }
        if request.method == "HEAD":
            return Response(status_code=200, headers={**headers, "Content-Length": str(f.size)})
        return _serve_bytes(request, f, headers)

    def _serve_bytes(request: Request, f: FileRecord, headers: dict[str, str]) -> Response:
        try:
            byte_range = parse_range(request.headers.get("range"), f.size)
        except HubError as err:
            return error_response(err.status, err.message, headers={"Content-Range": f"bytes */{f.size}"})
        if f.size == 0:
            return Response(b"", status_code=200, headers=headers)
        if read_file is None:
            raise HubError(501, "this server has no CAS reader: file bytes cannot be served over /resolve")
        start, end = byte_range or (0, f.size)
        headers = {**headers, "Content-Length": str(end - start)}
        if byte_range is not None:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"
        status = 206 if byte_range is not None else 200
        pieces = read_file(f.xet_hash, start, end)
        try:  # the first term before any header: a damaged file is an error status, not a 200 cut short
            first = next(pieces, b"")
        except CasError as error:
            return error_response(http_status(error), str(error))  # lost (404) or damaged (410) in the CAS
        # A later damaged term ends the body early (its bytes are never sent): the client sees a short read.
        return StreamingResponse(itertools.chain([first], pieces), status_code=status, headers=headers)

    return router


async def _read_limited(request: Request, limit: int) -> bytes:
    """The request body, read in pieces and refused (413) as soon as it passes `limit` bytes."""
    parts, size = [], 0
    async for piece in request.stream():
        size += len(piece)
        if size > limit:
            raise HubError(413, f"request body over {limit} bytes for this endpoint")
        parts.append(piece)
    return b"".join(parts)


async def _json_body(request: Request) -> dict[str, Any]:
    """Request body as a JSON object ({} when empty).

    Raises:
        HubError(400): not a JSON object, or a string in it that is no text (a lone surrogate).
    """
    raw = await _read_limited(request, MAX_JSON_BYTES)
    if not raw.strip():
        return {}
    try:
        body = loads_text(raw)
    except (ValueError, RecursionError) as err:
        raise HubError(400, f"invalid JSON body: {err}") from None
    if not isinstance(body, dict):
        raise HubError(400, "JSON body must be an object")
    return body
