"""The job table: which jobs exist, which wait and which run, and the thread that keeps it current."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ...errors import Busy, NotFound
from ...storage.private import private_dir
from .record import FINISHED, LOG_CHUNK, PROGRESS_POINTS, JobRecord, JobState
from .runner import JobRunner
from .spec import JobSpec


class QueueFull(Busy, RuntimeError):
    """Too many jobs wait already; submit again once one has finished."""


class UnknownJob(NotFound, KeyError):
    """No job with this id."""

    def __str__(self) -> str:
        return f"no job '{self.args[0]}'; GET /v1/jobs lists the jobs"


class JobManager:
    """Runs training jobs as subprocesses under `root`, at most `max_running` at once (the rest wait queued).

    Owns the job table (id -> `JobRecord`, under one lock) and the order jobs start in; each job's files are its
    record's, its process the runner's (`JobRunner`). A background thread reaps finished jobs, starts queued ones
    and SIGKILLs cancelled jobs past their grace period. Jobs found under `root` from an earlier run are listed
    with their final state.
    """

    def __init__(
        self, root: Path, max_running: int = 1, cancel_grace_s: float = 120.0, poll_s: float = 0.2, max_queued: int = 32
    ) -> None:
        self.root, self.max_running, self.poll_s, self.max_queued = Path(root), max_running, poll_s, max_queued
        self.runner = JobRunner(cancel_grace_s)
        private_dir(self.root)
        self._jobs: dict[str, JobRecord] = {}
        self._lock = threading.RLock()
        self._closed = threading.Event()
        for path in sorted(self.root.glob("*/job.json")):
            job = JobRecord.load(path.parent)
            self._jobs[job.state.id] = job
        self._watcher = threading.Thread(target=self._watch, name="robotloop-jobs", daemon=True)
        self._watcher.start()

    @property
    def cancel_grace_s(self) -> float:
        return self.runner.cancel_grace_s

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
        job = JobRecord.create(self.root, spec)
        with self._lock:
            self._jobs[job.state.id] = job
            self._pump()
        return job.state.id

    def state(self, job_id: str) -> JobState:
        """The job's status and latest progress.

        Raises:
            UnknownJob: no such job.
        """
        with self._lock:
            job = self._get(job_id)
            job.read_progress()
            return JobState(**asdict(job.state))

    def list(self) -> list[JobState]:
        """All jobs, oldest first."""
        with self._lock:
            return [self.state(job_id) for job_id in self._in_order()]

    def log(self, job_id: str, offset: int = 0, limit: int = LOG_CHUNK) -> tuple[str, int]:
        """Log text from byte `offset` (at most `limit` bytes) and the offset to ask for next (`JobRecord.log`).

        Raises:
            UnknownJob: no such job. BadValue: a negative offset or limit.
        """
        return self._get(job_id).log(offset, limit)

    def progress(self, job_id: str, after_step: int = -1, limit: int = PROGRESS_POINTS) -> list[dict[str, Any]]:
        """The job's progress reports with a step past `after_step`, oldest first (`JobRecord.progress`).

        Raises:
            UnknownJob: no such job. BadValue: `limit` <= 0.
        """
        return self._get(job_id).progress(after_step, limit)

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
                job.finish("cancelled", None, "cancelled before it started")
            elif job.state.status == "running":
                self.runner.cancel(job)
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
        if not cancel_running:
            return
        deadline = time.monotonic() + (self.cancel_grace_s if timeout_s is None else timeout_s)
        for job in jobs:
            if job.proc is None:
                continue
            self.runner.wait(job, deadline)
            with self._lock:
                self.runner.reap(job)

    def _get(self, job_id: str) -> JobRecord:
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
                        self.runner.reap(job)
                self._pump()

    def _pump(self) -> None:
        """Start queued jobs, oldest first, while fewer than `max_running` run."""
        running = sum(j.state.status == "running" for j in self._jobs.values())
        for job_id in self._in_order():
            job = self._jobs[job_id]
            if running >= self.max_running:
                return
            if job.state.status == "queued":
                self.runner.start(job)
                running += 1
