"""The robotloop training service: submit `robotloop train` jobs over HTTP, watch them, cancel them.

Thin routes over :class:`robotloop.train.jobs.JobManager` (which runs the subprocesses and documents the job
directory layout)::

    GET  /v1/health                         {"status": "ok", "running": n, "queued": n}; no token needed
    POST /v1/jobs                           JSON JobSpec -> 201 the job's state (with its "id")
    GET  /v1/jobs                           {"jobs": [state, ...]}, oldest first
    GET  /v1/jobs/{id}                      state: status (queued|running|succeeded|failed|cancelled), step, loss,
                                            samples_per_s, data_wait_share, episodes, last_checkpoint, exit_code
    GET  /v1/jobs/{id}/log?offset=N         {"text", "next_offset", "status"}: the log from byte N (64 KiB at most)
    GET  /v1/jobs/{id}/log?follow=true      text/plain, streamed as the log grows, until the job has finished
    GET  /v1/jobs/{id}/progress?after=S     {"points": [Progress, ...]}: the reports past step S (5000 at most),
                                            oldest first: a loss curve, read a page at a time
    POST /v1/jobs/{id}/cancel               the state; a running job writes a checkpoint, then stops

Errors are JSON ``{"error": "<what is wrong>"}``: 401 missing or unknown token, 403 a read-only token (submit,
cancel) or one scoped to another namespace, 404 unknown job, 422 a bad spec (dataset URL, steps <= 0, ...).

Auth: tokens come from a tokens file in the bucket server's format, ``<token> <read|write> <namespace|*>`` (parsed
by :class:`TokenStore`). Any listed token may read job states and logs; submitting needs a write token whose
namespace covers the output bucket and the datasets, cancelling one that covers the job's output. Jobs read and
write buckets with the service's storage token (``storage.token``) unless the spec names its own endpoint.

Example::

    python -m services.trainer --tokens tokens.txt --port 8770     # or: robotloop trainer serve --tokens tokens.txt
    curl -H "Authorization: Bearer $T" -d '{"datasets": ["hf://buckets/lab/d/datasets/cube"],
         "output": "hf://buckets/lab/d/models/run1", "steps": 5000, "device": "cuda"}' localhost:8770/v1/jobs
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from robotloop.auth import AuthError, TokenStore
from robotloop.config import Settings
from robotloop.errors import BadValue
from robotloop.storage import BucketUrl, ensure_endpoint
from robotloop.train.jobs import JobManager, JobSpec, UnknownJob
from services.errors import json_errors
from services.limits import BodyLimit
from services.serve import serve_app
from services.trainer import TrainerOptions

log = logging.getLogger("robotloop.trainer")


def _token(request: Request, write: bool) -> str:
    """The caller's token, checked against the tokens file.

    Raises:
        Unauthorized: no token, or one not in the tokens file. Forbidden: `write` and a read-only token.
    """
    why = "submitting and cancelling jobs need a 'write' token"
    return request.app.state.tokens.require(request.headers.get("authorization"), write, why)


def reader(request: Request) -> str:
    return _token(request, write=False)


def writer(request: Request) -> str:
    return _token(request, write=True)


Reader = Annotated[str, Depends(reader)]
Writer = Annotated[str, Depends(writer)]


MAX_BODY_BYTES = 2**20  # a job spec is a few hundred bytes


def create_app(settings: Settings, tokens_file: Path | str, root: Path | None = None) -> FastAPI:
    """The training service app; jobs live under `root` (default `settings.trainer.root`).

    Raises:
        TokensFileError: malformed tokens file. FileNotFoundError: no such file.
    """
    tokens = TokenStore.from_file(Path(tokens_file))
    cfg = settings.trainer
    jobs = JobManager(root or cfg.root, cfg.max_running, cfg.cancel_grace_s, max_queued=cfg.max_queued)
    storage = ensure_endpoint(settings)  # once: a job's child gets a concrete endpoint and token, not a lookup

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(jobs.close)  # running jobs checkpoint before the service goes

    app = FastAPI(
        title="robotloop training service",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        lifespan=lifespan,
    )
    app.state.jobs, app.state.tokens = jobs, tokens
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)

    @app.get("/v1/health")
    def health() -> dict[str, Any]:
        states = [s.status for s in jobs.list()]
        return {"status": "ok", "running": states.count("running"), "queued": states.count("queued")}

    @app.post("/v1/jobs", status_code=201)
    def submit(body: JobSpec, token: Writer) -> dict[str, Any]:
        for url in body.datasets:  # the caller's scope, not the service's storage token's
            tokens.authorize(token, BucketUrl.parse(url).namespace, write=False, bucket_public=False)
        tokens.authorize(token, BucketUrl.parse(body.output).namespace, write=True, bucket_public=False)
        job_id = jobs.submit(body.with_storage(*storage).with_weights(cfg.weights_dir))
        log.info("job %s submitted: %s -> %s", job_id, body.datasets, body.output)
        return dataclasses.asdict(jobs.state(job_id))

    def may_see(token: str, state: Any) -> bool:
        """A job is visible to callers who may read its output's namespace (its datasets, log and figures)."""
        try:
            tokens.authorize(token, BucketUrl.parse(state.spec["output"]).namespace, write=False, bucket_public=False)
            return True
        except AuthError:
            return False

    def visible_state(job_id: str, token: str) -> Any:
        state = jobs.state(job_id)
        if not may_see(token, state):
            raise UnknownJob(job_id)  # the same answer as for a job that does not exist
        return state

    @app.get("/v1/jobs")
    def list_jobs(token: Reader) -> dict[str, Any]:
        return {"jobs": [dataclasses.asdict(s) for s in jobs.list() if may_see(token, s)]}

    @app.get("/v1/jobs/{job_id}")
    def job_state(job_id: str, token: Reader) -> dict[str, Any]:
        return dataclasses.asdict(visible_state(job_id, token))

    @app.get("/v1/jobs/{job_id}/log", response_model=None)
    def job_log(
        job_id: str, token: Reader, offset: Annotated[int, Query(ge=0, le=2**40)] = 0, follow: bool = False
    ) -> dict[str, Any] | StreamingResponse:
        status = visible_state(job_id, token).status  # an unknown job is a 404 before any streaming starts
        if follow:
            return StreamingResponse(jobs.follow(job_id, offset), media_type="text/plain; charset=utf-8")
        text, next_offset = jobs.log(job_id, offset)
        return {"text": text, "next_offset": next_offset, "status": status}

    @app.get("/v1/jobs/{job_id}/progress")
    def job_progress(job_id: str, token: Reader, after: Annotated[int, Query(ge=-1, le=2**62)] = -1) -> dict[str, Any]:
        visible_state(job_id, token)  # an unknown or hidden job is a 404
        return {"points": jobs.progress(job_id, after)}

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: str, token: Writer) -> dict[str, Any]:
        output = BucketUrl.parse(visible_state(job_id, token).spec["output"])
        tokens.authorize(token, output.namespace, write=True, bucket_public=False)
        log.info("job %s cancelled", job_id)
        return dataclasses.asdict(jobs.cancel(job_id))

    json_errors(app)

    return app


def serve(options: TrainerOptions, settings: Settings) -> None:
    """Run the service with uvicorn until interrupted; options left None come from `settings.trainer`.

    Raises:
        ValueError: no tokens file (jobs run code on this machine: there is no open mode).
        TokensFileError, FileNotFoundError: a malformed or missing tokens file. PortInUse: a busy port.
    """
    cfg = settings.trainer
    tokens_file = options.tokens or cfg.tokens_file
    if tokens_file is None:
        raise BadValue("the training service needs tokens: pass --tokens FILE ('<token> write <namespace|*>' per line)")
    host, port = options.host or cfg.host, options.port or cfg.port
    app = create_app(settings, tokens_file, options.root)
    banner = f"robotloop training service on http://{host}:{port}, jobs under {options.root or cfg.root}"
    serve_app(app, host, port, log, banner)  # its shutdown bound: followed logs wait for the jobs they follow
