"""The registry's ground floor: its schema, errors and names, and one SQLite connection behind a lock with the
version that long-polls watch."""

from __future__ import annotations

import hashlib
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import BadInput, Conflict, NotFound, Unprocessable
from ...storage.private import private_dir
from ..manifest import BadManifest, check_release_name

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


def decided(
    kind: str, release: str | None, previous: str | None, by: str, reason: str, **subject: str
) -> tuple[str, tuple]:
    """The history row of an operator's decision (promote, rollback, ...) on a `channel=` or `robot=`: the release
    it moved from and to, and as its detail the reason with who gave it."""
    return event(kind, release=release, previous=previous, detail=f"{reason} (by {by})" if by else reason, **subject)


def event(
    kind: str,
    robot: str | None = None,
    channel: str | None = None,
    release: str | None = None,
    previous: str | None = None,
    detail: str | None = None,
) -> tuple[str, tuple]:
    """The statement that appends one row to the history (`events`), for a `RegistryDb.tx` batch."""
    return (
        "INSERT INTO events (at, robot, channel, kind, release, previous, detail) VALUES (?,?,?,?,?,?,?)",
        (time.time(), robot, channel, kind, release, previous, detail),
    )


def release_name(name: str | None) -> str | None:
    """A release name a robot reports (None: nothing running). Raises BadReport for a malformed one."""
    if name is None:
        return None
    try:
        return check_release_name(name)
    except BadManifest as error:
        raise BadReport(str(error)) from None


class RegistryDb:
    """Owns the registry's database: one SQLite connection behind a lock (the service is one process), transactions
    of several statements, the history (`events`), and `version`, bumped by every change that may alter an
    assignment, which `Fleet.wait_assignment` watches; `closing` answers every long-poll at once."""

    def __init__(self, path: Path) -> None:
        private_dir(Path(path).parent)
        self.conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.executescript(SCHEMA)
        self.lock = threading.RLock()
        self.version = 0  # bumped by every change that may alter an assignment
        self.closing = False
        for channel in DEFAULT_CHANNELS:
            self.conn.execute("INSERT OR IGNORE INTO channels VALUES (?, NULL, ?)", (channel, time.time()))

    def release_waiters(self) -> None:
        """Answer every long-poll now and all later ones at once (the service is shutting down)."""
        self.closing = True

    def close(self) -> None:
        self.release_waiters()
        self.conn.close()

    def tx(self, sql_params: list[tuple[str, tuple]], wakes_polls: bool = True) -> None:
        """Run the statements as one transaction. `wakes_polls`: it may change an assignment, so long-polls look
        again (heartbeats and robot events do not: they would wake every waiting robot every few seconds)."""
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in sql_params:
                    self.conn.execute(sql, params)
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            if wakes_polls:
                self.version += 1

    def one(self, sql: str, params: tuple = ()) -> sqlite3.Row | None:
        with self.lock:
            return self.conn.execute(sql, params).fetchone()

    def all(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        with self.lock:
            return self.conn.execute(sql, params).fetchall()

    def history(self, robot: str | None = None, channel: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The newest `limit` events, of one robot and/or one channel if given."""
        where, params = [], []
        if robot:
            where.append("robot = ?")
            params.append(robot)
        if channel:
            where.append("channel = ?")
            params.append(channel)
        sql = "SELECT * FROM events" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC LIMIT ?"
        return [dict(r) for r in self.all(sql, (*params, limit))]
