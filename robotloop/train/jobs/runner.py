"""A training job's process: started as its own process group, reaped when it exits, stopped on cancel."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from .record import JobRecord


class JobRunner:
    """Starts, reaps and stops the processes of jobs; how many run and in which order is the manager's.

    A job is one process group. Cancel sends SIGTERM to the leader only: the trainer checkpoints and exits; its
    decode workers must stay alive until then. SIGKILL goes to the whole group once `cancel_grace_s` is over,
    and to what is left of the group when the leader has exited.
    """

    def __init__(self, cancel_grace_s: float = 120.0) -> None:
        self.cancel_grace_s = cancel_grace_s

    def start(self, job: JobRecord) -> None:
        """Run the job's command, its output going to its log; a job that cannot start is finished as failed."""
        try:
            with job.log_path.open("ab") as log:
                job.proc = subprocess.Popen(
                    job.spec.command(job.progress_path),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=job.spec.child_env(dict(os.environ), job.dir),
                    start_new_session=True,
                )  # own group: kill takes all of it
        except OSError as error:
            job.finish("failed", None, f"could not start: {error}")
            return
        job.state.status, job.state.started_at = "running", time.time()

    def cancel(self, job: JobRecord) -> None:
        """Ask a running job to stop: SIGTERM now (it checkpoints, then exits), SIGKILL after the grace period."""
        if job.cancel_requested:
            return
        job.cancel_requested, job.kill_at = True, time.monotonic() + self.cancel_grace_s
        job.state.message = "cancelling: writing a checkpoint"
        _signal(job.proc, signal.SIGTERM, group=False)  # the leader only: its decode workers must live on

    def reap(self, job: JobRecord) -> None:
        """Finish `job` if its process has exited; SIGKILL it once a cancel's grace period is over."""
        code = job.proc.poll() if job.proc else None
        if code is None:
            if job.kill_at is not None and time.monotonic() > job.kill_at:
                _signal(job.proc, signal.SIGKILL, group=True)
            return
        _signal(job.proc, signal.SIGKILL, group=True)  # leftovers of the group (orphaned workers), if any
        job.read_progress()
        if job.cancel_requested:
            killed = code == -signal.SIGKILL
            note = ": killed after the grace period, before its checkpoint" if killed else f" at step {job.state.step}"
            job.finish("cancelled", code, f"cancelled{note}")
        elif code == 0:
            job.finish("succeeded", code, f"finished {job.state.step} steps")
        else:
            job.finish("failed", code, f"exit code {code}: {job.last_log_line()}")

    def wait(self, job: JobRecord, deadline: float) -> None:
        """Wait for the job's process until `deadline` (time.monotonic), then SIGKILL its group."""
        if job.proc is None:
            return
        try:
            job.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(job.proc, signal.SIGKILL, group=True)
            job.proc.wait()


def _signal(proc: subprocess.Popen | None, sig: int, group: bool) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
