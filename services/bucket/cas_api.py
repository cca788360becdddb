"""Xet CAS HTTP endpoints, as the hf_xet 1.8 client calls them, over a CasStore.

Endpoints (all JSON errors are {"detail": "..."}):
    POST /v1/xorbs/{prefix}/{hash}          body = serialized xorb      -> {"was_inserted": bool}
    POST /v1/shards                         body = shard                -> {"result": 0 | 1}
    GET  /v1/reconstructions/{file_hash}    [Range: bytes=a-b]          -> v1 reconstruction JSON
    GET  /v1/chunks/{prefix}/{chunk_hash}                               -> shard bytes | 404
    GET  /v1/xorb-data/{hash}?exp&sig       [Range: bytes=a-b]          -> xorb bytes (206)
    POST /v1/telemetry                                                   -> {} (discarded)
    POST /v1/xorb-grants/..., POST /v2/shards, GET /v2/reconstructions/... -> 404, which makes
        hf_xet 1.8 fall back to the direct v1 endpoints above.

This module only maps HTTP to CasStore calls; CasError types become statuses by services.errors.HTTP_STATUS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from robotloop.storage.server import cas
from services.errors import http_status
from services.ranges import parse_range

Authorize = Callable[[Request, bool], Any]  # returns the token's claims (whatever `MayRead` understands)
MayRead = Callable[[Any, str], bool]
XORB_PREFIXES = ("default",)
DEDUP_PREFIXES = ("default", "default-merkledb")  # hf_xet 1.8 sends "default"; the spec names the other


def _http_error(e: cas.CasError, method: str) -> HTTPException:
    if isinstance(e, cas.UnknownXorb) and method != "GET":
        return HTTPException(400, str(e))  # a shard naming a xorb that was never uploaded is a bad shard
    return HTTPException(http_status(e), str(e))


async def _run(request: Request, fn: Callable, *args):
    """Run a blocking store call off the event loop, turning CasError into HTTPException."""
    try:
        return await run_in_threadpool(fn, *args)
    except cas.CasError as e:
        raise _http_error(e, request.method) from None


async def _body(request: Request, limit: int) -> bytes:
    """Read the request body, refusing (413) before or as soon as it passes `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"body of {declared} bytes exceeds the {limit}-byte limit")
    buf = bytearray()
    async for part in request.stream():
        buf += part
        if len(buf) > limit:
            raise HTTPException(413, f"body exceeds the {limit}-byte limit")
    return bytes(buf)


def _check_prefix(prefix: str, allowed: tuple[str, ...]) -> None:
    if prefix not in allowed:
        raise HTTPException(400, f"unknown prefix {prefix!r}; expected one of {', '.join(allowed)}")


def cas_router(
    store: cas.CasStore,
    authorize: Authorize,
    public_url: str | None = None,
    may_read: MayRead = lambda claims, file_hash: True,
) -> APIRouter:
    """Router with the Xet CAS endpoints; `authorize(request, write)` raises HTTPException and returns the
    token's claims, and `may_read(claims, file_hash)` says whether they cover a file (the bucket server: the
    file is in the token's bucket). Xorb bytes are served only through the signed URLs of a reconstruction.

    Fetch URLs in reconstructions are built from `public_url` if given (set it behind a proxy),
    else from the request's own base URL. Mount the router at the root of the CAS URL.
    """
    r = APIRouter(tags=["xet-cas"])

    @r.post("/v1/xorbs/{prefix}/{xorb_hash}")
    async def upload_xorb(prefix: str, xorb_hash: str, request: Request) -> dict:
        claims = authorize(request, True)
        _check_prefix(prefix, XORB_PREFIXES)
        body = await _body(request, store.max_xorb_bytes)
        res = await _run(request, store.put_xorb, xorb_hash, body, getattr(claims, "namespace", None))
        return {"was_inserted": res.was_inserted}

    @r.post("/v1/shards")
    async def upload_shard(request: Request) -> dict:
        claims = authorize(request, True)
        body = await _body(request, store.max_shard_bytes)
        res = await _run(request, store.put_shard, body, getattr(claims, "namespace", None))
        return {"result": 1 if res.was_inserted else 0}

    @r.get("/v1/reconstructions/{file_hash}")
    async def reconstruction(file_hash: str, request: Request) -> dict:
        claims = authorize(request, False)
        if not await _run(request, may_read, claims, file_hash):  # the same answer as for an unknown file
            raise HTTPException(404, f"file {file_hash} is not registered")
        rng = parse_range(request.headers.get("range"))
        byte_range = None
        if rng is not None:
            a, b = rng
            if a is None:  # suffix range "bytes=-n": needs the size first
                size = await _run(request, store.file_size, file_hash)
                if size is None:
                    raise HTTPException(404, f"file {file_hash} is not registered")
                a, b = max(size - b, 0), size - 1
            byte_range = (a, (b + 1) if b is not None else 2**63)
        base = (public_url or str(request.base_url)).rstrip("/")
        return await _run(request, store.reconstruction, file_hash, byte_range, base)

    @r.get("/v1/chunks/{prefix}/{chunk_hash}")
    async def dedup_query(prefix: str, chunk_hash: str, request: Request) -> Response:
        claims = authorize(request, True)  # asked by uploaders only; a reader has nothing to deduplicate
        _check_prefix(prefix, DEDUP_PREFIXES)
        shard = await _run(request, store.dedup_shard, chunk_hash, getattr(claims, "namespace", None))
        if shard is None:
            raise HTTPException(404, f"chunk {chunk_hash} is not in the global dedup index")
        return Response(shard, media_type="application/octet-stream")

    @r.get("/v1/xorb-data/{xorb_hash}")
    async def xorb_data(xorb_hash: str, request: Request) -> Response:
        # Only through the signed URLs a reconstruction hands out (the client sends no token to fetch URLs,
        # like presigned S3 URLs on the Hub): a CAS token alone would read any xorb whose hash it learned.
        # A bad or expired signature is 403: hf_xet answers 403 by re-requesting the reconstruction.
        q = request.query_params
        if not store.check_fetch_url(xorb_hash, q.get("exp"), q.get("sig")):
            raise HTTPException(
                403,
                f"fetch URL for xorb {xorb_hash} is missing, expired or not validly signed; "
                "use the URLs of a reconstruction",
            )
        rng = parse_range(request.headers.get("range"))
        a, b = rng if rng else (None, None)
        if a is None and b is not None:  # suffix range "bytes=-n"
            total = await _run(request, store.xorb_size, xorb_hash)
            if total is None:
                raise HTTPException(404, f"xorb {xorb_hash} is not stored")
            a, b = max(total - b, 0), total - 1
        v = await _run(request, store.read_verified, xorb_hash, a, b)
        headers = {"Accept-Ranges": "bytes"}
        if rng is not None:
            headers["Content-Range"] = f"bytes {v.offset}-{v.offset + len(v.data) - 1}/{v.total}"
        return Response(v.data, status_code=206 if rng else 200, headers=headers, media_type="application/octet-stream")

    @r.post("/v1/telemetry")
    async def telemetry(request: Request) -> dict:
        authorize(request, False)
        await _body(request, 1 << 20)
        return {}

    def _unsupported(what: str, use: str) -> Callable:
        async def handler(request: Request) -> JSONResponse:
            return JSONResponse({"detail": f"{what} is not supported here; use {use}"}, status_code=404)

        return handler

    r.add_api_route(
        "/v1/xorb-grants/{prefix}/{xorb_hash}",
        _unsupported("xorb upload grants", "POST /v1/xorbs/{prefix}/{hash}"),
        methods=["POST"],
    )
    r.add_api_route("/v2/shards", _unsupported("v2 shard upload", "POST /v1/shards"), methods=["POST"])
    r.add_api_route(
        "/v2/reconstructions/{file_hash}",
        _unsupported("v2 reconstruction", "GET /v1/reconstructions/{file_hash}"),
        methods=["GET"],
    )
    return r
