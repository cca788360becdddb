"""The robotloop bucket server: Hub-compatible bucket API + Xet CAS in one FastAPI app.

``create_app`` wires :class:`BucketStore` (path -> xet hash, SQLite), :class:`TokenStore`
(Hub tokens + CAS tokens) and the CAS (:class:`CasStore` with ``cas_router``) together;
``serve`` runs it with uvicorn. Layout under ``root``::

    root/buckets.sqlite      bucket and file metadata (WAL); with --database, in PostgreSQL instead (schema buckets)
    root/cas_token_secret    HMAC key of CAS tokens (so they survive restarts)
    root/cas/                xorbs, shards and their index (owned by CasStore; with --database the index is in
                             PostgreSQL, schema cas, and bucket servers sharing the root share it)

Example::

    python -m services.bucket --root /data/buckets --host 127.0.0.1 --port 8750 --tokens tokens.txt
    HF_ENDPOINT=http://127.0.0.1:8750 HF_TOKEN=... hf buckets list
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from robotloop.auth import AuthError, CasClaims, TokenStore, bearer_from_header, load_or_create_secret
from robotloop.database import redact
from robotloop.errors import BadValue
from robotloop.storage.private import private_dir
from robotloop.storage.server.buckets import BucketStore
from robotloop.storage.server.cas import CasStore
from robotloop.storage.server.files import read_file_range, server_stats
from services.bucket import DEFAULT_MAX_BODY_BYTES, BucketOptions
from services.bucket.cas_api import cas_router
from services.bucket.hub_api import error_response, hub_router
from services.errors import http_status, json_errors
from services.limits import BodyLimit
from services.serve import serve_app

log = logging.getLogger("robotloop.bucket")


def _cas_authorize(tokens: TokenStore):
    """``authorize(request, write)`` for ``cas_router``: checks the CAS token hf_xet sends."""

    def authorize(request: Request, write: bool) -> CasClaims:
        try:
            return tokens.verify_cas_token(bearer_from_header(request.headers.get("authorization")), write)
        except AuthError as err:
            raise HTTPException(http_status(err), str(err)) from None

    return authorize


def create_app(
    root: Path,
    tokens_file: Path | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    database: str | None = None,
) -> FastAPI:
    """Build the server app over ``root``; ``tokens_file=None`` means open local mode (see auth.py); ``database``: a
    ``postgresql://`` URL for the bucket metadata and the CAS index (default: SQLite in ``root``).

    Raises:
        TokensFileError: malformed tokens file (line number in the message).
        BadDatabaseUrl, DatabaseUnavailable: ``database`` is not a PostgreSQL URL, or refuses us.
    """
    root = private_dir(root)
    tokens = TokenStore.from_file(tokens_file, cas_secret=load_or_create_secret(root))
    cas = CasStore(root / "cas", database=database)
    buckets = BucketStore(root, file_size=cas.file_size, uploaded_by=cas.uploaded_by, database=database)

    app = FastAPI(title="robotloop bucket server", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.buckets, app.state.tokens, app.state.cas = buckets, tokens, cas

    def cas_base_url(request: Request) -> str:
        # The CAS routes (/v1/...) live on this same server, at the root: cas_router builds its
        # xorb fetch URLs from the request base URL, so it must not be mounted under a prefix.
        return str(request.base_url).rstrip("/")

    def read_file(file_hash: str, start: int, end: int) -> Iterator[bytes]:
        return read_file_range(cas, file_hash, start, end)

    app.include_router(hub_router(buckets, tokens, cas_base_url, read_file=read_file))
    app.include_router(
        cas_router(
            cas,
            _cas_authorize(tokens),
            may_read=lambda claims, h: buckets.holds_hash(claims.namespace, claims.bucket, h),
        )
    )

    @app.get("/api/robotloop/proof")
    def proof(nonce: str) -> Any:
        try:
            raw = bytes.fromhex(nonce)
        except ValueError:
            raw = b""
        if not 16 <= len(raw) <= 64:
            return error_response(400, "nonce must be 16 to 64 bytes, hex-encoded")
        return {"proofs": tokens.prove(raw)}

    @app.get("/api/robotloop/stats")
    def stats(request: Request) -> Any:
        try:
            who = tokens.principal(bearer_from_header(request.headers.get("authorization")))
        except AuthError as err:
            return error_response(http_status(err), str(err))
        if who.anonymous:
            return error_response(401, "stats need a token")
        return JSONResponse(server_stats(cas, buckets))

    json_errors(app, respond=error_response)  # unknown routes, wrong methods, CAS refusals: the Hub's shape
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, respond=error_response)
    return app


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(options: BucketOptions) -> None:
    """Run the server with uvicorn until interrupted.

    Raises:
        ValueError: open local mode (no ``tokens``) on a non-loopback host: anybody on the network could read
            and write every bucket.
        TokensFileError, FileNotFoundError: a malformed or missing tokens file. PortInUse: a busy port.
        BadDatabaseUrl, DatabaseUnavailable: a wrong ``--database`` URL or credentials.
    """
    root, host, tokens = Path(options.root), options.host, options.tokens
    if tokens is None and not _is_loopback(host):
        raise BadValue(f"refusing to serve without a tokens file on non-loopback host {host!r}; pass --tokens FILE")
    app = create_app(root, Path(tokens) if tokens else None, options.max_body_bytes, options.database)
    mode = f"tokens from {tokens}" if tokens else "OPEN local mode (no tokens file)"
    index = f", metadata in {redact(options.database)}" if options.database else ""
    banner = f"robotloop bucket server on http://{host}:{options.port}, root {root}{index}, {mode}"
    serve_app(app, host, options.port, log, banner)
