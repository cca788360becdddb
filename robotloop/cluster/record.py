"""`robotloop record --ray`: scripted sim demos on Ray actors, each episode committed to the bucket on its node.

Without Ray, pool workers encode each demo into the recorder's staging folder and the driver commits it. Across
nodes the driver would have to fetch every encoded episode first, so here an episode is committed on the node that
encoded it: by that node's `EpisodeCommitter` actor (no CPU asked: it waits on uploads), with a `DatasetRecorder`
over the node's staging folder (actors on one node share it, as recorders on one machine do). Commits to one
dataset must not overlap (each grows the same files), so the driver runs one commit at a time, in the order the
demos finished; the actor that encoded an episode is already on its next demo meanwhile, as a pool worker is.

Faults: an actor that dies during a demo loses that demo; its seed runs again on a fresh actor (`ATTEMPTS` runs,
then it is reported failed). A commit that dies leaves the dataset as its metadata says (metadata goes up last; the
next commit on that node points back what it had uploaded, `DatasetRecorder`); its seed runs again.

Example:
    ```python
    >>> report = record_sim(recorder, "transfer_cube", episodes=50, workers=8, ray="auto")
    ```
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..capture.append import load_append
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

    def node(self) -> str:
        """The node this actor runs on (its committer goes there)."""
        return node_id()

    def demo(self, seed: int) -> tuple[bool, WrittenEpisode | None, str]:
        """Run and encode the demo of `seed`: (the expert succeeded, the episode to commit or None, this node)."""
        job = self.job
        _, success, written = _demo(job.task, seed, job.image_size, job.max_steps, self.target, job.keep_failed)
        return success, written, node_id()

    def close(self) -> None:
        """Nothing to release: an actor holds no episode (they wait in the staging folder)."""


class EpisodeCommitter:
    """A Ray actor (`ray.remote(EpisodeCommitter)`), one per node that encodes episodes: commits them to the bucket's
    dataset from that node's staging folder, or drops them.

    An actor rather than a Ray task per commit: Ray stops an idle task worker beyond a node's CPUs after about a
    second, and each fresh one paid lerobot's import and the dataset's tail download again (measured on 2 cores: 7 s
    of a 7.5 s commit, where the pool's driver took 0.5 s)."""

    def __init__(self, job: RecordJob) -> None:
        _start(job)
        self.recorder = _recorder(job)
        load_append()  # while the node's first demos run, not in its second commit

    def commit(self, written: WrittenEpisode) -> CommitReport:
        """Commit `written` (`DatasetRecorder.commit_written`)."""
        return self.recorder.commit_written(written)

    def discard(self, written: WrittenEpisode) -> None:
        """Drop `written` (enough episodes were committed meanwhile)."""
        _discard(written)

    def close(self) -> None:
        """Nothing to release: the recorder's copy of the dataset's tail is its node's staging, kept for the next."""


def _recorder(job: RecordJob) -> DatasetRecorder:
    return DatasetRecorder(BucketClient(job.endpoint, job.token), BucketUrl.parse(job.url), job.spec)


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
        # Never restarted or retried by Ray: a commit that died after its upload would be committed twice.
        committers: dict[str, Any] = {}  # node -> its committer: one on each node an actor runs on

        def committer(node: str) -> Any:
            if node not in committers:
                on_node = NodeAffinitySchedulingStrategy(node, soft=False)
                options = dict(num_cpus=0, max_restarts=0, runtime_env=env, scheduling_strategy=on_node)
                committers[node] = ray.remote(EpisodeCommitter).options(**options).remote(job)
            return committers[node]

        idle = [actor_class.remote(job) for _ in range(workers)]
        placed = [actor.node.remote() for actor in idle]  # as each actor starts: a committer on its node
        demos: dict[Any, tuple[Any, _Demo]] = {}
        encoded: deque[tuple[_Demo, WrittenEpisode, str]] = deque()  # waiting for their turn to commit
        commit: tuple[Any, _Demo, str] | None = None  # the commit in flight, its demo and node
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
                    commit = (committer(node).commit.remote(written), demo, node)
                if not demos and commit is None:
                    return next_seed
                [ref], _ = ray.wait([*placed, *demos, *([commit[0]] if commit else [])], num_returns=1)
                if ref in placed:
                    placed.remove(ref)
                    with contextlib.suppress(Exception):  # an actor that died starting: its demo says so, runs again
                        committer(ray.get(ref))
                elif commit is not None and ref == commit[0]:
                    _, demo, node = commit
                    commit = None
                    try:
                        done = ray.get(ref)
                    except Exception as error:
                        if not worker_died(ray, error):
                            raise call_error(ray, error) from None
                        ray.kill(committers.pop(node))  # the node's next episode starts a fresh one
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
                        committer(node).discard.remote(written)
                stopping = stopping or should_stop()
        finally:  # after an error: the episodes waiting for their turn go, uncommitted, before Ray may disconnect
            dropped = [committer(node).discard.remote(written) for _, written, node in encoded]
            if dropped:
                ray.wait(dropped, num_returns=len(dropped), timeout=CLOSE_S)
            busy = [committers.pop(commit[2])] if commit is not None else []
            _close(ray, [*idle, *committers.values()], [*busy, *(a for a, _ in demos.values())])


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


__all__ = ["EpisodeCommitter", "RecordJob", "RecordWorker", "record_on_ray"]
