"""The deploy service's state, in SQLite: releases, channels, robots, assignments, heartbeats, history.

    releases(name, manifest, key_id, checkpoint, created_at, published_at)   signed manifests, immutable
    channels(name, release, updated_at)                                     e.g. canary -> v3, stable -> v2
    robots(id, token_hash, channel, pinned, created_at, last_seen, running, status)
    events(id, at, robot, channel, kind, release, previous, detail)         the history, append-only

A robot's assignment is its pinned release if any, else its channel's release. Robot tokens are random
secrets shown once at registration; only their SHA-256 is stored. Every change that can alter an assignment
bumps a version that the long-polls (`wait_assignment`, a coroutine: a waiting robot holds no thread) watch.

Example:
    ```python
    >>> registry = Registry(Path("deploy.sqlite"))
    >>> registry.add_release(signed)                 # a SignedManifest
    >>> registry.promote("stable", "v1", by="ops")
    >>> token = registry.register_robot("r1", channel="stable")
    >>> registry.assignment("r1").release
    'v1'
    ```
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInput, Conflict, NotFound, Unprocessable
from ..storage.private import private_dir
from .manifest import MAX_JSON_DEPTH, BadManifest, SignedManifest, check_release_name, json_depth

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_CHANNELS = ("canary", "stable")
MAX_STATUS_BYTES = 16 * 1024  # a heartbeat's figures; every robot sends one every few seconds

SCHEMA = """
CREATE TABLE IF NOT EXISTS releases (name TEXT PRIMARY KEY, manifest TEXT NOT NULL, key_id TEXT NOT NULL,
    checkpoint TEXT NOT NULL, created_at REAL NOT NULL, published_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS channels (name TEXT PRIMARY KEY, release TEXT, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS robots (id TEXT PRIMARY KEY, token_hash TEXT NOT NULL UNIQUE, channel TEXT NOT NULL,
    pinned TEXT, created_at REAL NOT NULL, last_seen REAL, running TEXT, status TEXT);
CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, robot TEXT,
    channel TEXT, kind TEXT NOT NULL, release TEXT, previous TEXT, detail TEXT);
"""


class RegistryError(BadInput, ValueError):
    """A request the registry refuses: a bad name, or a request that says nothing to do."""


class RegistryNotFound(NotFound, RegistryError):
    """No release, channel or robot of that name, or nothing earlier to roll back to."""


class RegistryConflict(Conflict, RegistryError):
    """A release or robot name that is taken."""


class BadReport(Unprocessable, RegistryError):
    """A robot's heartbeat the registry will not keep: too deep, too large, or naming a malformed release."""


@dataclass(frozen=True)
class Assignment:
    """What one robot should run. `release` is None while its channel has no release yet."""

    robot: str
    channel: str
    pinned: bool
    release: str | None
    manifest: dict[str, Any] | None


def check_name(kind: str, name: str) -> str:
    """Raises RegistryError unless `name` is 1-64 of [A-Za-z0-9._-] starting with a letter or digit."""
    if not isinstance(name, str) or not NAME.match(name):
        raise RegistryError(f"bad {kind} name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return name


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Registry:
    """Thread-safe: one SQLite connection behind a lock (the service is one process)."""

    def __init__(self, path: Path) -> None:
        private_dir(Path(path).parent)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.RLock()
        self._version = 0  # bumped by every change that may alter an assignment
        self._closing = False
        for channel in DEFAULT_CHANNELS:
            self._db.execute("INSERT OR IGNORE INTO channels VALUES (?, NULL, ?)", (channel, time.time()))

    def release_waiters(self) -> None:
        """Answer every long-poll now and all later ones at once (the service is shutting down)."""
        self._closing = True

    def close(self) -> None:
        self.release_waiters()
        self._db.close()

    def _tx(self, sql_params: list[tuple[str, tuple]], wakes_polls: bool = True) -> None:
        """Run the statements as one transaction. `wakes_polls`: it may change an assignment, so long-polls look
        again (heartbeats and robot events do not: they would wake every waiting robot every few seconds)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in sql_params:
                    self._db.execute(sql, params)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            if wakes_polls:
                self._version += 1

    def _one(self, sql: str, params: tuple = ()) -> sqlite3.Row | None:
        with self._lock:
            return self._db.execute(sql, params).fetchone()

    def _all(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    @staticmethod
    def _event(
        kind: str,
        robot: str | None = None,
        channel: str | None = None,
        release: str | None = None,
        previous: str | None = None,
        detail: str | None = None,
    ) -> tuple[str, tuple]:
        return (
            "INSERT INTO events (at, robot, channel, kind, release, previous, detail) VALUES (?,?,?,?,?,?,?)",
            (time.time(), robot, channel, kind, release, previous, detail),
        )

    # -- releases ------------------------------------------------------------------------------------------
    def add_release(self, signed: SignedManifest, by: str = "") -> None:
        """Register a release. The same manifest again is a no-op; another manifest under a used name is a conflict.

        Raises:
            RegistryConflict: a different release already has this name (release names are immutable).
        """
        m = signed.manifest
        raw = json.dumps(signed.to_dict(), sort_keys=True)
        with self._lock:  # check and insert as one: two publishes racing for a name get a conflict, not a crash
            existing = self._one("SELECT manifest FROM releases WHERE name = ?", (m.name,))
            if existing is not None:
                if existing["manifest"] != raw:
                    raise RegistryConflict(f"release {m.name!r} exists with other contents; publish under a new name")
                return
            self._tx(
                [
                    (
                        "INSERT INTO releases VALUES (?,?,?,?,?,?)",
                        (m.name, raw, signed.key_id, m.checkpoint, m.created_at, time.time()),
                    ),
                    self._event("publish", release=m.name, detail=f"{m.checkpoint} by {by}".strip()),
                ]
            )

    def release(self, name: str) -> dict[str, Any]:
        """Raises RegistryNotFound."""
        row = self._one("SELECT * FROM releases WHERE name = ?", (check_release_name(name),))
        if row is None:
            raise RegistryNotFound(f"no release {name!r}; publish it with `robotloop deploy publish`")
        return {**dict(row), "manifest": json.loads(row["manifest"])}

    def releases(self) -> list[dict[str, Any]]:
        rows = self._all(
            "SELECT name, key_id, checkpoint, created_at, published_at FROM releases ORDER BY published_at"
        )
        return [dict(r) for r in rows]

    # -- channels ------------------------------------------------------------------------------------------
    def channels(self) -> dict[str, str | None]:
        return {r["name"]: r["release"] for r in self._all("SELECT name, release FROM channels ORDER BY name")}

    def promote(self, channel: str, release: str, by: str = "", reason: str = "") -> str | None:
        """Point `channel` (created if new) at `release`. Returns the release it pointed at before.

        Raises:
            RegistryNotFound: no such release. RegistryError: a bad channel name.
        """
        check_name("channel", channel)
        self.release(release)
        with self._lock:
            row = self._one("SELECT release FROM channels WHERE name = ?", (channel,))
            previous = row["release"] if row else None
            upsert = (
                "INSERT INTO channels VALUES (?,?,?) ON CONFLICT(name) DO UPDATE SET release = excluded.release, "
                "updated_at = excluded.updated_at"
            )
            self._tx(
                [
                    (upsert, (channel, release, time.time())),
                    self._event(
                        "promote",
                        channel=channel,
                        release=release,
                        previous=previous,
                        detail=f"{reason} (by {by})" if by else reason,
                    ),
                ]
            )
        return previous

    def rollback_channel(self, channel: str, by: str = "", reason: str = "") -> str:
        """Point `channel` back at the release it had before its current one. Returns that release.

        Raises:
            RegistryNotFound: unknown channel, or no earlier release to go back to.
        """
        with self._lock:
            current = self.channels().get(check_name("channel", channel), "<none>")
            if current == "<none>":
                raise RegistryNotFound(f"no channel {channel!r}")
            target = self._previous_of(channel, current)
            if target is None:
                what = f"no release before {current!r}" if current else "no release yet"
                raise RegistryNotFound(f"channel {channel!r} has {what}: nothing to roll back to")
            self._tx(
                [
                    ("UPDATE channels SET release = ?, updated_at = ? WHERE name = ?", (target, time.time(), channel)),
                    self._event(
                        "rollback",
                        channel=channel,
                        release=target,
                        previous=current,
                        detail=f"{reason} (by {by})" if by else reason,
                    ),
                ]
            )
        return target

    def _previous_of(self, channel: str, current: str | None) -> str | None:
        # The newest release the channel pointed at before `current`, skipping releases whose latest word on this
        # channel is a rollback away from them (one promoted again since counts again).
        events = self._all(
            "SELECT kind, release, previous FROM events WHERE channel = ? AND kind IN "
            "('promote', 'rollback') ORDER BY id DESC",
            (channel,),
        )
        left: dict[str, bool] = {}  # release -> its newest event left it (True) or chose it (False)
        for e in events:
            if e["release"]:
                left.setdefault(e["release"], False)
            if e["kind"] == "rollback" and e["previous"]:
                left.setdefault(e["previous"], True)
        return next(
            (
                e["release"]
                for e in events
                if e["release"] and e["release"] != current and not left.get(e["release"], False)
            ),
            None,
        )

    # -- robots --------------------------------------------------------------------------------------------
    def register_robot(self, robot: str, channel: str = "stable", rotate: bool = False, by: str = "") -> str:
        """Register a robot on `channel` and return its new token (shown once; only its hash is kept).

        Raises:
            RegistryConflict: the robot exists and `rotate` is False. RegistryError: bad names.
        """
        check_name("robot", robot)
        check_name("channel", channel)
        token = f"rlr_{secrets.token_urlsafe(32)}"
        exists = self._one("SELECT id FROM robots WHERE id = ?", (robot,)) is not None
        if exists and not rotate:
            raise RegistryConflict(
                f"robot {robot!r} is registered; register it again with rotate (CLI: --rotate) to issue it a new token"
            )
        if exists:
            self._tx(
                [
                    ("UPDATE robots SET token_hash = ? WHERE id = ?", (hash_token(token), robot)),
                    self._event("token_rotated", robot=robot, detail=f"by {by}"),
                ]
            )
        else:
            self._tx(
                [
                    (
                        "INSERT INTO robots (id, token_hash, channel, created_at) VALUES (?,?,?,?)",
                        (robot, hash_token(token), channel, time.time()),
                    ),
                    self._event("register", robot=robot, channel=channel, detail=f"by {by}"),
                ]
            )
        return token

    def robot_for_token(self, token: str) -> str | None:
        row = self._one("SELECT id FROM robots WHERE token_hash = ?", (hash_token(token),))
        return row["id"] if row else None

    def robot(self, robot: str) -> dict[str, Any]:
        """The robot's row without its token hash, plus its assignment. Raises RegistryNotFound."""
        row = self._one("SELECT * FROM robots WHERE id = ?", (robot,))
        if row is None:
            raise RegistryNotFound(f"no robot {robot!r}; register it with `robotloop deploy register`")
        out = {k: row[k] for k in row.keys() if k != "token_hash"}  # noqa: SIM118 (sqlite3.Row iterates values)
        out["status"] = json.loads(row["status"]) if row["status"] else None
        out["assigned"] = self.assignment(robot).release
        return out

    def robots(self) -> list[dict[str, Any]]:
        return [self.robot(r["id"]) for r in self._all("SELECT id FROM robots ORDER BY id")]

    def assign(
        self, robot: str, channel: str | None = None, release: str | None = None, unpin: bool = False, by: str = ""
    ) -> Assignment:
        """Move a robot to `channel` and/or pin it to `release` (`unpin` follows the channel again).

        Raises:
            RegistryNotFound: unknown robot or release. RegistryError: bad names, or nothing to change.
        """
        row = self._one("SELECT channel, pinned FROM robots WHERE id = ?", (robot,))
        if row is None:
            raise RegistryNotFound(f"no robot {robot!r}")
        if channel is None and release is None and not unpin:
            raise RegistryError("say what to assign: a channel, a release to pin, or unpin")
        new_channel = check_name("channel", channel) if channel is not None else row["channel"]  # "" is a bad name
        pinned = None if unpin else (release if release is not None else row["pinned"])
        if release is not None:
            self.release(release)
        self._tx(
            [
                ("UPDATE robots SET channel = ?, pinned = ? WHERE id = ?", (new_channel, pinned, robot)),
                self._event("assign", robot=robot, channel=new_channel, release=pinned, detail=f"by {by}"),
            ]
        )
        return self.assignment(robot)

    def rollback_robot(self, robot: str, by: str = "", reason: str = "") -> Assignment:
        """Pin a robot to the last release it ran before its current one, skipping releases it refused or rolled
        back from by itself, unless it ran them well later (the newest verdict on a release counts).

        Raises:
            RegistryNotFound: unknown robot, or it never ran an earlier good release.
        """
        current = self.robot(robot)["running"]
        events = self._all(
            "SELECT kind, release, previous FROM events WHERE robot = ? AND kind IN "
            "('swap', 'rollback', 'refused') ORDER BY id DESC",
            (robot,),
        )
        good: dict[str | None, bool] = {}  # release -> its newest verdict (events come newest first)
        for e in events:
            if e["kind"] == "rollback":
                good.setdefault(e["previous"], False)  # rolled back from it ...
            good.setdefault(e["release"], e["kind"] != "refused")  # ... to a release it then ran
        ran = [e["release"] for e in events if e["kind"] in ("swap", "rollback")]
        target = next((r for r in ran if r and r != current and good[r]), None)
        if target is None:
            what = f"before {current!r}" if current else "yet"
            raise RegistryNotFound(f"robot {robot!r} has not run a good release {what}: nothing to roll back to")
        self._tx(
            [
                ("UPDATE robots SET pinned = ? WHERE id = ?", (target, robot)),
                self._event(
                    "rollback_command",
                    robot=robot,
                    release=target,
                    previous=current,
                    detail=f"{reason} (by {by})" if by else reason,
                ),
            ]
        )
        return self.assignment(robot)

    def assignment(self, robot: str) -> Assignment:
        """Raises RegistryNotFound."""
        channel, pinned, release = self._assigned(robot)
        manifest = self.release(release)["manifest"] if release else None
        return Assignment(robot, channel, pinned, release, manifest)

    def _assigned(self, robot: str) -> tuple[str, bool, str | None]:
        """(channel, pinned, release) without the manifest: what a long-poll compares on each wake-up."""
        row = self._one(
            "SELECT r.channel, r.pinned, c.release FROM robots r LEFT JOIN channels c ON c.name = r.channel"
            " WHERE r.id = ?",
            (robot,),
        )
        if row is None:
            raise RegistryNotFound(f"no robot {robot!r}")
        return row["channel"], row["pinned"] is not None, row["pinned"] or row["release"]

    async def wait_assignment(self, robot: str, known: str | None, wait_s: float, every_s: float = 0.1) -> Assignment:
        """The robot's assignment as soon as it differs from `known`, or after `wait_s` (long-poll).

        A coroutine that looks at the version every `every_s` and at the database only when the version moved:
        a fleet of robots waiting holds no threads (a thread each would exhaust a server's pool at 40 robots).

        Raises RegistryNotFound.
        """
        deadline, seen = time.monotonic() + wait_s, None
        while not self._closing:
            version = self._version  # read before looking: a change after this is seen on the next turn
            if version != seen:
                seen = version
                if (await asyncio.to_thread(self._assigned, robot))[2] != known:
                    break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await asyncio.sleep(min(every_s, left))
        return await asyncio.to_thread(self.assignment, robot)

    def heartbeat(self, robot: str, running: str | None, status: dict[str, Any]) -> None:
        """Record what a robot runs now and its figures (control rate, health, ...).

        Raises BadReport: a status over MAX_STATUS_BYTES or a malformed release name.
        """
        if json_depth(status) > MAX_JSON_DEPTH:  # stored, then served to operators: deep nesting breaks the encoder
            raise BadReport(f"heartbeat status nests deeper than {MAX_JSON_DEPTH} levels")
        raw = json.dumps(status)
        if len(raw) > MAX_STATUS_BYTES:
            raise BadReport(f"heartbeat status is {len(raw)} bytes of JSON; at most {MAX_STATUS_BYTES}")
        self._tx(
            [
                (
                    "UPDATE robots SET last_seen = ?, running = ?, status = ? WHERE id = ?",
                    (time.time(), _release_name(running), raw, robot),
                )
            ],
            wakes_polls=False,
        )

    def robot_event(self, robot: str, kind: str, release: str | None, previous: str | None, detail: str) -> None:
        """A robot's own report: swap, rollback (automatic, with the reason), refused (bad release)."""
        if kind not in ("swap", "rollback", "refused"):
            raise RegistryError(f"unknown event kind {kind!r}: swap, rollback or refused")
        release, previous = _release_name(release), _release_name(previous)
        if kind == "swap" and release is not None:
            self.release(release)  # RegistryNotFound: a robot cannot claim to run a release that was never published
        sets = [self._event(kind, robot=robot, release=release, previous=previous, detail=detail[:2000])]
        if kind in ("swap", "rollback"):
            sets.append(("UPDATE robots SET running = ?, last_seen = ? WHERE id = ?", (release, time.time(), robot)))
        self._tx(sets, wakes_polls=False)

    def history(self, robot: str | None = None, channel: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        where, params = [], []
        if robot:
            where.append("robot = ?")
            params.append(robot)
        if channel:
            where.append("channel = ?")
            params.append(channel)
        sql = "SELECT * FROM events" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC LIMIT ?"
        return [dict(r) for r in self._all(sql, (*params, limit))]


def _release_name(name: str | None) -> str | None:
    """A release name a robot reports (None: nothing running). Raises BadReport for a malformed one."""
    if name is None:
        return None
    try:
        return check_release_name(name)
    except BadManifest as error:
        raise BadReport(str(error)) from None
