"""HTTP client of the deploy service, for operators (publish, promote, rollback, status) and robots
(assignment long-poll, heartbeats, events). JSON only.

Example:
    ```python
    >>> ops = DeployClient("http://127.0.0.1:8780", token="ops-write-token")
    >>> robot_token = ops.register_robot("r1", channel="stable")
    >>> robot = DeployClient("http://127.0.0.1:8780", robot_token)
    >>> robot.assignment("r1", known=None, wait_s=30)["release"]
    ```
"""

from __future__ import annotations

from typing import Any

from ..service_client import ServiceClient, ServiceError
from .manifest import SignedManifest


class DeployError(ServiceError):
    """The deploy service refused a request or could not be reached; `status` is the HTTP code (0: no answer)."""


class DeployClient(ServiceClient):
    """Operators: `DeployClient.from_settings(settings)` (deploy.url, deploy.token); robots: their own token."""

    service, section, error = "deploy service", "deploy", DeployError
    token_hint = "--deploy-token, ROBOTLOOP_DEPLOY__TOKEN or ROBOTLOOP_ROBOT__TOKEN"

    # -- operators -------------------------------------------------------------------------------------------
    def publish(self, signed: SignedManifest, channel: str | None = None) -> dict[str, Any]:
        return self._call("POST", "/v1/releases", json={"manifest": signed.to_dict(), "channel": channel})

    def promote(self, channel: str, release: str, reason: str = "") -> dict[str, Any]:
        return self._call("POST", f"/v1/channels/{channel}/promote", json={"release": release, "reason": reason})

    def rollback_channel(self, channel: str, reason: str = "") -> dict[str, Any]:
        return self._call("POST", f"/v1/channels/{channel}/rollback", json={"reason": reason})

    def rollback_robot(self, robot: str, reason: str = "") -> dict[str, Any]:
        return self._call("POST", f"/v1/robots/{robot}/rollback", json={"reason": reason})

    def register_robot(self, robot: str, channel: str = "stable", rotate: bool = False) -> str:
        return self._call("POST", "/v1/robots", json={"robot": robot, "channel": channel, "rotate": rotate})["token"]

    def assign(
        self, robot: str, channel: str | None = None, release: str | None = None, unpin: bool = False
    ) -> dict[str, Any]:
        return self._call(
            "PUT", f"/v1/robots/{robot}/assignment", json={"channel": channel, "release": release, "unpin": unpin}
        )

    def release(self, name: str) -> dict[str, Any]:
        """One release as registered, with its signed manifest under "manifest"."""
        return self._call("GET", f"/v1/releases/{name}")

    def status(self) -> dict[str, Any]:
        """Channels, releases and robots in one answer (for `robotloop deploy status`)."""
        return {
            "channels": self._call("GET", "/v1/channels")["channels"],
            "releases": self._call("GET", "/v1/releases")["releases"],
            "robots": self._call("GET", "/v1/robots")["robots"],
        }

    def history(self, robot: str | None = None, channel: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        params = {k: v for k, v in {"robot": robot, "channel": channel, "limit": limit}.items() if v is not None}
        return self._call("GET", "/v1/history", params=params)["events"]

    # -- robots ----------------------------------------------------------------------------------------------
    def robot(self, robot: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/robots/{robot}")

    def assignment(self, robot: str, known: str | None = None, wait_s: float = 0.0) -> dict[str, Any]:
        """The robot's assignment, long-polled: answers when it differs from `known`, or after `wait_s`."""
        params = {"wait_s": wait_s, **({"known": known} if known else {})}
        return self._call("GET", f"/v1/robots/{robot}/assignment", params=params, timeout_s=wait_s + 30)

    def heartbeat(self, robot: str, running: str | None, status: dict[str, Any]) -> None:
        self._call("POST", f"/v1/robots/{robot}/heartbeat", json={"running": running, "status": status})

    def event(self, robot: str, kind: str, release: str | None, previous: str | None, detail: str = "") -> None:
        self._call(
            "POST",
            f"/v1/robots/{robot}/events",
            json={"kind": kind, "release": release, "previous": previous, "detail": detail},
        )


def robot_row(robot: dict[str, Any], now: float) -> dict[str, Any]:
    """One robot of `DeployClient.status()` as the dashboard and the agent show it: its heartbeat's figures
    flattened beside its channel and releases, and how long ago it was last seen (at `now`)."""
    status = robot.get("status") or {}
    seen = robot.get("last_seen")
    return {
        "id": robot["id"],
        "channel": robot["channel"],
        "pinned": robot.get("pinned"),
        "assigned": robot.get("assigned"),
        "running": robot.get("running"),
        "control_hz": status.get("control_hz"),
        "max_gap_ms": status.get("max_gap_ms"),
        "health": status.get("health"),
        "probation": status.get("probation"),
        "episodes": status.get("episodes"),
        "refused": status.get("refused") or [],
        "last_seen_s_ago": round(now - seen, 1) if seen else None,
    }


def describe_event(kind: str, release: str | None, previous: str | None, detail: str = "") -> str:
    """A robot's event in words, its fields as the registry records them: a swap to `release` from `previous`, a
    rollback to `release` from `previous`, `release` refused while `previous` runs.

    Example:
        ```python
        >>> describe_event("swap", "v7", "v6"), describe_event("swap", "v7", None)
        ('swap v6 -> v7', 'swap to v7')
        >>> describe_event("rollback", "v6", "v7", "health check: ...")
        'rollback v7 -> v6: health check: ...'
        ```
    """
    if kind == "refused":
        text = f"refused {release or 'a release'}" + (f" ({previous} keeps running)" if previous else "")
    elif kind in ("swap", "rollback"):
        to = release or "no release"
        text = f"{kind} {previous} -> {to}" if previous else f"{kind} to {to}"
    else:
        text = f"{kind} {release or ''}".strip()
    return f"{text}: {detail}" if detail else text
