"""The robotloop capture service: robots open an episode, stream frame batches, close it; the service commits it.

Thin routes over :class:`robotloop.capture.sessions.EpisodeSessions` (which holds the logic and documents the
frame wire format)::

    GET    /v1/health                      {"status": "ok", "open_episodes": n}; no token needed
    GET    /v1/stats                       what open episodes hold and how episodes ended (`EpisodeSessions.stats`);
                                           any robot token, read-only ones too
    POST   /v1/episodes                    JSON {"dataset", "cameras": {name: [H, W, 3]}, "state_dim", "action_dim",
                                           "fps"?, "robot_type"?} -> 201 {"episode_id", "cameras" (byte order), ...}
    POST   /v1/episodes/{id}/frames        a frame batch (application/octet-stream) -> {"episode_id", "frames"}
    POST   /v1/episodes/{id}/close         JSON {"task"} -> the CommitReport's fields, plus "dataset"
    DELETE /v1/episodes/{id}               drop the episode -> {"aborted": id}

Errors are JSON ``{"error": "<what is wrong and what to do>"}``: 400 malformed request or URL, 401 missing or
unknown token, 403 token not allowed to write that bucket namespace, 404 unknown episode (another robot's
included; one dropped for idleness says so), 408 a request body that stopped arriving for the idle timeout,
409 dataset exists with other features, 413 body or episode too large, 422 bad frames or task, 429 too many open
episodes, 502 the bucket refused or failed the commit.

Idle episodes: an open episode without a request for ``capture.idle_timeout_s`` (``--idle-timeout-s``; its robot
vanished, or stopped without closing it) is dropped by a reaper that looks four times per timeout (at most every
minute): never committed, its encoder stopped, its frames and staging files freed, one line in the log, and counted
as ``episodes_abandoned`` in ``/v1/stats``. Its robot's next request on it is a 404 saying why.

Auth: robot tokens come from a tokens file in the bucket server's format, ``<token> <read|write> <namespace|*>``
(parsed by :class:`TokenStore`, no second parser). The *namespace* is the bucket namespace the robot may record
into (``*``: any), and a robot needs ``write``. The robot's identity is its token: ``robot-`` plus the first 12
hex digits of the token's SHA-256. So one line per robot both grants and isolates it, the shared format is
unchanged, and the id can be logged without leaking the token. Two robots sharing a token are one robot.
The service writes to buckets with its own storage token (``storage.token`` / ``connect``), never the robot's.

Example::

    python -m services.capture --tokens robots.txt --port 8760     # or: robotloop capture serve --tokens robots.txt
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from robotloop.auth import TokenStore
from robotloop.capture.sessions import EpisodeSessions, Limits
from robotloop.config import Settings
from robotloop.errors import BadValue
from robotloop.output import quiet_encoders
from robotloop.storage import BucketClient, BucketUrl, connect
from services.capture import CaptureOptions
from services.errors import json_errors
from services.limits import BodyLimit
from services.serve import serve_app

log = logging.getLogger("robotloop.capture")

CameraName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_]{1,64}$")]
Side = Annotated[int, Field(ge=1, le=4096)]
Channels = Annotated[int, Field(ge=3, le=3)]  # RGB: what lerobot's video features hold


class OpenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dataset: str = Field(description="hf://buckets/<namespace>/<bucket>/<path> of the LeRobot dataset")
    cameras: dict[CameraName, tuple[Side, Side, Channels]] = Field(min_length=1, description="name -> [H, W, 3]")
    state_dim: int = Field(ge=1, le=4096)
    action_dim: int = Field(ge=1, le=4096)
    fps: int = Field(default=50, ge=1, le=1000)
    robot_type: str | None = Field(default=None, max_length=100)


class CloseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: str = Field(description="the language instruction stored with every frame")


@dataclasses.dataclass(frozen=True)
class Robot:
    id: str
    token: str


def robot_id(token: str) -> str:
    """A robot's id: a fingerprint of its token (loggable; the token itself is never shown)."""
    return "robot-" + hashlib.sha256(token.encode()).hexdigest()[:12]


def calling_robot(request: Request) -> Robot:
    """The calling robot (a route dependency).

    Raises:
        Unauthorized: no token, or one not in the tokens file.
        Forbidden: a read-only token.
    """
    tokens = request.app.state.tokens
    token = tokens.require(
        request.headers.get("authorization"), True, "recording needs a 'write' robot token", "a robot token"
    )
    return Robot(robot_id(token), token)


Caller = Annotated[Robot, Depends(calling_robot)]


def create_app(settings: Settings, tokens_file: Path | str, client: BucketClient | None = None) -> FastAPI:
    """The capture app; `client` (default: `connect(settings)`) is how the service writes to buckets.

    Raises:
        TokensFileError: malformed tokens file. FileNotFoundError: no such file.
    """
    tokens = TokenStore.from_file(Path(tokens_file))
    cfg = settings.capture
    limits = Limits(cfg.max_episode_frames, cfg.max_episode_bytes, cfg.max_open_per_robot, cfg.idle_timeout_s)
    sessions = EpisodeSessions(client or connect(settings), limits, cfg.vcodec)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_reap_idle_episodes(sessions, cfg.idle_timeout_s))
        yield
        task.cancel()

    app = FastAPI(
        title="robotloop capture service", docs_url=None, redoc_url=None, openapi_url="/openapi.json", lifespan=lifespan
    )
    app.state.sessions, app.state.tokens = sessions, tokens

    @app.get("/v1/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "open_episodes": sessions.open_count()}

    @app.get("/v1/stats")
    def stats(request: Request) -> dict[str, Any]:
        tokens.require(request.headers.get("authorization"), False, "stats need a robot token", "a robot token")
        return sessions.stats()

    @app.post("/v1/episodes", status_code=201)
    def open_episode(body: OpenRequest, who: Caller) -> dict[str, Any]:
        url = BucketUrl.parse(body.dataset)
        tokens.authorize(who.token, url.namespace, write=True, bucket_public=False)  # the robot's scope, not ours
        eid = sessions.open(who.id, url, dict(body.cameras), body.state_dim, body.action_dim, body.fps, body.robot_type)
        log.info("%s opened episode %s in %s", who.id, eid, url)
        per_frame = sum(h * w * c for h, w, c in body.cameras.values())  # the raw image bytes of one frame
        return {
            "episode_id": eid,
            "dataset": str(url),
            "cameras": sorted(body.cameras),
            "frame_bytes": per_frame,
            "max_frames": limits.max_frames,
            "max_episode_bytes": limits.max_bytes,
            "max_body_bytes": cfg.max_body_bytes,
        }

    @app.post("/v1/episodes/{episode_id}/frames")
    async def add_frames(episode_id: str, request: Request, who: Caller) -> dict[str, Any]:
        try:
            body = await request.body()  # bounded by BodyLimit
        except ClientDisconnect:  # the robot went away mid-upload: nobody to answer, nothing of it kept
            log.info("%s disconnected while sending frames to episode %s", who.id, episode_id)
            return Response(status_code=400)
        frames = await run_in_threadpool(sessions.add_frames, who.id, episode_id, body)  # may wait for the encoder
        return {"episode_id": episode_id, "frames": frames}

    @app.post("/v1/episodes/{episode_id}/close")
    def close_episode(episode_id: str, body: CloseRequest, who: Caller) -> dict[str, Any]:
        report = sessions.close(who.id, episode_id, body.task)  # sync route: the encode's tail and upload, in a thread
        log.info("%s committed episode %s as index %d", who.id, episode_id, report.episode_index)
        return {"episode_id": episode_id, **dataclasses.asdict(report)}

    @app.delete("/v1/episodes/{episode_id}")
    def abort_episode(episode_id: str, who: Caller) -> dict[str, Any]:
        sessions.abort(who.id, episode_id)
        return {"aborted": episode_id}

    json_errors(app, validation_status=400)

    # A body that stops arriving mid-way (its robot gone without closing the connection) would hold its request and
    # what it sent for as long as the connection lives; its episode is dropped after the same time.
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes, stall_s=cfg.idle_timeout_s)
    return app


async def _reap_idle_episodes(sessions: EpisodeSessions, idle_timeout_s: float) -> None:
    """Drop idle episodes (`EpisodeSessions.expire`, which logs each) until cancelled: episodes of vanished robots
    would otherwise hold their encoders, frames and staging files forever. A failure is logged with its traceback
    and the reaper goes on: it must not die of it, silently, for every later episode."""
    while True:
        await asyncio.sleep(min(idle_timeout_s / 4, 60))
        try:
            await run_in_threadpool(sessions.expire)
        except Exception:  # a bug: in the log, with its traceback; the next round tries again
            log.exception("dropping idle episodes failed")


def serve(options: CaptureOptions, settings: Settings) -> None:
    """Run the service with uvicorn until interrupted; options left None come from `settings.capture`.

    Raises:
        ValueError: no tokens file: robots must have tokens (there is no open mode here).
        TokensFileError, FileNotFoundError: a malformed or missing tokens file. PortInUse: a busy port.
    """
    if options.idle_timeout_s is not None:
        capture = settings.capture.model_copy(update={"idle_timeout_s": options.idle_timeout_s})
        settings = settings.model_copy(update={"capture": capture})
    cfg = settings.capture
    tokens_file = options.tokens or cfg.tokens_file
    if tokens_file is None:
        raise BadValue(
            "the capture service needs robot tokens: pass --tokens FILE ('<token> write <namespace|*>' per line)"
        )
    host, port = options.host or cfg.host, options.port or cfg.port
    quiet_encoders()  # each episode's encoder would print its banner into the service's log
    app = create_app(settings, tokens_file)
    banner = f"robotloop capture service on http://{host}:{port}, robot tokens from {tokens_file}"
    serve_app(app, host, port, log, banner)
