"""The runs and reports pages: training jobs and their progress (from the training service, as `robotloop trainer
watch` reads them), a run's checkpoints in its bucket, and the loop reports and evaluations in the report folders
on this machine."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..clients import ServiceClients
from ..storage import BucketUrl
from ..storage import NotFound as StorageNotFound
from ..train.progress import JOB_FIELDS
from .names import UnknownItem, path_name


class RunViews:
    """Training runs and what came of them: jobs, their loss curves and checkpoints, and the loop reports
    (`report.md`) and evaluations (`eval_report.json`) found under `report_dirs`. A report is named by a hash of
    its folder, and only the figures and videos listed in its folder are served, never a path."""

    def __init__(self, clients: ServiceClients, report_dirs: list[Path]) -> None:
        self.clients, self.report_dirs = clients, report_dirs

    # -- training ----------------------------------------------------------------------------------------------
    def jobs(self) -> list[dict[str, Any]]:
        """Every training job this dashboard's token may see, newest first."""
        return [job_row(s) for s in reversed(self.clients.trainer.jobs())]

    def job(self, job_id: str, after_step: int = -1) -> dict[str, Any]:
        """A job's state and its progress reports past `after_step` (the loss curve grows by them)."""
        trainer = self.clients.trainer
        points = trainer.progress(path_name("job", job_id), after_step)
        keep = ("step", "loss", "samples_per_s", "data_wait_share", "elapsed_s")
        return {"job": job_row(trainer.job(job_id)), "points": [{k: p[k] for k in keep} for p in points]}

    def checkpoints(self, output: str) -> list[dict[str, Any]]:
        """A run's checkpoint folders in its bucket, newest first, and which one `last.json` names."""
        url = BucketUrl.parse(output) / "checkpoints"
        try:
            found = self.clients.bucket.ls(url)
        except StorageNotFound:
            return []
        steps = sorted((u.name for u in found if isinstance(u, BucketUrl) and u.name.isdigit()), reverse=True)
        return [{"step": int(s), "url": str(url / s)} for s in steps]

    # -- reports on this machine -------------------------------------------------------------------------------
    def reports(self, run_url: str | None = None) -> list[dict[str, Any]]:
        """The loop reports (`report.md`, as `robotloop loop` writes them) under the report folders, newest first;
        with `run_url`, only those of that training run (its output folder, `<bucket>/models/<run>`)."""
        out = []
        for path in self._found("report.md"):
            summary = _read_json(path.parent / "report.json")
            settings = summary.get("settings") or {}
            out.append(
                {
                    "id": report_id(path.parent),
                    "dir": str(path.parent),
                    "run": settings.get("run"),
                    "run_url": loop_run_url(settings),
                    "release": summary.get("release"),
                    "modified": path.stat().st_mtime,
                }
            )
        if run_url is not None:
            out = [r for r in out if r["run_url"] is not None and r["run_url"] == run_url.rstrip("/")]
        return sorted(out, key=lambda r: -r["modified"])

    def report(self, report_id: str) -> dict[str, Any]:
        """A loop report's Markdown, its figures' names and its summary.

        Raises:
            UnknownItem: no report with that id.
        """
        folder = self._report_dir(report_id)
        return {
            "id": report_id,
            "dir": str(folder),
            "markdown": (folder / "report.md").read_text(errors="replace"),
            "summary": _read_json(folder / "report.json"),
        }

    def report_file(self, report_id: str, name: str) -> Path:
        """A PNG or MP4 a report or evaluation shows: only names listed in its folder, never a path.

        Raises:
            UnknownItem: no such report, or no such figure or video in it.
        """
        folder = self._report_dir(report_id)
        allowed = {p.name: p for p in _media(folder)}
        if name not in allowed:
            raise UnknownItem(f"report {report_id} has no file {name!r}")
        return allowed[name]

    def evaluations(self) -> list[dict[str, Any]]:
        """The evaluations (`eval_report.json`) under the report folders: policy, success with its 95% interval,
        and the rollout videos recorded."""
        out = []
        for path in self._found("eval_report.json"):
            data = _read_json(path)
            summary = data.get("summary") or {}
            videos = [Path(e["video"]).name for e in data.get("episodes", []) if e.get("video")]
            out.append(
                {
                    "id": report_id(path.parent),
                    "policy": data.get("policy"),
                    "source": data.get("source"),
                    "checkpoint": data.get("checkpoint"),
                    "task": data.get("task"),
                    "episodes": summary.get("n_episodes"),
                    "success_rate": summary.get("success_rate"),
                    "success_ci95": summary.get("success_ci95"),
                    "mean_max_reward": summary.get("mean_max_reward"),
                    "videos": [v for v in videos if v in {p.name for p in _media(path.parent)}],
                }
            )
        return out

    def _found(self, name: str) -> list[Path]:
        return sorted({p.resolve() for d in self.report_dirs if d.is_dir() for p in d.rglob(name)})

    def _report_dir(self, wanted: str) -> Path:
        for marker in ("report.md", "eval_report.json"):
            for path in self._found(marker):
                if report_id(path.parent) == wanted:
                    return path.parent
        raise UnknownItem(f"no report {wanted!r} under {', '.join(map(str, self.report_dirs)) or 'no folder'}")


def job_row(state: dict[str, Any]) -> dict[str, Any]:
    """A training job as the runs page lists it (the service's state, the spec's essentials beside it)."""
    spec = state.get("spec") or {}
    keep = ("id", "status", *JOB_FIELDS, "exit_code", "message", "created_at")
    return {
        **{k: state.get(k) for k in keep},
        "steps": spec.get("steps"),
        "output": spec.get("output"),
        "datasets": spec.get("datasets") or [],
    }


def loop_run_url(settings: dict[str, Any]) -> str | None:
    """The training run a loop report's settings name (`LoopSettings.run_url`: `<bucket>/models/<run>`), or None
    when they name none."""
    bucket, run = settings.get("bucket"), settings.get("run")
    if not isinstance(bucket, str) or not isinstance(run, str) or not bucket or not run:
        return None
    return f"{bucket.rstrip('/')}/models/{run}"


def report_id(folder: Path) -> str:
    """The id pages name a report or evaluation folder by: a hash, so no path of this machine is in a URL."""
    return hashlib.sha256(str(folder).encode()).hexdigest()[:12]


def _media(folder: Path) -> list[Path]:
    return [p for p in (*folder.glob("*.png"), *folder.glob("videos/*.mp4")) if p.is_file()]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
