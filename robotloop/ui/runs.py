"""The runs and reports pages: training jobs and their progress (from the training service, as `robotloop trainer
watch` reads them), a run's checkpoints in its bucket, and the loop reports and evaluations: those `robotloop loop`
uploaded beside the runs the dashboard knows (`<run>/report/` in the bucket; `bucket_reports.py`) and those in the
report folders on this machine. A rounds report (`robotloop.rounds.report`: report.json with `rounds`) also gives
its table of rounds (`rounds_rows`)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path, PurePosixPath
from typing import Any

from ..clients import ServiceClients
from ..errors import RobotloopError
from ..rounds import NOT_TRAINED
from ..storage import BucketUrl
from ..storage import NotFound as StorageNotFound
from ..train.progress import JOB_FIELDS
from .bucket_reports import EVALUATION, MARKDOWN, SUMMARY, BucketReport, BucketReports, report_id
from .names import UnknownItem, path_name

log = logging.getLogger("robotloop.ui")


class RunViews:
    """Training runs and what came of them: jobs, their loss curves and checkpoints, and the loop reports
    (`report.md`) and evaluations (`eval_report.json`) uploaded beside the runs (training jobs' outputs, releases'
    runs) or found under `report_dirs`. A report is named by a hash of its folder or URL, and only the figures and
    videos listed in it are served, never a path; a run's bucket listing is kept `listing_ttl_s` seconds."""

    def __init__(self, clients: ServiceClients, report_dirs: list[Path], listing_ttl_s: float = 10.0) -> None:
        self.clients, self.report_dirs = clients, report_dirs
        self.bucket = BucketReports(clients, listing_ttl_s)

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

    # -- reports, in the bucket and on this machine -------------------------------------------------------
    def known_runs(self) -> list[str]:
        """The training runs the dashboard knows: its training jobs' outputs and its releases' runs (the folders
        of their checkpoints). A service this dashboard cannot read (no trainer token) adds none."""
        found: list[str] = []
        try:
            found += [j["output"] for j in self.jobs() if isinstance(j.get("output"), str)]
        except RobotloopError as err:
            log.info("dashboard: no training runs from the training service: %s", err)
        try:
            found += [run_of(r["checkpoint"]) for r in self.clients.deploy.status()["releases"]]
        except RobotloopError as err:
            log.info("dashboard: no release runs from the deploy service: %s", err)
        return list(dict.fromkeys(r.rstrip("/") for r in found))

    def reports(self, run_url: str | None = None) -> list[dict[str, Any]]:
        """The loop reports (`report.md`, as `robotloop loop` writes them), newest first: those uploaded beside the
        runs the dashboard knows (`<run>/report` in their buckets) and those under the report folders; with
        `run_url`, only those of that training run (its output folder, `<bucket>/models/<run>`)."""
        out = [self._bucket_row(r) for r in self.bucket.find_all(self.known_runs() if run_url is None else [run_url])]
        out = [r for r in out if r is not None]
        for path in self._found("report.md"):
            summary = _read_json(path.parent / "report.json")
            settings = summary.get("settings") or {}
            out.append(
                {
                    "id": report_id(path.parent),
                    "dir": str(path.parent),
                    "source": "folder",
                    "run": settings.get("run"),
                    "run_url": loop_run_url(settings),
                    "release": summary.get("release"),
                    "rounds": len(rounds_rows(summary)),
                    "modified": path.stat().st_mtime,
                }
            )
        if run_url is not None:
            out = [r for r in out if r["run_url"] is not None and r["run_url"] == run_url.rstrip("/")]
        return sorted(out, key=lambda r: -(r["modified"] or 0))

    def report(self, report_id: str) -> dict[str, Any]:
        """A loop report's Markdown, its figures' names, its summary and its rounds (`rounds_rows`; [] for a
        report of one loop) with the release stable ran at their end, the rounds' minutes (round 0's included) and
        their baselines' (apart: the benchmark's, not the loop's); None where the report says none.

        Raises:
            UnknownItem: no report with that id, or it holds no `report.md` (an evaluation alone).
        """
        folder = self._report_dir(report_id)
        if isinstance(folder, BucketReport):
            markdown = self.bucket.text(folder, MARKDOWN)
            where, summary = str(folder.url), self.bucket.json(folder, SUMMARY)
        else:
            markdown = _read_text(folder / "report.md")
            where, summary = str(folder), _read_json(folder / "report.json")
        if markdown is None:
            raise UnknownItem(f"report {report_id} has no report.md (an evaluation alone: see the reports page)")
        stable = summary.get("stable")
        return {
            "id": report_id,
            "dir": where,
            "markdown": markdown,
            "summary": summary,
            "rounds": rounds_rows(summary),
            "stable": stable if isinstance(stable, str) else None,
            "rounds_minutes": _number(summary.get("rounds_minutes")),
            "baseline_minutes": _number(summary.get("baseline_minutes")),
        }

    def report_file(self, report_id: str, name: str) -> Path:
        """A PNG or MP4 a report or evaluation shows: only names listed in its folder, never a path.

        Raises:
            UnknownItem: no such report, or no such figure or video in it.
        """
        folder = self._report_dir(report_id)
        if isinstance(folder, BucketReport):
            return self.bucket.media(folder, name)
        allowed = {p.name: p for p in _media(folder)}
        if name not in allowed:
            raise UnknownItem(f"report {report_id} has no file {name!r}")
        return allowed[name]

    def evaluations(self, run_url: str | None = None) -> list[dict[str, Any]]:
        """The evaluations (`eval_report.json`) of the uploaded reports (of run `run_url`, else of every run the
        dashboard knows) and under the report folders: policy, success with its 95% interval, and the rollout
        videos recorded."""
        out = []
        for found in self.bucket.find_all(self.known_runs() if run_url is None else [run_url]):
            if EVALUATION in found.files:
                release = self.bucket.json(found, SUMMARY).get("release")
                out.append(evaluation_row(found.id, self.bucket.json(found, EVALUATION), set(found.media), release))
        for path in self._found("eval_report.json"):
            names = {p.name for p in _media(path.parent)}
            out.append(evaluation_row(report_id(path.parent), _read_json(path), names))
        return out

    def _bucket_row(self, found: BucketReport) -> dict[str, Any] | None:
        if MARKDOWN not in found.files:
            return None  # an evaluation alone: the evaluations list shows it
        summary = self.bucket.json(found, SUMMARY)
        return {
            "id": found.id,
            "dir": str(found.url),
            "source": "bucket",
            "run": (summary.get("settings") or {}).get("run") or BucketUrl.parse(found.run_url).name,
            "run_url": found.run_url,
            "release": summary.get("release"),
            "rounds": len(rounds_rows(summary)),
            "modified": found.modified,
        }

    def _found(self, name: str) -> list[Path]:
        return sorted({p.resolve() for d in self.report_dirs if d.is_dir() for p in d.rglob(name)})

    def _report_dir(self, wanted: str) -> Path | BucketReport:
        for marker in ("report.md", "eval_report.json"):
            for path in self._found(marker):
                if report_id(path.parent) == wanted:
                    return path.parent
        try:
            return self.bucket.get(wanted, self.known_runs)
        except UnknownItem:
            folders = ", ".join(map(str, self.report_dirs)) or "no folder"
            raise UnknownItem(f"no report {wanted!r} beside the runs this dashboard knows, nor in {folders}") from None


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


def _decision(promoted: Any, trained: Any) -> str | None:
    """What became of a round's release: promoted, kept stable, or none made (nothing new to learn)."""
    if trained is False:
        return NOT_TRAINED
    return {True: "promoted", False: "kept stable"}.get(promoted) if isinstance(promoted, bool) else None


def rounds_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The rounds of a rounds report's summary (report.json's `rounds`, `robotloop.rounds.report.round_row`'s
    rows) as the run view's table shows them: round, release, what became of it (`decision`: "start" for round 0,
    which is stable by construction, else "promoted", "kept stable" or `NOT_TRAINED`), success with its 95%
    interval, expert frames, where they went (`expert_split`), the fleet's episodes, failures, takeovers and branch
    drives (these None for round 0, which ran no fleet), minutes, the gain per 1,000 expert frames (success points,
    a share), the same-expert-frames baseline's success and minutes when it ran, each against stable scene by scene
    (`versus_stable`), and the round against its baseline (`round_versus`).
    A row that is not an object, or a figure of the wrong type, shows as nothing rather than failing the page."""
    found = summary.get("rounds")
    rows = []
    for r in found if isinstance(found, list) else []:
        if not isinstance(r, dict):
            continue
        number, promoted = _number(r.get("round")), r.get("promoted")
        fleet = number != 0  # round 0 is the loop's own: demos, no fleet
        baseline = r.get("baseline") if isinstance(r.get("baseline"), dict) else None
        rows.append(
            {
                "round": number,
                "release": r.get("release") if isinstance(r.get("release"), str) else None,
                "promoted": promoted if isinstance(promoted, bool) else None,
                "decision": "start" if not fleet else _decision(promoted, r.get("trained")),
                "success_rate": _number(r.get("success_rate")),
                "ci95": _interval(r.get("ci95")),
                "eval_episodes": _number(r.get("eval_episodes")),
                "expert_frames": _number(r.get("expert_frames")),
                # where they went: {"takeovers": n, "re-demonstrations": n, "near misses": n, "branch drives": n}
                "expert_split": _expert_split(r) if fleet else None,
                "fleet_episodes": _number(r.get("fleet_episodes")) if fleet else None,
                "fleet_failures": _number(r.get("fleet_failures")) if fleet else None,
                "takeovers": _number(r.get("takeovers")) if fleet else None,
                "branches": _number(r.get("branches")) if fleet else None,  # the expert's drives from branch points
                "minutes": _number(r.get("minutes")),
                "gain_per_1000_expert_frames": _number(r.get("gain_per_1000_expert_frames")),
                "versus_stable": _paired(r.get("versus_stable")),
                "baseline": None
                if baseline is None
                else {
                    "demos": _number(baseline.get("demos")),
                    "expert_frames": _number(baseline.get("expert_frames")),
                    "success_rate": _number(baseline.get("success_rate")),
                    "ci95": _interval(baseline.get("ci95")),
                    "minutes": _number(baseline.get("minutes")),
                    "versus_stable": _paired(baseline.get("versus_stable")),
                    "round_versus": _paired(baseline.get("round_versus")),  # the round against it, scene by scene
                },
            }
        )
    return rows


EXPERT_PARTS = {  # a round's expert frames by where the expert drove (robotloop.rounds.run.RoundResult)
    "takeover_frames": "takeovers",
    "redemo_frames": "re-demonstrations",
    "near_frames": "near misses",
    "branch_frames": "branch drives",
}


def _expert_split(row: dict[str, Any]) -> dict[str, int | float]:
    """A round's expert frames by part (`EXPERT_PARTS`), the parts it spent some on."""
    parts = {label: _number(row.get(key)) for key, label in EXPERT_PARTS.items()}
    return {label: n for label, n in parts.items() if n}


def _number(value: Any) -> int | float | None:
    """A figure of a report, or None when it is not a finite number (a bool is no figure)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if isinstance(value, int) or math.isfinite(value) else None  # an int of any size is finite


def _stage_counts(value: Any) -> dict[str, int | float]:
    """An evaluation's failed episodes by stage (`EvalReport.failures_by_stage`); counts that are no figure, or a
    value that is no object, show as nothing."""
    if not isinstance(value, dict):
        return {}
    return {str(stage): n for stage, count in value.items() if (n := _number(count)) is not None}


def _paired(value: Any) -> dict[str, int | float] | None:
    """A round against stable scene by scene (`robotloop.deploy.evaluate.Paired`), or None when any part is no
    figure."""
    if not isinstance(value, dict):
        return None
    found = {key: _number(value.get(key)) for key in ("won", "lost", "p_value")}
    return None if None in found.values() else found


def _interval(value: Any) -> list[float] | None:
    if not isinstance(value, list) or len(value) != 2:
        return None
    low, high = _number(value[0]), _number(value[1])
    return None if low is None or high is None else [low, high]


def loop_run_url(settings: dict[str, Any]) -> str | None:
    """The training run a loop report's settings name (`LoopSettings.run_url`: `<bucket>/models/<run>`), or None
    when they name none."""
    bucket, run = settings.get("bucket"), settings.get("run")
    if not isinstance(bucket, str) or not isinstance(run, str) or not bucket or not run:
        return None
    return f"{bucket.rstrip('/')}/models/{run}"


def evaluation_row(rid: str, data: dict[str, Any], media: set[str], release: str | None = None) -> dict[str, Any]:
    """An evaluation (`eval_report.json`) as the pages list it; `media`: the video names its report may serve,
    `release`: the release its loop report says it evaluated."""
    summary = data.get("summary") or {}
    episodes = [e for e in data.get("episodes") or [] if isinstance(e, dict)]
    videos = [PurePosixPath(str(e["video"])).name for e in episodes if e.get("video")]
    return {
        "id": rid,
        "policy": data.get("policy"),
        "source": data.get("source"),
        "checkpoint": data.get("checkpoint"),
        "release": release,
        "task": data.get("task"),
        "episodes": summary.get("n_episodes"),
        "success_rate": summary.get("success_rate"),
        "success_ci95": summary.get("success_ci95"),
        "mean_max_reward": summary.get("mean_max_reward"),
        "failures_by_stage": _stage_counts(summary.get("failures_by_stage")),  # reports before 2026-12-06 have none
        "videos": [v for v in videos if v in media],
    }


def run_of(checkpoint: str) -> str:
    """The run folder of a checkpoint URL (`<run>/checkpoints/<step>` -> `<run>`)."""
    head, sep, _ = checkpoint.rpartition("/checkpoints/")
    return head if sep else checkpoint


def _media(folder: Path) -> list[Path]:
    return [p for p in (*folder.glob("*.png"), *folder.glob("videos/*.mp4")) if p.is_file()]


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
