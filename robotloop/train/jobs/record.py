"""A training job's record: its state as the API shows it and its folder on disk, written and read back here only.

job.json         the spec (without the storage token) and when it was submitted
log.txt          the child's stdout and stderr
progress.jsonl   one JSON line per progress report, then one "done" line (`robotloop train --progress-file`)
exit.json        how it ended: status, exit code, times, message (written once the child has exited)
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ...errors import BadValue
from ..progress import JOB_FIELDS, read_line
from .spec import JobSpec

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]
FINISHED: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
LOG_CHUNK = 64 * 1024
PROGRESS_POINTS = 5000  # progress reports one call answers at most: a page of a loss curve


@dataclass
class JobState:
    """A job as GET shows it. The progress fields (robotloop.train.progress.JOB_FIELDS: step ... last_checkpoint)
    are the trainer's latest Progress, None until its first report."""

    id: str
    status: Status
    spec: dict[str, Any]
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    step: int | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    data_wait_share: float | None = None
    episodes: int | None = None
    last_checkpoint: str | None = None
    exit_code: int | None = None
    message: str = ""


@dataclass
class JobRecord:
    """One job: its spec (holding the storage token: in memory only), its state, and its folder, whose files are
    written and read here only. `proc`, `cancel_requested` and `kill_at` are the runner's (`JobRunner`)."""

    spec: JobSpec
    dir: Path
    state: JobState
    proc: subprocess.Popen | None = None
    cancel_requested: bool = False
    kill_at: float | None = None
    progress_offset: int = 0
    progress_tail: bytes = field(default=b"", repr=False)

    @classmethod
    def create(cls, root: Path, spec: JobSpec) -> JobRecord:
        """A new queued job with its folder and job.json under `root`.

        Raises:
            OSError: the job directory cannot be written.
        """
        job_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        job_dir = root / job_id
        job_dir.mkdir()
        state = JobState(job_id, "queued", spec.public(), time.time())
        _write_json(job_dir / "job.json", {"id": job_id, "spec": state.spec, "created_at": state.created_at})
        return cls(spec, job_dir, state)

    @classmethod
    def load(cls, job_dir: Path) -> JobRecord:
        """A job from an earlier run of the service: its final state, or failed if the service died under it."""
        meta = json.loads((job_dir / "job.json").read_text())
        state = JobState(
            meta["id"],
            "failed",
            meta["spec"],
            meta["created_at"],
            message="the training service stopped while this job was queued or running",
        )
        spec = JobSpec.model_construct(
            **{k: v for k, v in meta["spec"].items() if k != "storage_token_set"}
        )  # never rerun
        job = cls(spec, job_dir, state)
        job.read_progress()
        if (job_dir / "exit.json").exists():
            for key, value in json.loads((job_dir / "exit.json").read_text()).items():
                setattr(state, key, value)
        return job

    @property
    def log_path(self) -> Path:
        return self.dir / "log.txt"

    @property
    def progress_path(self) -> Path:
        return self.dir / "progress.jsonl"

    def finish(self, status: Status, code: int | None, message: str) -> None:
        """Record how the job ended, in its state and in exit.json."""
        state = self.state
        state.status, state.exit_code, state.message, state.ended_at = status, code, message, time.time()
        self.kill_at = None
        fields = ("status", "exit_code", "message", "started_at", "ended_at", "last_checkpoint")
        _write_json(self.dir / "exit.json", {k: getattr(state, k) for k in fields})

    def read_progress(self) -> None:
        """Fold new complete lines of progress.jsonl into the job's state (a half-written last line waits)."""
        try:
            with self.progress_path.open("rb") as f:
                f.seek(self.progress_offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.progress_offset += len(data)
        *lines, self.progress_tail = (self.progress_tail + data).split(b"\n")
        for line in lines:
            _apply(self.state, line)

    def log(self, offset: int = 0, limit: int = LOG_CHUNK) -> tuple[str, int]:
        """Log text from byte `offset` (at most `limit` bytes) and the offset to ask for next.

        A UTF-8 character cut by the chunk's end is left for the next call.

        Raises:
            BadValue: a negative offset or limit.
        """
        if offset < 0 or limit <= 0:
            raise BadValue("offset must be >= 0 and limit > 0")
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                data = f.read(limit)
        except FileNotFoundError:  # queued: nothing written yet
            return "", offset
        for cut in range(min(4, len(data) + 1)):
            try:
                return data[: len(data) - cut].decode("utf-8"), offset + len(data) - cut
            except UnicodeDecodeError:
                continue
        return data.decode("utf-8", errors="replace"), offset + len(data)  # not UTF-8 at all: show it anyway

    def progress(self, after_step: int = -1, limit: int = PROGRESS_POINTS) -> list[dict[str, Any]]:
        """The progress reports with a step past `after_step`, oldest first, at most `limit` (the first ones):
        what a loss curve is drawn from. Each is a `Progress` as a dict; a torn last line waits for the next call.

        Raises:
            BadValue: `limit` <= 0.
        """
        if limit <= 0:
            raise BadValue("limit must be > 0")
        points: list[dict[str, Any]] = []
        try:
            with self.progress_path.open("rb") as f:
                for line in f:
                    read = read_line(line) if line.endswith(b"\n") else None
                    if read is not None and read[0] == "progress" and read[1].step > after_step:
                        points.append(asdict(read[1]))
                        if len(points) >= limit:
                            break
        except FileNotFoundError:  # queued: nothing reported yet
            pass
        return points

    def last_log_line(self) -> str:
        """The log's last non-blank line (what a failed job's message quotes)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                lines = [ln.strip() for ln in f.read().decode("utf-8", errors="replace").splitlines() if ln.strip()]
        except FileNotFoundError:
            return "no log"
        return lines[-1] if lines else "no output"


def _apply(state: JobState, line: bytes) -> None:
    """Copy a progress line's fields into the job's state, by name: the trainer's Progress is the wire type."""
    read = read_line(line)
    if read is None:
        return  # a torn line from a killed child: skip it, the next report supersedes it
    event, progress = read
    if event in ("progress", "done"):
        for name in JOB_FIELDS:
            setattr(state, name, getattr(progress, name))


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    tmp.replace(path)  # readers never see half a file
