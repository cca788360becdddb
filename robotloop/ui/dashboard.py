"""What the dashboard shows, composed from the services' own clients: the deploy service (fleet, releases,
history), the training service (jobs and their progress), the bucket server (datasets, episodes, videos,
checkpoints) and the report folders on this machine (loop reports, evaluations).

Nothing here reaches into a service: each figure is what `robotloop deploy status`, `trainer watch`, `bucket ls`
or the agent's tools read, reshaped for a page. Every answer is plain JSON types; the web app
(`services/ui`) serves them as they are.

Example:
    ```python
    >>> board = Dashboard(load_settings())
    >>> [r["id"] for r in board.fleet()["robots"]]
    ['r1', 'r2']
    >>> board.dataset("hf://buckets/lab/demos/datasets/cube")["episodes"][0]["video"]
    {'observation.images.top': {'url': 'hf://.../file-000.mp4', 'from_s': 0.0, 'to_s': 8.0}}
    ```
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..clients import ServiceClients
from ..config import Settings
from ..errors import NotFound
from ..storage import BucketUrl, Entry, StorageError
from ..storage import NotFound as StorageNotFound
from ..train.progress import JOB_FIELDS

SUCCESS_KEY = "next.success"  # robotloop.capture.recorder's column: true from the frame the task is solved
STATE_KEY, ACTION_KEY = "observation.state", "action"
MAX_PLOT_FRAMES = 5000  # frames of one episode plotted; longer episodes are thinned to this


class UnknownItem(NotFound, KeyError):
    """No such report, evaluation or file among those the dashboard shows."""


class Dashboard(ServiceClients):
    """The dashboard's reads (and its two writes: promote, roll back), over one set of settings.

    Its service clients (`ServiceClients`) are made on first use, as the agent's are, so a dashboard without a
    training service token still shows the fleet (the training page says which token is missing). Datasets are
    kept open between calls (`DatasetSource.refresh` re-reads only the metadata that changed), so a page polled
    every few seconds costs one listing.
    """

    def __init__(self, settings: Settings, reports: list[Path] | None = None) -> None:
        super().__init__(settings)
        self.report_dirs = [Path(p) for p in (settings.ui.reports if reports is None else reports)]
        self._sources: dict[str, tuple[threading.Lock, Any]] = {}  # dataset URL -> (its lock, DatasetSource)
        self._success: dict[str, dict[str, dict[int, bool]]] = {}  # dataset -> data file Xet hash -> successes
        self._sizes: dict[str, tuple[float, Entry]] = {}
        self._lock = threading.Lock()

    # -- fleet and releases ------------------------------------------------------------------------------------
    def fleet(self, history: int = 50) -> dict[str, Any]:
        """Channels, releases, every robot (channel, assigned and running release, control rate, health, seconds
        since its last heartbeat) and the latest deploy events, newest first."""
        state, now = self.deploy.status(), time.time()
        return {
            "channels": state["channels"],
            "releases": [r["name"] for r in state["releases"]],
            "robots": [robot_row(r, now) for r in state["robots"]],
            "events": self.deploy.history(limit=history),
        }

    def releases(self, history: int = 200) -> dict[str, Any]:
        """Per channel its release and its history (promotions, rollbacks, publishes to it), plus every release."""
        state = self.deploy.status()
        events = self.deploy.history(limit=history)
        channels = {
            name: {"release": release, "events": [e for e in events if e["channel"] == name]}
            for name, release in state["channels"].items()
        }
        return {"channels": channels, "releases": state["releases"]}

    def release(self, name: str) -> dict[str, Any]:
        """One release: its files, lineage (the run, datasets and episodes it was trained on, with Xet hashes), the
        channels and robots on it, its history and the evaluations found for it."""
        found = self.deploy.release(path_name("release", name))
        manifest = found["manifest"]["manifest"]
        state = self.deploy.status()
        events = [e for e in self.deploy.history(limit=500) if name in (e["release"], e["previous"])]
        return {
            "name": name,
            "checkpoint": found["checkpoint"],
            "run": run_of(found["checkpoint"]),
            "key_id": found["key_id"],
            "created_at": found["created_at"],
            "published_at": found["published_at"],
            "files": [{k: f[k] for k in ("path", "size", "xet_hash")} for f in manifest["files"]],
            "lineage": lineage_summary(manifest.get("lineage") or {}),
            "channels": sorted(c for c, r in state["channels"].items() if r == name),
            "robots": [r["id"] for r in state["robots"] if name in (r.get("running"), r.get("assigned"))],
            "events": events,
            "evaluations": [e for e in self.evaluations() if _evaluates(e, name, found["checkpoint"])],
            "reports": self.reports(run_of(found["checkpoint"])),
        }

    def promote(self, channel: str, release: str, reason: str) -> dict[str, Any]:
        return self.deploy.promote(path_name("channel", channel), release, reason)

    def rollback(self, channel: str | None, robot: str | None, reason: str) -> dict[str, Any]:
        """Roll a channel back to its previous release, or pin a robot to the one it ran before."""
        if channel is not None:
            return self.deploy.rollback_channel(path_name("channel", channel), reason)
        return self.deploy.rollback_robot(path_name("robot", robot or ""), reason)

    # -- training ----------------------------------------------------------------------------------------------
    def jobs(self) -> list[dict[str, Any]]:
        """Every training job this dashboard's token may see, newest first."""
        return [job_row(s) for s in reversed(self.trainer.jobs())]

    def job(self, job_id: str, after_step: int = -1) -> dict[str, Any]:
        """A job's state and its progress reports past `after_step` (the loss curve grows by them)."""
        points = self.trainer.progress(path_name("job", job_id), after_step)
        keep = ("step", "loss", "samples_per_s", "data_wait_share", "elapsed_s")
        return {"job": job_row(self.trainer.job(job_id)), "points": [{k: p[k] for k in keep} for p in points]}

    def checkpoints(self, output: str) -> list[dict[str, Any]]:
        """A run's checkpoint folders in its bucket, newest first, and which one `last.json` names."""
        url = BucketUrl.parse(output) / "checkpoints"
        try:
            found = self.bucket.ls(url)
        except StorageNotFound:
            return []
        steps = sorted((u.name for u in found if isinstance(u, BucketUrl) and u.name.isdigit()), reverse=True)
        return [{"step": int(s), "url": str(url / s)} for s in steps]

    # -- datasets ----------------------------------------------------------------------------------------------
    def buckets(self, namespaces: list[str]) -> list[str]:
        """The bucket URLs of `namespaces` this dashboard's storage token may see."""
        out = []
        for ns in namespaces:
            out += [f"hf://buckets/{b['id']}" for b in self.bucket.list_buckets(ns)]
        return out

    def datasets(self, bucket: str) -> list[str]:
        """The dataset URLs under `<bucket>/datasets/` (the layout `robotloop record` writes)."""
        url = BucketUrl.parse(bucket)
        root = url if url.path else url / "datasets"
        try:
            found = self.bucket.ls(root)
        except StorageNotFound:
            return []
        return sorted(str(u) for u in found if isinstance(u, BucketUrl))

    def dataset(self, url: str) -> dict[str, Any]:
        """A dataset's shape and its episodes: length, task, success and, per camera, the shared video file and
        the episode's time segment in it.

        Raises:
            NotFound: no LeRobot dataset at `url`.
        """
        with self._source(url) as source:
            return self._dataset(url, source)

    def _dataset(self, url: str, source) -> dict[str, Any]:
        rows = source.episode_rows()
        success = self._episode_success(url, source)
        episodes = []
        for ref in source.episodes:
            row = rows[ref.index]
            videos = {
                key: {
                    "url": ref.videos[key][0].url,
                    "from_s": float(row[f"videos/{key}/from_timestamp"]),
                    "to_s": float(row[f"videos/{key}/to_timestamp"]),
                }
                for key in source.video_keys
            }
            episodes.append(
                {
                    "index": ref.index,
                    "length": ref.length,
                    "task": "; ".join(row.get("tasks") or []),
                    "success": success.get(ref.index),
                    "video": videos,
                }
            )
        return {
            "url": url,
            "fps": source.fps,
            "features": {k: {"dtype": v["dtype"], "shape": list(v["shape"])} for k, v in source.features.items()},
            "video_keys": source.video_keys,
            "episodes": episodes,
        }

    def episode(self, url: str, index: int) -> dict[str, Any]:
        """One episode's state and action per frame (for plots), with their feature names.

        Raises:
            UnknownItem: no such episode.
        """
        import pyarrow.parquet as pq

        with self._source(url) as source:
            ref = next((e for e in source.episodes if e.index == index), None)
            names = {k: (source.features[k].get("names") or None) for k in (STATE_KEY, ACTION_KEY)}
        if ref is None:
            raise UnknownItem(f"{url} has no episode {index}")
        columns = ["episode_index", "timestamp", STATE_KEY, ACTION_KEY]
        with self.bucket.open(BucketUrl.parse(ref.data.url)) as f:
            table = pq.read_table(f, columns=columns, filters=[("episode_index", "=", index)])
        if table.num_rows > MAX_PLOT_FRAMES:  # thinned evenly: a plot has fewer pixels than that anyway
            table = table.take(list(range(0, table.num_rows, -(-table.num_rows // MAX_PLOT_FRAMES))))
        return {
            "url": url,
            "index": index,
            "timestamp": table.column("timestamp").to_pylist(),
            "state": table.column(STATE_KEY).to_pylist(),
            "action": table.column(ACTION_KEY).to_pylist(),
            "names": names,
        }

    def file_entry(self, url: str, max_age_s: float = 10.0) -> Entry:
        """Size and Xet hash of a bucket file, remembered for `max_age_s` (a video's range requests come in
        bursts).

        Raises:
            NotFound: no such file.
        """
        now = time.monotonic()
        cached = self._sizes.get(url)
        if cached and now - cached[0] < max_age_s:
            return cached[1]
        entry = self.bucket.stat(BucketUrl.parse(url))
        if len(self._sizes) > 4096:  # bounded: forget everything rather than track ages
            self._sizes.clear()
        self._sizes[url] = (now, entry)
        return entry

    def read_range(self, url: str, start: int, end: int) -> bytes:
        """Bytes `[start, end)` of a bucket file (a video's byte range)."""
        return self.bucket.read_range(BucketUrl.parse(url), start, end)

    @contextlib.contextmanager
    def _source(self, url: str) -> Iterator[Any]:
        """The dataset's `DatasetSource`, refreshed, held under its lock (it is not thread-safe, and pages poll)."""
        with self._lock:
            lock = self._sources.setdefault(url, (threading.Lock(), None))[0]
        with lock:
            source = self._sources[url][1]  # read under the lock: another request may have opened it meanwhile
            if source is None:
                source = page_source_class()(self.bucket, BucketUrl.parse(url))
                with self._lock:
                    self._sources[url] = (lock, source)
            else:
                source.refresh()
            yield source

    def _episode_success(self, url: str, source) -> dict[int, bool]:
        """Per episode, whether `next.success` is ever true (None-free: datasets without the column give {})."""
        import pyarrow.parquet as pq

        if SUCCESS_KEY not in source.features:
            return {}
        out: dict[int, bool] = {}
        seen, kept = self._success.get(url, {}), {}
        for data in {e.data.xet_hash: e.data for e in source.episodes}.values():
            known = seen.get(data.xet_hash)
            if known is None:
                raw = self.bucket.read_range(BucketUrl.parse(data.url), 0, data.size)
                table = pq.ParquetFile(io.BytesIO(raw)).read(columns=["episode_index", SUCCESS_KEY], use_threads=False)
                known = {}
                for episode, flag in zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True):
                    solved = bool(flag[0] if isinstance(flag, list) else flag)
                    known[episode] = known.get(episode, False) or solved
            kept[data.xet_hash] = known
            out.update(known)
        self._success[url] = kept  # only the data files the dataset has now: the last one changes every commit
        return out

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
                    "id": _id(path.parent),
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
                    "id": _id(path.parent),
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

    def _report_dir(self, report_id: str) -> Path:
        for marker in ("report.md", "eval_report.json"):
            for path in self._found(marker):
                if _id(path.parent) == report_id:
                    return path.parent
        raise UnknownItem(f"no report {report_id!r} under {', '.join(map(str, self.report_dirs)) or 'no folder'}")


@functools.cache
def page_source_class() -> type:
    """The trainer's `DatasetSource`, reading only the episodes metadata columns a page shows.

    LeRobot v3 keeps every episode's statistics in the episodes parquet files (min, max, mean, std, count and
    quantiles of every feature): 100 of a 1,000-episode dataset's 113 columns and most of its bytes. Parsing them
    took 1.2 s of the dataset page's first load on 2 cores, and `pq.read_table` imports pandas (0.7 s) for its
    dataset machinery; `ParquetFile.read` of the other columns takes 0.05 s. Made on first use: the catalog imports
    torch.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..train.data.catalog import DatasetSource

    class PageSource(DatasetSource):
        def _read_episode_rows(self, entry: Entry) -> list[dict]:
            raw = self.client.read_range(entry.url, 0, entry.size)
            try:
                parquet = pq.ParquetFile(io.BytesIO(raw))
                keep = [c for c in parquet.schema_arrow.names if not c.startswith("stats/")]
                return parquet.read(columns=keep, use_threads=False).to_pylist()
            except (pa.ArrowException, ValueError) as error:  # rewritten since it was listed, as in the catalog
                raise StorageError(f"{entry.url} changed while it was read ({error}); read again next time") from None

    return PageSource


# -- shaping -------------------------------------------------------------------------------------------------
def robot_row(robot: dict[str, Any], now: float) -> dict[str, Any]:
    """One robot as the fleet page lists it (the deploy service's robot, its heartbeat's figures flattened)."""
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


def path_name(kind: str, name: str) -> str:
    """`name`, checked to be one URL path segment as the services name things (letters, digits, `._-~`): the
    service clients put names into their URLs as they are, so a `/`, `?` or control character would make another
    request, or none.

    Raises:
        UnknownItem: no service has anything by that name.
    """
    if not name or name in (".", "..") or quote(name, safe="") != name:
        raise UnknownItem(f"no {kind} {name!r}")
    return name


def run_of(checkpoint: str) -> str:
    """The run folder of a checkpoint URL (`<run>/checkpoints/<step>` -> `<run>`)."""
    head, sep, _ = checkpoint.rpartition("/checkpoints/")
    return head if sep else checkpoint


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


def loop_run_url(settings: dict[str, Any]) -> str | None:
    """The training run a loop report's settings name (`LoopSettings.run_url`: `<bucket>/models/<run>`), or None
    when they name none."""
    bucket, run = settings.get("bucket"), settings.get("run")
    if not isinstance(bucket, str) or not isinstance(run, str) or not bucket or not run:
        return None
    return f"{bucket.rstrip('/')}/models/{run}"


def _evaluates(evaluation: dict[str, Any], release: str, checkpoint: str) -> bool:
    named = {evaluation.get("checkpoint"), evaluation.get("source"), evaluation.get("policy")}
    return release in named or checkpoint in named


def _media(folder: Path) -> list[Path]:
    return [p for p in (*folder.glob("*.png"), *folder.glob("videos/*.mp4")) if p.is_file()]


def _id(folder: Path) -> str:
    return hashlib.sha256(str(folder).encode()).hexdigest()[:12]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
