"""Robots: registration and tokens, assignments (pinned release, else the channel's) with the long-poll that
answers a change at once, and what robots report (heartbeats, swaps, rollbacks, refusals)."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

from ..manifest import MAX_JSON_DEPTH, json_depth
from .channels import ReleaseChannels
from .db import (
    MAX_STATUS_BYTES,
    Assignment,
    BadReport,
    RegistryConflict,
    RegistryDb,
    RegistryError,
    RegistryNotFound,
    check_name,
    decided,
    event,
    hash_token,
    release_name,
)


class Fleet:
    """Owns the ``robots`` table: tokens (only their hash kept), channel and pin of each robot, its assignment and
    the long-poll on it, and the reports robots send. Releases are looked up in `ReleaseChannels`."""

    def __init__(self, db: RegistryDb, releases: ReleaseChannels) -> None:
        self.db, self.releases = db, releases

    def register_robot(self, robot: str, channel: str = "stable", rotate: bool = False, by: str = "") -> str:
        """Register a robot on `channel` and return its new token (shown once; only its hash is kept).

        Raises:
            RegistryConflict: the robot exists and `rotate` is False. RegistryError: bad names.
        """
        check_name("robot", robot)
        check_name("channel", channel)
        token = f"rlr_{secrets.token_urlsafe(32)}"
        with self.db.transaction() as conn:  # the check and the write as one, whichever replica registers too
            exists = conn.execute("SELECT id FROM robots WHERE id = ?", (robot,)).fetchone() is not None
            if exists and not rotate:
                raise RegistryConflict(
                    f"robot {robot!r} is registered; register it again with rotate (CLI: --rotate) to issue it a new "
                    "token"
                )
            if exists:
                conn.execute("UPDATE robots SET token_hash = ? WHERE id = ?", (hash_token(token), robot))
                conn.execute(*event("token_rotated", robot=robot, detail=f"by {by}"))
            else:
                conn.execute(
                    "INSERT INTO robots (id, token_hash, channel, created_at) VALUES (?,?,?,?)",
                    (robot, hash_token(token), channel, time.time()),
                )
                conn.execute(*event("register", robot=robot, channel=channel, detail=f"by {by}"))
        return token

    def robot_for_token(self, token: str) -> str | None:
        row = self.db.one("SELECT id FROM robots WHERE token_hash = ?", (hash_token(token),))
        return row["id"] if row else None

    def robot(self, robot: str) -> dict[str, Any]:
        """The robot's row without its token hash, plus its assignment. Raises RegistryNotFound."""
        row = self.db.one("SELECT * FROM robots WHERE id = ?", (robot,))
        if row is None:
            raise RegistryNotFound(f"no robot {robot!r}; register it with `robotloop deploy register`")
        out = {k: row[k] for k in row.keys() if k != "token_hash"}  # noqa: SIM118 (a row iterates its values)
        out["status"] = json.loads(row["status"]) if row["status"] else None
        out["assigned"] = self.assignment(robot).release
        return out

    def robots(self) -> list[dict[str, Any]]:
        return [self.robot(r["id"]) for r in self.db.all("SELECT id FROM robots ORDER BY id")]

    def assign(
        self, robot: str, channel: str | None = None, release: str | None = None, unpin: bool = False, by: str = ""
    ) -> Assignment:
        """Move a robot to `channel` and/or pin it to `release` (`unpin` follows the channel again).

        Raises:
            RegistryNotFound: unknown robot or release. RegistryError: bad names, or nothing to change.
        """
        with self.db.transaction() as conn:  # what it keeps of the robot's row is what the row holds as it writes
            row = conn.execute("SELECT channel, pinned FROM robots WHERE id = ?", (robot,)).fetchone()
            if row is None:
                raise RegistryNotFound(f"no robot {robot!r}")
            if channel is None and release is None and not unpin:
                raise RegistryError("say what to assign: a channel, a release to pin, or unpin")
            if release is not None:
                self.releases.release(
                    release
                )  # the same connection (the lock is the caller's): inside this transaction
            new_channel = check_name("channel", channel) if channel is not None else row["channel"]  # "": bad name
            pinned = None if unpin else (release if release is not None else row["pinned"])
            conn.execute("UPDATE robots SET channel = ?, pinned = ? WHERE id = ?", (new_channel, pinned, robot))
            conn.execute(*event("assign", robot=robot, channel=new_channel, release=pinned, detail=f"by {by}"))
        return self.assignment(robot)

    def rollback_robot(self, robot: str, by: str = "", reason: str = "") -> Assignment:
        """Pin a robot to the last release it ran before its current one, skipping releases it refused or rolled
        back from by itself, unless it ran them well later (the newest verdict on a release counts).

        Raises:
            RegistryNotFound: unknown robot, or it never ran an earlier good release.
        """
        with self.db.transaction() as conn:  # the history it reads is the one it writes after (see assign)
            current = self.robot(robot)["running"]
            events = self.db.all(
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
            conn.execute("UPDATE robots SET pinned = ? WHERE id = ?", (target, robot))
            conn.execute(*decided("rollback_command", target, current, by, reason, robot=robot))
        return self.assignment(robot)

    def assignment(self, robot: str) -> Assignment:
        """Raises RegistryNotFound."""
        channel, pinned, release = self._assigned(robot)
        manifest = self.releases.release(release)["manifest"] if release else None
        return Assignment(robot, channel, pinned, release, manifest)

    def _assigned(self, robot: str) -> tuple[str, bool, str | None]:
        """(channel, pinned, release) without the manifest: what a long-poll compares on each wake-up."""
        row = self.db.one(
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
        while not self.db.closing:
            version = self.db.version  # read before looking: a change after this is seen on the next turn
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
        self.db.write(
            "UPDATE robots SET last_seen = ?, running = ?, status = ? WHERE id = ?",
            (time.time(), release_name(running), raw, robot),
        )

    def robot_event(self, robot: str, kind: str, release: str | None, previous: str | None, detail: str) -> None:
        """A robot's own report: swap, rollback (automatic, with the reason), refused (bad release)."""
        if kind not in ("swap", "rollback", "refused"):
            raise RegistryError(f"unknown event kind {kind!r}: swap, rollback or refused")
        release, previous = release_name(release), release_name(previous)
        if kind == "swap" and release is not None:
            self.releases.release(
                release
            )  # RegistryNotFound: a robot cannot claim to run a release that was never published
        sets = [event(kind, robot=robot, release=release, previous=previous, detail=detail[:2000])]
        if kind in ("swap", "rollback"):
            sets.append(("UPDATE robots SET running = ?, last_seen = ? WHERE id = ?", (release, time.time(), robot)))
        self.db.tx(sets, wakes_polls=False)
