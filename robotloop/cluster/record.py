"""`robotloop record --ray`: scripted sim demos on Ray actors, each episode committed to the bucket on its node.

Without Ray, pool workers encode each demo into the recorder's staging folder and the driver commits it. Across
nodes the driver would have to fetch every encoded episode first, so here an episode is committed on the node that
encoded it: by a Ray task pinned there (no CPU asked: it waits on uploads), with a `DatasetRecorder` over that
node's staging folder (actors on one node share it, as recorders on one machine do). Commits to one dataset must
not overlap (each grows the same files), so the driver runs one commit at a time, in the order the demos finished;
the actor that encoded an episode is already on its next demo meanwhile, as a pool worker is.

Faults: an actor that dies during a demo loses that demo; its seed runs again on a fresh actor (`ATTEMPTS` runs,
then it is reported failed). A commit that dies leaves the dataset as its metadata says (metadata goes up last; the
next commit on that node points back what it had uploaded, `DatasetRecorder`); its seed runs again.

Example:
    ```python
    >>> report = record_sim(recorder, "transfer_cube", episodes=50, workers=8, ray="auto")
    ```
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..capture.recorder import CommitReport, DatasetRecorder, DatasetSpec, WrittenEpisode
from ..capture.sim_record import RecordReport, _demo, _discard, _notify, _Target
from ..storage import BucketClient, BucketUrl
from . import ATTEMPTS, call_error, node_id, ray_session, worker_died, worker_env
from .eval import CLOSE_S, _close


@dataclass(frozen=True)
class RecordJob:
    """What every recording actor needs (picklable: sent once per actor)."""

    endpoint: str
    token: str | None
    url: str  # the dataset's bucket URL
    spec: DatasetSpec
    task: str
    image_size: tuple[int, int]
    max_steps: int | None
    keep_failed: bool


class RecordWorker:
    """A Ray actor (`ray.remote(RecordWorker)`): runs scripted demos into its node's staging folder."""

    def __init__(self, job: RecordJob) -> None:
        _start(job)
        self.job = job
        self.target = _Target(job.spec, BucketUrl.parse(job.url).bucket_id, _recorder(job).staging)

    def demo(self, seed: int) -> tuple[bool, WrittenEpisode | None, str]:
        """Run and encode the demo of `seed`: (the expert succeeded, the episode to commit or None, this node)."""
        job = self.job
        _, success, written = _demo(job.task, seed, job.image_size, job.max_steps, self.target, job.keep_failed)
        return success, written, node_id()

    def close(self) -> None:
        """Nothing to release: an actor holds no episode (they wait in the staging folder)."""


def commit_episode(job: RecordJob, written: WrittenEpisode) -> CommitReport:
    """A Ray task on the node that encoded `written`: commit it (`DatasetRecorder.commit_written`)."""
    _start(job)
    return _recorder(job).commit_written(written)


def discard_episode(written: WrittenEpisode) -> None:
    """A Ray task on the node that encoded `written`: drop it (enough episodes were committed meanwhile)."""
    _discard(written)


_recorders: dict[tuple[str, str], DatasetRecorder] = {}  # per Ray worker process: its node's, by endpoint and URL


def _recorder(job: RecordJob) -> DatasetRecorder:
    key = (job.endpoint, job.url)
    if key not in _recorders:
        _recorders[key] = DatasetRecorder(BucketClient(job.endpoint, job.token), BucketUrl.parse(job.url), job.spec)
    return _recorders[key]


def _start(job: RecordJob) -> None:
    """A Ray worker's set-up, once per process: the libraries quiet, logs as the CLI's, no ffmpeg note per episode."""
    global _started
    if _started:
        return
    import av

    from ..output import log_to_console, quiet_libraries

    quiet_libraries()
    log_to_console()
    av.logging.set_libav_level(av.logging.ERROR)
    _started = True


_started = False


@dataclass
class _Demo:
    seed: int
    attempt: int = 1


def record_on_ray(
    address: str,
    job: RecordJob,
    workers: int,
    episodes: int,
    seeds: Iterator[int],
    max_attempts: int,
    report: RecordReport,
    on_event: Callable[[str, int, CommitReport | None], None] | None,
    should_stop: Callable[[], bool],
) -> int:
    """`record_sim`'s loop on `workers` actors of the cluster at `address`: demos of `seeds` (at most
    `max_attempts` of them) until `episodes` are committed, each counted in `report` as `record_sim` counts it;
    `on_event` and `should_stop` as `record_sim`'s. A demo whose actor died counts once, when it ends.
    Returns the first seed not taken from `seeds` (0 when none was).

    Raises:
        RayUnavailable: no Ray or no cluster at `address`. What a demo or commit raised in Ray, as itself.
    """
    with ray_session(address) as ray:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        env = {"env_vars": worker_env()}
        actor_class = ray.remote(RecordWorker).options(
            num_cpus=1, scheduling_strategy="SPREAD", max_restarts=0, runtime_env=env
        )
        # Never retried by Ray: a commit that died after its upload would be committed twice.
        committer, discarder = (
            ray.remote(num_cpus=0, max_retries=0, runtime_env=env)(f) for f in (commit_episode, discard_episode)
        )

        def on_node(task: Any, node: str) -> Any:
            return task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))

        idle = [actor_class.remote(job) for _ in range(workers)]
        demos: dict[Any, tuple[Any, _Demo]] = {}
        encoded: deque[tuple[_Demo, WrittenEpisode, str]] = deque()  # waiting for their turn to commit
        commit: tuple[Any, _Demo] | None = None
        again: deque[_Demo] = deque()  # demos whose actor or commit died
        tried, next_seed, stopping = 0, 0, False

        def in_flight() -> int:
            return len(report.committed) + len(demos) + len(encoded) + (commit is not None)

        try:
            while True:
                while idle and not stopping and in_flight() < episodes:
                    if again:
                        demo = again.popleft()
                    elif tried < max_attempts and (seed := next(seeds, None)) is not None:
                        demo, tried, next_seed = _Demo(seed), tried + 1, max(next_seed, seed + 1)
                    else:
                        break
                    actor = idle.pop()
                    demos[actor.demo.remote(demo.seed)] = (actor, demo)
                if commit is None and encoded:
                    demo, written, node = encoded.popleft()
                    commit = (on_node(committer, node).remote(job, written), demo)
                if not demos and commit is None:
                    return next_seed
                [ref], _ = ray.wait([*demos, *([commit[0]] if commit else [])], num_returns=1)
                if commit is not None and ref == commit[0]:
                    demo = commit[1]
                    commit = None
                    try:
                        done = ray.get(ref)
                    except Exception as error:
                        if not worker_died(ray, error):
                            raise call_error(ray, error) from None
                        _retry(demo, again, report, on_event)
                        continue
                    report.committed.append(done)
                    _notify(on_event, "committed", demo.seed, done)
                else:
                    actor, demo = demos.pop(ref)
                    try:
                        success, written, node = ray.get(ref)
                    except Exception as error:
                        if not worker_died(ray, error):
                            raise call_error(ray, error) from None
                        ray.kill(actor)
                        idle.append(actor_class.remote(job))
                        _retry(demo, again, report, on_event)
                        continue
                    idle.append(actor)
                    if len(report.committed) < episodes:
                        report.attempted += 1
                    if not success and len(report.committed) < episodes:
                        report.failed_seeds.append(demo.seed)
                        _notify(on_event, "failed", demo.seed, None)
                    if written is not None and len(report.committed) + len(encoded) + (commit is not None) < episodes:
                        encoded.append((demo, written, node))
                    elif written is not None:  # enough episodes are committed or queued already
                        on_node(discarder, node).remote(written)
                stopping = stopping or should_stop()
        finally:  # after an error: the episodes waiting for their turn go, uncommitted, before Ray may disconnect
            dropped = [on_node(discarder, node).remote(written) for _, written, node in encoded]
            if dropped:
                ray.wait(dropped, num_returns=len(dropped), timeout=CLOSE_S)
            _close(ray, idle, [a for a, _ in demos.values()])


def _retry(
    demo: _Demo,
    again: deque[_Demo],
    report: RecordReport,
    on_event: Callable[[str, int, CommitReport | None], None] | None,
) -> None:
    """A demo whose actor died runs again, until its `ATTEMPTS`th run; then it is reported failed."""
    if demo.attempt < ATTEMPTS:
        again.append(_Demo(demo.seed, demo.attempt + 1))
    else:
        report.attempted += 1
        report.failed_seeds.append(demo.seed)
        _notify(on_event, "failed", demo.seed, None)


__all__ = ["RecordJob", "RecordWorker", "commit_episode", "discard_episode", "record_on_ray"]
