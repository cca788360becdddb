"""Releases and channels: signed manifests registered once under immutable names, and channels (canary, stable,
...) that point at one of them, promoted and rolled back with the reason kept in the history."""

from __future__ import annotations

import json
import time
from typing import Any

from ..manifest import SignedManifest, check_release_name
from .db import RegistryConflict, RegistryDb, RegistryNotFound, check_name, decided, event


class ReleaseChannels:
    """Owns the ``releases`` and ``channels`` tables: publishing a release, looking one up, promoting a channel to
    a release and rolling it back to the one it had before."""

    def __init__(self, db: RegistryDb) -> None:
        self.db = db

    def add_release(self, signed: SignedManifest, by: str = "") -> None:
        """Register a release. The same manifest again is a no-op; another manifest under a used name is a conflict.

        Raises:
            RegistryConflict: a different release already has this name (release names are immutable).
        """
        m = signed.manifest
        raw = json.dumps(signed.to_dict(), sort_keys=True)
        # Check and insert in one transaction: two publishes racing for a name (on one replica or two) get a
        # conflict, not a crash.
        with self.db.transaction(wakes_polls=False) as conn:
            existing = conn.execute("SELECT manifest FROM releases WHERE name = ?", (m.name,)).fetchone()
            if existing is not None:
                if existing["manifest"] != raw:
                    raise RegistryConflict(f"release {m.name!r} exists with other contents; publish under a new name")
                return
            conn.execute(
                "INSERT INTO releases VALUES (?,?,?,?,?,?)",
                (m.name, raw, signed.key_id, m.checkpoint, m.created_at, time.time()),
            )
            conn.execute(*event("publish", release=m.name, detail=f"{m.checkpoint} by {by}".strip()))

    def release(self, name: str) -> dict[str, Any]:
        """Raises RegistryNotFound."""
        row = self.db.one("SELECT * FROM releases WHERE name = ?", (check_release_name(name),))
        if row is None:
            raise RegistryNotFound(f"no release {name!r}; publish it with `robotloop deploy publish`")
        return {**dict(row), "manifest": json.loads(row["manifest"])}

    def releases(self) -> list[dict[str, Any]]:
        rows = self.db.all(
            "SELECT name, key_id, checkpoint, created_at, published_at FROM releases ORDER BY published_at"
        )
        return [dict(r) for r in rows]

    # -- channels ------------------------------------------------------------------------------------------
    def channels(self) -> dict[str, str | None]:
        return {r["name"]: r["release"] for r in self.db.all("SELECT name, release FROM channels ORDER BY name")}

    def promote(self, channel: str, release: str, by: str = "", reason: str = "") -> str | None:
        """Point `channel` (created if new) at `release`. Returns the release it pointed at before.

        Raises:
            RegistryNotFound: no such release. RegistryError: a bad channel name.
        """
        check_name("channel", channel)
        self.release(release)
        # The release before is read in the transaction that moves the channel: with two replicas promoting at once,
        # each history row names the release its own promote replaced.
        with self.db.transaction() as conn:
            row = conn.execute("SELECT release FROM channels WHERE name = ?", (channel,)).fetchone()
            previous = row["release"] if row else None
            upsert = (
                "INSERT INTO channels VALUES (?,?,?) ON CONFLICT(name) DO UPDATE SET release = excluded.release, "
                "updated_at = excluded.updated_at"
            )
            conn.execute(upsert, (channel, release, time.time()))
            conn.execute(*decided("promote", release, previous, by, reason, channel=channel))
        return previous

    def rollback_channel(self, channel: str, by: str = "", reason: str = "") -> str:
        """Point `channel` back at the release it had before its current one. Returns that release.

        Raises:
            RegistryNotFound: unknown channel, or no earlier release to go back to.
        """
        check_name("channel", channel)
        with self.db.transaction() as conn:  # reads the channel and its history where it writes (see promote)
            current = self.channels().get(channel, "<none>")
            if current == "<none>":
                raise RegistryNotFound(f"no channel {channel!r}")
            target = self._previous_of(channel, current)
            if target is None:
                what = f"no release before {current!r}" if current else "no release yet"
                raise RegistryNotFound(f"channel {channel!r} has {what}: nothing to roll back to")
            conn.execute(
                "UPDATE channels SET release = ?, updated_at = ? WHERE name = ?", (target, time.time(), channel)
            )
            conn.execute(*decided("rollback", target, current, by, reason, channel=channel))
        return target

    def _previous_of(self, channel: str, current: str | None) -> str | None:
        # The newest release the channel pointed at before `current`, skipping releases whose latest word on this
        # channel is a rollback away from them (one promoted again since counts again).
        events = self.db.all(
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
