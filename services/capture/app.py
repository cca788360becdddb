"""The robotloop capture service: robots open an episode, stream frame batches, close it; the service commits it.

Thin routes over :class:`robotloop.capture.sessions.EpisodeSessions` (which holds the logic and documents the
frame wire format)::

    GET    /v1/health                      {"status": "ok", "open_episodes": n}; no token needed
    GET    /v1/stats                       what open episodes hold and how episodes ended (`EpisodeSessions.stats`);
                                           any robot token, read-only ones too
    POST   /v1/episodes                    JSON {"dataset", "cameras": {name: [H, W, 3]}, "state_dim", "action_dim",
                                           "fps"?, "robot_type"?, "fleet"? (default false), "shadow_map"? (a sim's)}
                                           -> 201 {"episode_id", "cameras" (byte order), "fleet", ...}
    POST   /v1/episodes/{id}/frames        a frame batch (application/octet-stream) -> {"episode_id", "frames"}
    POST   /v1/episodes/{id}/close         JSON {"task", "facts"? (fleet only)} -> the CommitReport's fields, plus
                                           "episode_id"
    DELETE /v1/episodes/{id}               drop the episode -> {"aborted": id}

Fleet datasets (``"fleet": true`` at open; `DatasetSpec(fleet=True)`): every frame of the batch also has
``intervention`` and ``policy_action`` (see `robotloop.capture.sessions`), and the close may give the episode's
facts, a flat JSON object of names to strings, numbers, booleans or nulls (the robot's id, release, seed...). The
service commits them as the in-process `FleetRecorder` does: one line of ``meta/fleet_episodes.jsonl`` with the
episode's index, the facts, the task, and what its frames say (success, max_reward, frames, expert_frames, kind).

Errors are JSON ``{"error": "<what is wrong and what to do>"}``: 400 malformed request or URL (bad facts
included), 401 missing or unknown token, 403 token not allowed to write that bucket namespace, 404 unknown episode
(another robot's included; one dropped for idleness says so), 408 a request body that stopped arriving for the idle
timeout, 409 dataset exists with other features (a fleet dataset opened without fleet, or the reverse, included),
413 body or episode too large, 422 bad frames, task or facts (a fleet column missing, of the wrong size or type, or
sent to a dataset opened without fleet; facts for a demo episode or naming what the service counts), 429 too many
open episodes, 502 the bucket refused or failed the commit.

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
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, field_validator
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from robotloop.auth import TokenStore
from robotloop.capture.sessions import EpisodeSessions, Fact, Limits
from robotloop.config import Settings
from robotloop.errors import BadValue
from robotloop.output import quiet_encoders
from robotloop.sim.constants import check_shadow_map
from robotloop.storage import BucketClient, BucketUrl, connect
from services.capture import CaptureOptions
from services.errors import json_errors
from services.limits import BodyLimit
from services.serve import serve_app

log = logging.getLogger("robotloop.capture")

CameraName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_]{1,64}$")]
Side = Annotated[int, Field(ge=1, le=4096)]
Channels = Annotated[int, Field(ge=3, le=3)]  # RGB: what lerobot's video features hold


MAX_FACT_CHARS = 200


def _fact(value: object) -> Fact:
    """A fact as given, if it is one: flat values only, since a line of meta/fleet_episodes.jsonl is a row of a table
    (the dashboard shows each fact as a column). One check with one message, rather than pydantic's union of four
    types, which would answer four errors for one value.

    Raises:
        ValueError: anything else (pydantic makes it the 400's message, naming the fact).
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:  # what readers keep in an int64 column
            raise ValueError("a fact's integer must fit in 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):  # JSON has no NaN or infinity, though Python's parser takes them
            raise ValueError("a fact's number must be finite")
        return value
    if isinstance(value, str):
        # Text only: control characters and lone surrogates would travel in JSON and break a reader printing them.
        if len(value) > MAX_FACT_CHARS or not value.isprintable():
            raise ValueError(f"a fact's text must be up to {MAX_FACT_CHARS} printable characters")
        return value
    raise ValueError("a fact is a string, a number, true, false or null")


FactName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
FactValue = Annotated[Fact, PlainValidator(_fact, json_schema_input_type=Fact)]


class OpenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dataset: str = Field(description="hf://buckets/<namespace>/<bucket>/<path> of the LeRobot dataset")
    cameras: dict[CameraName, tuple[Side, Side, Channels]] = Field(min_length=1, description="name -> [H, W, 3]")
    state_dim: int = Field(ge=1, le=4096)
    action_dim: int = Field(ge=1, le=4096)
    fps: int = Field(default=50, ge=1, le=1000)
    robot_type: str | None = Field(default=None, max_length=100)
    fleet: bool = Field(default=False, description="a fleet dataset: frames also have intervention, policy_action")
    shadow_map: int | None = Field(
        default=None, description="a sim's cameras: the side of their shadow maps (256-8192; none: gym-aloha's)"
    )

    @field_validator("shadow_map")
    @classmethod
    def _shadow_map(cls, side: int | None) -> int | None:
        return check_shadow_map(side)  # BadValue, a ValueError: a 400 naming the field


class CloseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: str = Field(description="the language instruction stored with every frame")
    facts: dict[FactName, FactValue] | None = Field(
        default=None, max_length=32, description="a fleet episode's facts (its robot, release, seed...)"
    )


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
        shape = (dict(body.cameras), body.state_dim, body.action_dim, body.fps, body.robot_type)
        eid = sessions.open(who.id, url, *shape, fleet=body.fleet, shadow_map=body.shadow_map)
        log.info("%s opened %sepisode %s in %s", who.id, "a fleet " if body.fleet else "", eid, url)
        per_frame = sum(h * w * c for h, w, c in body.cameras.values())  # the raw image bytes of one frame
        return {
            "episode_id": eid,
            "dataset": str(url),
            "fleet": body.fleet,
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
        # A sync route: the encode's tail and the upload run in a thread.
        report = sessions.close(who.id, episode_id, body.task, body.facts)
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
