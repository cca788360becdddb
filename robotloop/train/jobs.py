"""Training jobs: `robotloop train` runs as subprocesses, tracked on disk. No HTTP here (see services/trainer).

Each job has a directory ``<root>/<id>/``::

    job.json         the spec (without the storage token) and when it was submitted
    log.txt          the child's stdout and stderr
    progress.jsonl   one JSON line per progress report, then one "done" line (`robotloop train --progress-file`)
    exit.json        how it ended: status, exit code, times, message (written once the child has exited)

A job is one process group: ``python -m robotloop.train ...`` for one GPU (or CPU), ``python -m
torch.distributed.run --nproc-per-node N -m robotloop.train ...`` for several. The storage endpoint and token
reach the child through ``ROBOTLOOP_STORAGE__ENDPOINT`` / ``ROBOTLOOP_STORAGE__TOKEN``, never its command line
(which `ps` shows to every user). Cancel sends SIGTERM to the leader only: the trainer checkpoints and exits; its
decode workers must stay alive until then. SIGKILL goes to the whole group once the grace period is over.

Example:
    ```python
    >>> jobs = JobManager(Path("/var/lib/robotloop/jobs"))
    >>> job_id = jobs.submit(JobSpec(datasets=["hf://buckets/lab/demos/datasets/cube"],
    ...                              output="hf://buckets/lab/demos/models/run1", steps=500))
    >>> jobs.state(job_id).status, jobs.state(job_id).step
    ('running', 50)
    >>> jobs.cancel(job_id)  # checkpoints, then stops
    ```
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from ..errors import BadValue, Busy, NotFound
from ..options import to_argv
from ..storage.private import private_dir
from .options import TrainOptions
from .progress import JOB_FIELDS, read_line

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]
FINISHED: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
LOG_CHUNK = 64 * 1024
PROGRESS_POINTS = 5000  # progress reports one call answers at most: a page of a loss curve


class QueueFull(Busy, RuntimeError):
    """Too many jobs wait already; submit again once one has finished."""


class UnknownJob(NotFound, KeyError):
    """No job with this id."""

    def __str__(self) -> str:
        return f"no job '{self.args[0]}'; GET /v1/jobs lists the jobs"


class JobSpec(TrainOptions):
    """What to train: every `robotloop train` option (`TrainOptions`), plus how the job runs and the storage it
    reads and writes."""

    # A job says where it runs: "auto" would pick a GPU on one service host and the CPU on another.
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d{1,2})?)$", description="cpu, cuda or cuda:N.")
    gpus: int = Field(default=1, ge=1, le=64, description="1: plain process; more: torchrun, one rank per GPU")
    storage_endpoint: str | None = Field(default=None, pattern=r"^https?://\S+$", description="default: the service's")
    storage_token: SecretStr | None = Field(default=None, description="default: the service's (with its endpoint only)")
    backbone_weights: str | None = Field(
        default=None,
        max_length=4096,
        description="A torchvision resnet18 weights file in the service's weights folder (trainer.weights_dir), by "
        "name; default none: random init.",
    )

    @model_validator(mode="after")
    def _gpus_need_cuda(self) -> JobSpec:
        if self.gpus > 1 and self.device != "cuda":
            raise BadValue(f"gpus={self.gpus} needs device 'cuda' (each rank takes its own GPU)")
        return self

    def with_storage(self, endpoint: str | None, token: str | None) -> JobSpec:
        """This spec with the service's storage filled in where the caller named none.

        The service's token goes only with the service's endpoint: a caller naming its own endpoint without a
        token must not receive the service's token there.
        """
        if self.storage_endpoint is not None:
            return self
        secret = self.storage_token or (SecretStr(token) if token else None)
        return self.model_copy(update={"storage_endpoint": endpoint, "storage_token": secret})

    def with_weights(self, folder: Path | None) -> JobSpec:
        """This spec with its backbone weights named by a caller resolved in the service's `folder`: a caller names
        a file there, never a path of the service's machine.

        Raises:
            BadValue: weights named but the service has no weights folder, a name that is a path, or no such file.
        """
        name = self.backbone_weights
        if name is None:
            return self
        if folder is None:
            raise BadValue("this training service has no weights folder (trainer.weights_dir): omit backbone_weights")
        if name != Path(name).name or name.startswith("."):
            raise BadValue(f"backbone_weights names a file of the service's weights folder, not a path: {name!r}")
        path = Path(folder) / name
        if not path.is_file():
            raise BadValue(f"no weights file {name!r} in the service's weights folder")
        return self.model_copy(update={"backbone_weights": str(path.resolve())})

    def public(self) -> dict[str, Any]:
        """The spec as JSON, without the token (what job.json and the API show)."""
        return {**self.model_dump(exclude={"storage_token"}), "storage_token_set": self.storage_token is not None}

    def command(self, progress_file: Path) -> list[str]:
        """The child's argv. Uses this interpreter (the service's venv), so `torchrun` needs no PATH entry."""
        launcher = [sys.executable]
        if self.gpus > 1:
            launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(self.gpus)]
        options = to_argv(self, TrainOptions.model_fields)  # every option, derived: none is forgotten here
        args = ["-m", "robotloop.train", *options, "--progress-file", str(progress_file)]
        if self.backbone_weights:  # resolved by `with_weights`
            args += ["--backbone-weights", self.backbone_weights]
        return launcher + args

    def child_env(self, base: dict[str, str], job_dir: Path) -> dict[str, str]:
        """The child's environment: `base` with this spec's storage endpoint and token (and no other token)."""
        env = {
            k: v
            for k, v in base.items()
            if k not in ("ROBOTLOOP_STORAGE__ENDPOINT", "ROBOTLOOP_STORAGE__TOKEN", "HF_TOKEN")
        }
        # Without a token of its own, the child must not fall back to a Hub login saved on this machine.
        env["HF_TOKEN_PATH"] = str(job_dir / "no-hf-token")
        env["PYTHONUNBUFFERED"] = "1"  # log lines reach log.txt as they happen
        if self.storage_endpoint:
            env["ROBOTLOOP_STORAGE__ENDPOINT"] = self.storage_endpoint
        if self.storage_token:
            env["ROBOTLOOP_STORAGE__TOKEN"] = self.storage_token.get_secret_value()
        return env


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
class _Job:
    spec: JobSpec  # holds the token: in memory only
    dir: Path
    state: JobState
    proc: subprocess.Popen | None = None
    cancel_requested: bool = False
    kill_at: float | None = None
    progress_offset: int = 0
    progress_tail: bytes = field(default=b"", repr=False)


class JobManager:
    """Runs training jobs as subprocesses under `root`, at most `max_running` at once (the rest wait queued).

    A background thread reaps finished jobs, starts queued ones and SIGKILLs cancelled jobs past their grace
    period. Jobs found under `root` from an earlier run are listed with their final state.
    """

    def __init__(
        self, root: Path, max_running: int = 1, cancel_grace_s: float = 120.0, poll_s: float = 0.2, max_queued: int = 32
    ) -> None:
        self.root, self.max_running, self.cancel_grace_s, self.poll_s = Path(root), max_running, cancel_grace_s, poll_s
        self.max_queued = max_queued
        private_dir(self.root)
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.RLock()
        self._closed = threading.Event()
        for path in sorted(self.root.glob("*/job.json")):
            self._load(path.parent)
        self._watcher = threading.Thread(target=self._watch, name="robotloop-jobs", daemon=True)
        self._watcher.start()

    # -- public ------------------------------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        """Queue a job (it starts at once when a slot is free); returns its id.

        Raises:
            RuntimeError: the manager is closed. QueueFull: `max_queued` jobs already wait.
            OSError: the job directory cannot be written.
        """
        if self._closed.is_set():
            raise RuntimeError("the job manager is shutting down")
        with self._lock:
            waiting = sum(job.state.status == "queued" for job in self._jobs.values())
        if waiting >= self.max_queued:
            raise QueueFull(f"{waiting} jobs are already queued (the limit is {self.max_queued}); cancel one or wait")
        job_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        job_dir = self.root / job_id
        job_dir.mkdir()
        state = JobState(job_id, "queued", spec.public(), time.time())
        _write_json(job_dir / "job.json", {"id": job_id, "spec": state.spec, "created_at": state.created_at})
        with self._lock:
            self._jobs[job_id] = _Job(spec, job_dir, state)
            self._pump()
        return job_id

    def state(self, job_id: str) -> JobState:
        """The job's status and latest progress.

        Raises:
            UnknownJob: no such job.
        """
        with self._lock:
            job = self._get(job_id)
            self._read_progress(job)
            return JobState(**asdict(job.state))

    def list(self) -> list[JobState]:
        """All jobs, oldest first."""
        with self._lock:
            return [self.state(job_id) for job_id in self._in_order()]

    def log(self, job_id: str, offset: int = 0, limit: int = LOG_CHUNK) -> tuple[str, int]:
        """Log text from byte `offset` (at most `limit` bytes) and the offset to ask for next.

        A UTF-8 character cut by the chunk's end is left for the next call.

        Raises:
            UnknownJob: no such job. ValueError: a negative offset or limit.
        """
        if offset < 0 or limit <= 0:
            raise BadValue("offset must be >= 0 and limit > 0")
        path = self._get(job_id).dir / "log.txt"
        try:
            with path.open("rb") as f:
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

    def progress(self, job_id: str, after_step: int = -1, limit: int = PROGRESS_POINTS) -> list[dict[str, Any]]:
        """The job's progress reports with a step past `after_step`, oldest first, at most `limit` (the first ones):
        what a loss curve is drawn from. Each is a `Progress` as a dict; a torn last line waits for the next call.

        Raises:
            UnknownJob: no such job. ValueError: `limit` <= 0.
        """
        if limit <= 0:
            raise BadValue("limit must be > 0")
        path = self._get(job_id).dir / "progress.jsonl"
        points: list[dict[str, Any]] = []
        try:
            with path.open("rb") as f:
                for line in f:
                    read = read_line(line) if line.endswith(b"\n") else None
                    if read is not None and read[0] == "progress" and read[1].step > after_step:
                        points.append(asdict(read[1]))
                        if len(points) >= limit:
                            break
        except FileNotFoundError:  # queued: nothing reported yet
            pass
        return points

    def follow(self, job_id: str, offset: int = 0, poll_s: float = 0.5) -> Iterator[str]:
        """Log text from `offset` as it is written, until the job has finished and the log is read to its end.

        Raises:
            UnknownJob: no such job.
        """
        while True:
            finished = self.state(job_id).status in FINISHED  # read before the log: no line written after is lost
            text, offset = self.log(job_id, offset)
            if text:
                yield text
            elif finished or self._closed.is_set():  # the service is stopping: end the stream, not the job
                return
            else:
                time.sleep(poll_s)

    def cancel(self, job_id: str) -> JobState:
        """Stop a job: a queued one never starts; a running one gets SIGTERM (it checkpoints, then exits) and
        SIGKILL after the grace period. Cancelling a finished job changes nothing.

        Raises:
            UnknownJob: no such job.
        """
        with self._lock:
            job = self._get(job_id)
            if job.state.status == "queued":
                self._finish(job, "cancelled", None, "cancelled before it started")
            elif job.state.status == "running" and not job.cancel_requested:
                job.cancel_requested, job.kill_at = True, time.monotonic() + self.cancel_grace_s
                job.state.message = "cancelling: writing a checkpoint"
                _signal(job.proc, signal.SIGTERM, group=False)  # the leader only: its decode workers must live on
            return self.state(job_id)

    def close(self, cancel_running: bool = True, timeout_s: float | None = None) -> None:
        """Stop the watcher; with `cancel_running`, cancel running jobs and wait (up to the grace period) for them
        to checkpoint, so no job outlives the service untracked."""
        self._closed.set()
        self._watcher.join()
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.state.status in ("queued", "running")]
            for job in jobs:
                if cancel_running:
                    self.cancel(job.state.id)
        deadline = time.monotonic() + (self.cancel_grace_s if timeout_s is None else timeout_s)
        for job in jobs:
            if job.proc is None or not cancel_running:
                continue
            try:
                job.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(job.proc, signal.SIGKILL, group=True)
                job.proc.wait()
            with self._lock:
                self._reap(job)

    # -- internals ---------------------------------------------------------------------------------------------
    def _get(self, job_id: str) -> _Job:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise UnknownJob(job_id) from None

    def _in_order(self) -> list[str]:
        return sorted(self._jobs, key=lambda job_id: self._jobs[job_id].state.created_at)

    def _watch(self) -> None:
        while not self._closed.wait(self.poll_s):
            with self._lock:
                for job in self._jobs.values():
                    if job.state.status == "running":
                        self._reap(job)
                self._pump()

    def _reap(self, job: _Job) -> None:
        """Finish `job` if its process has exited; SIGKILL it once a cancel's grace period is over."""
        code = job.proc.poll() if job.proc else None
        if code is None:
            if job.kill_at is not None and time.monotonic() > job.kill_at:
                _signal(job.proc, signal.SIGKILL, group=True)
            return
        _signal(job.proc, signal.SIGKILL, group=True)  # leftovers of the group (orphaned workers), if any
        self._read_progress(job)
        if job.cancel_requested:
            killed = code == -signal.SIGKILL
            note = ": killed after the grace period, before its checkpoint" if killed else f" at step {job.state.step}"
            self._finish(job, "cancelled", code, f"cancelled{note}")
        elif code == 0:
            self._finish(job, "succeeded", code, f"finished {job.state.step} steps")
        else:
            self._finish(job, "failed", code, f"exit code {code}: {_last_line(job.dir / 'log.txt')}")

    def _pump(self) -> None:
        """Start queued jobs, oldest first, while fewer than `max_running` run."""
        running = sum(j.state.status == "running" for j in self._jobs.values())
        for job_id in self._in_order():
            job = self._jobs[job_id]
            if running >= self.max_running:
                return
            if job.state.status == "queued":
                self._start(job)
                running += 1

    def _start(self, job: _Job) -> None:
        progress = job.dir / "progress.jsonl"
        try:
            with (job.dir / "log.txt").open("ab") as log:
                job.proc = subprocess.Popen(
                    job.spec.command(progress),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=job.spec.child_env(dict(os.environ), job.dir),
                    start_new_session=True,
                )  # own group: kill takes all of it
        except OSError as error:
            self._finish(job, "failed", None, f"could not start: {error}")
            return
        job.state.status, job.state.started_at = "running", time.time()

    def _finish(self, job: _Job, status: Status, code: int | None, message: str) -> None:
        job.state.status, job.state.exit_code, job.state.message, job.state.ended_at = (
            status,
            code,
            message,
            time.time(),
        )
        job.kill_at = None
        fields = ("status", "exit_code", "message", "started_at", "ended_at", "last_checkpoint")
        _write_json(job.dir / "exit.json", {k: getattr(job.state, k) for k in fields})

    def _read_progress(self, job: _Job) -> None:
        """Fold new complete lines of progress.jsonl into the job's state (a half-written last line waits)."""
        try:
            with (job.dir / "progress.jsonl").open("rb") as f:
                f.seek(job.progress_offset)
                data = f.read()
        except FileNotFoundError:
            return
        job.progress_offset += len(data)
        *lines, job.progress_tail = (job.progress_tail + data).split(b"\n")
        for line in lines:
            _apply(job.state, line)

    def _load(self, job_dir: Path) -> None:
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
        job = _Job(spec, job_dir, state)
        self._read_progress(job)
        if (job_dir / "exit.json").exists():
            for key, value in json.loads((job_dir / "exit.json").read_text()).items():
                setattr(state, key, value)
        self._jobs[state.id] = job


def _apply(state: JobState, line: bytes) -> None:
    """Copy a progress line's fields into the job's state, by name: the trainer's Progress is the wire type."""
    read = read_line(line)
    if read is None:
        return  # a torn line from a killed child: skip it, the next report supersedes it
    event, progress = read
    if event in ("progress", "done"):
        for name in JOB_FIELDS:
            setattr(state, name, getattr(progress, name))


def _signal(proc: subprocess.Popen | None, sig: int, group: bool) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(proc.pid, sig) if group else proc.send_signal(sig)


def _last_line(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = [ln.strip() for ln in f.read().decode("utf-8", errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return "no log"
    return lines[-1] if lines else "no output"


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    tmp.replace(path)  # readers never see half a file
