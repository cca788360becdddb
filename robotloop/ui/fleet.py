"""The fleet and releases pages: robots, channels, releases with their lineage, and the two writes (promote, roll
back), all read from the deploy service as `robotloop deploy status` and `deploy history` do. A robot that records
its episodes into a fleet dataset says in its heartbeat how many it recorded and dropped, and its last recording
error (`status["recording"]`: `robotloop.fleet.RecordingStats.as_dict()`, sent by `robotloop.deploy.reporter`)."""

from __future__ import annotations

import time
from typing import Any

from ..clients import ServiceClients
from ..deploy.client import robot_row
from .names import path_name
from .runs import RunViews, run_of


class FleetViews:
    """What the deploy service knows, shaped for the fleet and releases pages; the release page adds the loop
    reports and evaluations `runs` finds for the release (beside its run in the bucket, or in the report
    folders)."""

    def __init__(self, clients: ServiceClients, runs: RunViews) -> None:
        self.clients, self.runs = clients, runs

    def overview(self, history: int = 50) -> dict[str, Any]:
        """Channels, releases, every robot (channel, assigned and running release, control rate, health, seconds
        since its last heartbeat) and the latest deploy events, newest first."""
        deploy = self.clients.deploy
        state, now = deploy.status(), time.time()
        return {
            "channels": state["channels"],
            "releases": [r["name"] for r in state["releases"]],
            "robots": [{**robot_row(r, now), "recording": recording_row(r.get("status"))} for r in state["robots"]],
            "events": deploy.history(limit=history),
        }

    def releases(self, history: int = 200) -> dict[str, Any]:
        """Per channel its release and its history (promotions, rollbacks, publishes to it), plus every release."""
        state = self.clients.deploy.status()
        events = self.clients.deploy.history(limit=history)
        channels = {
            name: {"release": release, "events": [e for e in events if e["channel"] == name]}
            for name, release in state["channels"].items()
        }
        return {"channels": channels, "releases": state["releases"]}

    def release(self, name: str) -> dict[str, Any]:
        """One release: its files, lineage (the run, datasets and episodes it was trained on, with Xet hashes), the
        channels and robots on it, its history and the evaluations found for it."""
        deploy = self.clients.deploy
        found = deploy.release(path_name("release", name))
        manifest = found["manifest"]["manifest"]
        state, run = deploy.status(), run_of(found["checkpoint"])
        events = [e for e in deploy.history(limit=500) if name in (e["release"], e["previous"])]
        return {
            "name": name,
            "checkpoint": found["checkpoint"],
            "run": run,
            "key_id": found["key_id"],
            "created_at": found["created_at"],
            "published_at": found["published_at"],
            "files": [{k: f[k] for k in ("path", "size", "xet_hash")} for f in manifest["files"]],
            "lineage": lineage_summary(manifest.get("lineage") or {}),
            "channels": sorted(c for c, r in state["channels"].items() if r == name),
            "robots": [r["id"] for r in state["robots"] if name in (r.get("running"), r.get("assigned"))],
            "events": events,
            "evaluations": [e for e in self.runs.evaluations(run) if _evaluates(e, name, found["checkpoint"])],
            "reports": self.runs.reports(run),
        }

    def promote(self, channel: str, release: str, reason: str) -> dict[str, Any]:
        return self.clients.deploy.promote(path_name("channel", channel), release, reason)

    def rollback(self, channel: str | None, robot: str | None, reason: str) -> dict[str, Any]:
        """Roll a channel back to its previous release, or pin a robot to the one it ran before."""
        if channel is not None:
            return self.clients.deploy.rollback_channel(path_name("channel", channel), reason)
        return self.clients.deploy.rollback_robot(path_name("robot", robot or ""), reason)


RECORDING_COUNTS = ("recorded", "dropped", "unfinished", "not_kept", "not_sampled")  # RecordingStats.FIELDS
MAX_ERROR_CHARS = 400  # RecordingStats keeps 399 bytes of it


def recording_row(status: Any) -> dict[str, Any] | None:
    """A robot's recording, from its last heartbeat's `status`: episodes by outcome (`RECORDING_COUNTS`: a
    count, None where the robot sent no count) and its last error; None when the robot records nothing. A robot
    writes its own heartbeat, so anything else there is shown as nothing rather than failing the page."""
    found = status.get("recording") if isinstance(status, dict) else None
    if not isinstance(found, dict):
        return None
    counts = {k: found.get(k) for k in RECORDING_COUNTS}
    error = found.get("last_error")
    return {
        **{k: v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None for k, v in counts.items()},
        "last_error": error[:MAX_ERROR_CHARS] if isinstance(error, str) and error else None,
    }


def lineage_summary(lineage: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's lineage (`robotloop.train.trainer`'s lineage.json) as the release page shows it: the step,
    the datasets, and each episode trained on with its files' Xet hashes."""
    episodes = [
        {
            "dataset": e.get("dataset"),
            "episode_index": e.get("episode_index"),
            "length": e.get("length"),
            "files": [{k: f.get(k) for k in ("url", "xet_hash", "video_key")} for f in e.get("files", [])],
        }
        for e in lineage.get("episodes") or []
    ]
    return {
        "step": lineage.get("step"),
        "datasets": lineage.get("datasets") or [],
        "episodes": episodes,
        "code": lineage.get("code"),
    }


def _evaluates(evaluation: dict[str, Any], release: str, checkpoint: str) -> bool:
    named = {evaluation.get(k) for k in ("checkpoint", "source", "policy", "release")}
    return release in named or checkpoint in named
