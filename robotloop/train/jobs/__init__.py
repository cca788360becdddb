"""Training jobs: `robotloop train` runs as subprocesses, tracked on disk. No HTTP here (see services/trainer).

In four pieces: `JobSpec` (spec.py) says what a job runs; `JobRecord` (record.py) is one job's state and its
folder; `JobRunner` (runner.py) starts, reaps and stops its process; `JobManager` (manager.py) keeps the table of
jobs and starts queued ones as slots free up. Each job has a directory ``<root>/<id>/``::

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

from .manager import JobManager, QueueFull, UnknownJob
from .record import FINISHED, JobRecord, JobState, Status
from .runner import JobRunner
from .spec import JobSpec

__all__ = [
    "FINISHED",
    "JobManager",
    "JobRecord",
    "JobRunner",
    "JobSpec",
    "JobState",
    "QueueFull",
    "Status",
    "UnknownJob",
]
