"""The robotloop deploy service: releases, channels, robots and their assignments, heartbeats, history.

Thin routes over :class:`robotloop.deploy.registry.Registry` (SQLite, or PostgreSQL with ``--database
postgresql://...``, which several replicas then share; it documents the state)::

    GET  /v1/health                               {"status": "ok"}; no token needed
    POST /v1/releases                             {"manifest": <signed manifest>, "channel"?: "canary"} -> 201
    GET  /v1/releases                             {"releases": [...]}
    GET  /v1/releases/{name}                      the release with its signed manifest
    GET  /v1/channels                             {"channels": {"canary": "v3", "stable": "v2"}}
    POST /v1/channels/{channel}/promote           {"release": "v3", "reason"?} -> {"channel", "release", "previous"}
    POST /v1/channels/{channel}/rollback          {"reason"?} -> the channel back on its previous release
    POST /v1/robots                               {"robot": "r1", "channel"?: "stable", "rotate"?: false}
                                                  -> 201 {"robot", "token"}: the robot's token, shown once
    GET  /v1/robots                               {"robots": [...]}: assignment, running release, last status
    GET  /v1/robots/{id}                          one robot (operators, or that robot itself)
    PUT  /v1/robots/{id}/assignment               {"channel"?, "release"?, "unpin"?} -> the assignment
    GET  /v1/robots/{id}/assignment?known=v1&wait_s=30   long-poll: answers when the assignment differs from
                                                  `known` or after wait_s (<= 60) -> {"release", "manifest", ...}
    POST /v1/robots/{id}/heartbeat                {"running", "status": {control_hz, health, ...}} (the robot)
    POST /v1/robots/{id}/events                   {"kind": swap|rollback|refused, "release", "previous", "detail"}
    POST /v1/robots/{id}/rollback                 {"reason"?}: pin the robot to the release it ran before
    GET  /v1/history?robot=&channel=&limit=       events, newest first

Auth: operators use tokens from a tokens file (``<token> <read|write> *``, :class:`TokenStore`): read tokens may
GET, write tokens may also change things. Robots use the token issued at registration (only its SHA-256 is
stored) and may only read their own robot and assignment and post their own heartbeats and events; another
robot's routes answer 403. Errors are JSON ``{"error": "..."}`` (401, 403, 404, 409 name reuse, 422 bad body, or a
release not signed by one of the service's trusted keys, ``--trusted-key``). Without trusted keys the service does not
start, unless told ``--allow-any-signer`` (then it registers releases signed by any key; robots verify regardless).
Only JSON travels: no pickle on any route.

Example::

    python -m services.deploy --tokens ops.tokens --db deploy.sqlite --port 8780   # or: robotloop deploy serve
    python -m services.deploy --tokens ops.tokens --database postgresql://deploy:PASSWORD@db.lab/deploy  # a replica

While PostgreSQL is down, what needs it answers 503 (`DatabaseUnavailable`); the service carries on once it is back.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Query, Request

from robotloop.auth import (
    WILDCARD,
    Forbidden,
    TokenStore,
    bearer_from_header,
)
from robotloop.config import Settings
from robotloop.database import check_postgres_url
from robotloop.deploy.client import describe_event
from robotloop.deploy.keys import load_public_keys
from robotloop.deploy.manifest import SignedManifest
from robotloop.deploy.registry import Registry, check_name
from robotloop.errors import BadValue
from services.deploy import DeployOptions
from services.errors import json_errors
from services.limits import BodyLimit
from services.serve import serve_app

log = logging.getLogger("robotloop.deploy")
MAX_WAIT_S = 60.0


@dataclass(frozen=True)
class Caller:
    """An operator (tokens file) or a robot (its registration token)."""

    name: str
    robot: str | None = None
    write: bool = False

    def may_touch(self, robot: str) -> None:
        """Raises Forbidden for a robot acting on another robot's routes."""
        if self.robot is not None and self.robot != robot:
            raise Forbidden(f"robot {self.robot!r} may not read or change robot {robot!r}")

    def operator(self, write: bool) -> None:
        """Raises Forbidden unless an operator (with a write token if `write`)."""
        if self.robot is not None:
            raise Forbidden("robot tokens may only use their own robot's routes")
        if write and not self.write:
            raise Forbidden("this token is read-only; changing releases, channels and robots needs a 'write' token")


def caller(request: Request) -> Caller:
    """Who is calling. Raises Unauthorized (no or unknown token)."""
    header = request.headers.get("authorization")
    token = bearer_from_header(header)
    robot = request.app.state.registry.robot_for_token(token) if token else None
    if robot:
        return Caller(f"robot:{robot}", robot=robot)
    tokens: TokenStore = request.app.state.tokens
    token = tokens.require(header, write=False, why="")
    who = tokens.principal(token)
    if who.namespace != WILDCARD:  # a bucket-style tokens file reused here must not make every line an operator
        raise Forbidden(
            f"this token is scoped to namespace {who.namespace!r}; the deploy service's operators are "
            "'<token> <read|write> *' lines"
        )
    return Caller("operator", write=who.write)


Who = Annotated[Caller, Depends(caller)]


# A signed manifest lists every file and tensor segment (about 0.2 MB for lerobot's ACT); heartbeats are small.
MAX_BODY_BYTES = 8 * 2**20


def create_app(
    tokens_file: Path | str, db: Path | str, trusted_keys: list[Path] | None = None, allow_any_signer: bool = False
) -> FastAPI:
    """The deploy service app over the registry at `db` (a SQLite file, or a ``postgresql://`` URL); it registers
    only releases signed by one of `trusted_keys`, or (`allow_any_signer`, said explicitly) by any key.

    Raises:
        TokensFileError: malformed tokens file. FileNotFoundError: no such file.
        ValueError: neither trusted keys nor `allow_any_signer`.
        BadDatabaseUrl, DatabaseUnavailable: a PostgreSQL URL that is malformed or refuses the connection.
    """
    tokens = TokenStore.from_file(Path(tokens_file))
    if not trusted_keys and not allow_any_signer:
        # Operators would see releases listed that every robot refuses (signed by anyone, or edited after signing).
        raise BadValue(
            "the deploy service registers releases signed by trusted keys only: pass --trusted-key "
            "deploy.pub (deploy.trusted_keys), or --allow-any-signer to register releases signed by any "
            "key (robots still check against their own keys)"
        )
    trusted = load_public_keys(trusted_keys) if trusted_keys else None
    registry = Registry(db)
    app = FastAPI(title="robotloop deploy service", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.registry, app.state.tokens = registry, tokens
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)

    @app.get("/v1/health")
    def health() -> dict[str, Any]:
        return {"status": "ok"}

    @app.post("/v1/releases", status_code=201)
    def publish(who: Who, manifest: Annotated[dict, Body()], channel: Annotated[str | None, Body()] = None) -> dict:
        who.operator(write=True)
        signed = SignedManifest.from_dict(manifest)
        if trusted is not None:
            signed.verify(trusted, who="the deploy service")
        if channel is not None:
            check_name("channel", channel)  # before the release is added: a refused publish leaves nothing behind
        registry.add_release(signed, by=who.name)
        previous = registry.promote(channel, signed.manifest.name, by=who.name, reason="publish") if channel else None
        log.info("release %s published%s", signed.manifest.name, f" to {channel}" if channel else "")
        return {"release": signed.manifest.name, "channel": channel, "previous": previous}

    @app.get("/v1/releases")
    def releases(who: Who) -> dict:
        who.operator(write=False)
        return {"releases": registry.releases()}

    @app.get("/v1/releases/{name}")
    def release(name: str, who: Who) -> dict:
        who.operator(write=False)
        return registry.release(name)

    @app.get("/v1/channels")
    def channels(who: Who) -> dict:
        who.operator(write=False)
        return {"channels": registry.channels()}

    @app.post("/v1/channels/{channel}/promote")
    def promote(channel: str, who: Who, release: Annotated[str, Body()], reason: Annotated[str, Body()] = "") -> dict:
        who.operator(write=True)
        previous = registry.promote(channel, release, by=who.name, reason=reason)
        return {"channel": channel, "release": release, "previous": previous}

    @app.post("/v1/channels/{channel}/rollback")
    def rollback_channel(channel: str, who: Who, reason: Annotated[str, Body(embed=True)] = "") -> dict:
        who.operator(write=True)
        current = registry.channels().get(channel)
        target = registry.rollback_channel(channel, by=who.name, reason=reason)
        return {"channel": channel, "release": target, "previous": current}

    @app.post("/v1/robots", status_code=201)
    def register(
        who: Who,
        robot: Annotated[str, Body()],
        channel: Annotated[str, Body()] = "stable",
        rotate: Annotated[bool, Body()] = False,
    ) -> dict:
        who.operator(write=True)
        return {"robot": robot, "token": registry.register_robot(robot, channel, rotate, by=who.name)}

    @app.get("/v1/robots")
    def robots(who: Who) -> dict:
        who.operator(write=False)
        return {"robots": registry.robots()}

    @app.get("/v1/robots/{robot}")
    def robot(robot: str, who: Who) -> dict:
        who.may_touch(robot)
        return registry.robot(robot)

    @app.put("/v1/robots/{robot}/assignment")
    def assign(
        robot: str,
        who: Who,
        channel: Annotated[str | None, Body()] = None,
        release: Annotated[str | None, Body()] = None,
        unpin: Annotated[bool, Body()] = False,
    ) -> dict:
        who.operator(write=True)
        return asdict(registry.assign(robot, channel, release, unpin, by=who.name))

    @app.get("/v1/robots/{robot}/assignment")
    async def assignment(
        robot: str, who: Who, known: str | None = None, wait_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0
    ) -> dict:
        who.may_touch(robot)
        return asdict(await registry.wait_assignment(robot, known, wait_s))

    @app.post("/v1/robots/{robot}/heartbeat")
    def heartbeat(
        robot: str,
        who: Who,
        running: Annotated[str | None, Body()] = None,
        status: Annotated[dict, Body()] = {},  # noqa: B006 - FastAPI copies a default per request
    ) -> dict:
        _robot_itself(who, robot)
        registry.heartbeat(robot, running, status)
        return {"ok": True}

    @app.post("/v1/robots/{robot}/events")
    def event(
        robot: str,
        who: Who,
        kind: Annotated[str, Body()],
        release: Annotated[str | None, Body()] = None,
        previous: Annotated[str | None, Body()] = None,
        detail: Annotated[str, Body()] = "",
    ) -> dict:
        _robot_itself(who, robot)
        registry.robot_event(robot, kind, release, previous, detail)
        log.warning("robot %s: %s", robot, describe_event(kind, release, previous, detail))
        return {"ok": True}

    @app.post("/v1/robots/{robot}/rollback")
    def rollback_robot(robot: str, who: Who, reason: Annotated[str, Body(embed=True)] = "") -> dict:
        who.operator(write=True)
        return asdict(registry.rollback_robot(robot, by=who.name, reason=reason))

    @app.get("/v1/history")
    def history(
        who: Who,
        robot: str | None = None,
        channel: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> dict:
        if who.robot is not None:
            who.may_touch(robot or "")
        return {"events": registry.history(robot, channel, limit)}

    json_errors(app)

    return app


def _robot_itself(who: Caller, robot: str) -> None:
    if who.robot != robot:
        raise Forbidden(f"only robot {robot!r} itself reports its heartbeats and events")


def serve(options: DeployOptions, settings: Settings) -> None:
    """Run the service with uvicorn until interrupted; options left None come from `settings.deploy`.

    Raises:
        ValueError: no tokens file (there is no open mode: the service decides what robots run), or no trusted
            keys and not `allow_any_signer`.
        TokensFileError, FileNotFoundError: a malformed or missing tokens file. PortInUse: a busy port.
        BadDatabaseUrl, DatabaseUnavailable: a wrong ``--database`` URL or credentials.
    """
    cfg = settings.deploy
    tokens_file = options.tokens or cfg.tokens_file
    if tokens_file is None:
        raise BadValue("the deploy service needs operator tokens: pass --tokens FILE ('<token> write *' per line)")
    host, port = options.host or cfg.host, options.port or cfg.port
    database = options.database or (None if options.db else cfg.database)  # an explicit --db wins over settings
    state = check_postgres_url(database) if database else options.db or cfg.db
    any_signer = cfg.allow_any_signer if options.allow_any_signer is None else options.allow_any_signer
    app = create_app(tokens_file, state, options.trusted_keys or cfg.trusted_keys, any_signer)
    # Robots' long-polls are open requests: answer them at the stop signal, or shutdown would wait them out.
    registry = app.state.registry
    banner = f"robotloop deploy service on http://{host}:{port}, state in {registry.db.where}"
    serve_app(app, host, port, log, banner, registry.release_waiters)
