"""The deploy service's state, in SQLite or PostgreSQL: releases, channels, robots, assignments, heartbeats, history.

    releases(name, manifest, key_id, checkpoint, created_at, published_at)   signed manifests, immutable
    channels(name, release, updated_at)                                     e.g. canary -> v3, stable -> v2
    robots(id, token_hash, channel, pinned, created_at, last_seen, running, status)
    events(id, at, robot, channel, kind, release, previous, detail)         the history, append-only

A robot's assignment is its pinned release if any, else its channel's release. Robot tokens are random
secrets shown once at registration; only their SHA-256 is stored. Every change that can alter an assignment
bumps a version that the long-polls (`wait_assignment`, a coroutine: a waiting robot holds no thread) watch.
On PostgreSQL (``Registry("postgresql://...")``) several replicas of the service share the state: writers go one at a
time, and each replica's long-polls follow the others' changes (`RegistryDb`).

Example:
    ```python
    >>> registry = Registry(Path("deploy.sqlite"))
    >>> registry.add_release(signed)                 # a SignedManifest
    >>> registry.promote("stable", "v1", by="ops")
    >>> token = registry.register_robot("r1", channel="stable")
    >>> registry.assignment("r1").release
    'v1'
    ```

The pieces: `db` (schema, errors, the connection and the history), `release_channels` (releases and channels), `fleet`
(robots, assignments, reports). `Registry` puts them together behind one object, which is what the service calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..manifest import SignedManifest
from .channels import ReleaseChannels
from .db import (
    DEFAULT_CHANNELS,
    MAX_STATUS_BYTES,
    Assignment,
    BadReport,
    RegistryConflict,
    RegistryDb,
    RegistryError,
    RegistryNotFound,
    check_name,
    hash_token,
)
from .fleet import Fleet

__all__ = [
    "DEFAULT_CHANNELS",
    "MAX_STATUS_BYTES",
    "Assignment",
    "BadReport",
    "Registry",
    "RegistryConflict",
    "RegistryError",
    "RegistryNotFound",
    "check_name",
    "hash_token",
]


class Registry:
    """The deploy service's state: `release_channels` (releases and channels) and `fleet` (robots) over one `db`.
    Thread-safe: one connection behind a lock. `database`: a SQLite file, or a ``postgresql://`` URL.

    Raises:
        BadDatabaseUrl, DatabaseUnavailable: a PostgreSQL URL that is malformed or refuses the connection.
    """

    def __init__(self, database: Path | str) -> None:
        self.db = RegistryDb(database)
        self.release_channels = ReleaseChannels(self.db)
        self.fleet = Fleet(self.db, self.release_channels)

    def release_waiters(self) -> None:
        """Answer every long-poll now and all later ones at once (the service is shutting down)."""
        self.db.release_waiters()

    def close(self) -> None:
        self.db.close()

    def history(self, robot: str | None = None, channel: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The newest events, of one robot and/or channel if given (`RegistryDb.history`)."""
        return self.db.history(robot, channel, limit)

    # -- releases and channels: see ReleaseChannels ----------------------------------------------------------
    def add_release(self, signed: SignedManifest, by: str = "") -> None:
        """Register a release; another manifest under a used name is a conflict (`ReleaseChannels.add_release`)."""
        self.release_channels.add_release(signed, by)

    def release(self, name: str) -> dict[str, Any]:
        """A release with its manifest. Raises RegistryNotFound."""
        return self.release_channels.release(name)

    def releases(self) -> list[dict[str, Any]]:
        return self.release_channels.releases()

    def channels(self) -> dict[str, str | None]:
        return self.release_channels.channels()

    def promote(self, channel: str, release: str, by: str = "", reason: str = "") -> str | None:
        """Point `channel` at `release`; returns the release before (`ReleaseChannels.promote`)."""
        return self.release_channels.promote(channel, release, by, reason)

    def rollback_channel(self, channel: str, by: str = "", reason: str = "") -> str:
        """Point `channel` back at its earlier release (`ReleaseChannels.rollback_channel`)."""
        return self.release_channels.rollback_channel(channel, by, reason)

    # -- robots: see Fleet ------------------------------------------------------------------------------------
    def register_robot(self, robot: str, channel: str = "stable", rotate: bool = False, by: str = "") -> str:
        """Register a robot and return its new token, shown once (`Fleet.register_robot`)."""
        return self.fleet.register_robot(robot, channel, rotate, by)

    def robot_for_token(self, token: str) -> str | None:
        return self.fleet.robot_for_token(token)

    def robot(self, robot: str) -> dict[str, Any]:
        """The robot's row without its token hash, plus its assignment. Raises RegistryNotFound."""
        return self.fleet.robot(robot)

    def robots(self) -> list[dict[str, Any]]:
        return self.fleet.robots()

    def assign(
        self, robot: str, channel: str | None = None, release: str | None = None, unpin: bool = False, by: str = ""
    ) -> Assignment:
        """Move a robot to a channel and/or pin or unpin its release (`Fleet.assign`)."""
        return self.fleet.assign(robot, channel, release, unpin, by)

    def rollback_robot(self, robot: str, by: str = "", reason: str = "") -> Assignment:
        """Pin a robot to the last good release it ran before (`Fleet.rollback_robot`)."""
        return self.fleet.rollback_robot(robot, by, reason)

    def assignment(self, robot: str) -> Assignment:
        """Raises RegistryNotFound."""
        return self.fleet.assignment(robot)

    async def wait_assignment(self, robot: str, known: str | None, wait_s: float, every_s: float = 0.1) -> Assignment:
        """The robot's assignment once it differs from `known`, or after `wait_s` (`Fleet.wait_assignment`)."""
        return await self.fleet.wait_assignment(robot, known, wait_s, every_s)

    def heartbeat(self, robot: str, running: str | None, status: dict[str, Any]) -> None:
        """Record what a robot runs now and its figures (`Fleet.heartbeat`). Raises BadReport."""
        self.fleet.heartbeat(robot, running, status)

    def robot_event(self, robot: str, kind: str, release: str | None, previous: str | None, detail: str) -> None:
        """A robot's own report: swap, rollback or refused (`Fleet.robot_event`)."""
        self.fleet.robot_event(robot, kind, release, previous, detail)
