"""`robotloop eval --ray`: an evaluation's waves of episodes on Ray actors, each with its own copy of the policy.

Without Ray, sim processes step in lockstep and the driver runs one batched policy forward per step for all of
them. Across nodes that would send every frame to the driver and back each step, so here each actor runs whole
waves on its own: it locates the policy on its node (a bucket checkpoint is downloaded into the node's cache), holds
one `SimBatch` in its own process, and runs a wave exactly as `evaluate` runs it locally (`_run_lockstep`). What
comes back is one `EpisodeResult` per episode, and the mp4 of a filmed one.

Same seeds, same episodes: a wave holds the same episodes as the local run's wave when `batch` is the same, and the
policy sees the same batch. (A batch of other episodes moves ACT's actions by float rounding, ~3e-8, since the
batched matrix products sum in another order; that can change an episode.) On CPU the thread count orders those sums
too: an actor's policy computes on `ACTOR_CPUS` threads, its share of the node, so a local run gives the same actions
bit for bit on as many (`torch.set_num_threads`).

Example:
    ```python
    >>> report = evaluate(policy_dir, "transfer_cube", episodes=50, workers=8, ray="auto", batch=5)
    >>> report.nodes                      # {node id: the episodes its actors ran}
    ```
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..deploy.lockstep import SimBatch, Slot
from . import ATTEMPTS, RayUnavailable, call_error, gpu_share, node_id, ray_session, worker_died, worker_env

log = logging.getLogger(__name__)
CLOSE_S = 30  # an idle actor's time to close its sims and remove its files before it is killed
ACTOR_CPUS = 1  # what each actor asks Ray for, and the threads its policy computes with
FILMS_PREFIX = "robotloop-eval-"  # an actor's film folder in the node's temp dir: robotloop-eval-<pid>-<random>


@dataclass(frozen=True)
class EvalJob:
    """What every evaluation actor needs to build its policy and sims (picklable: sent once per actor)."""

    policy: str  # what the actor locates (`robotloop.deploy.resolve.locate_policy`): a checkpoint URL or folder
    bucket: tuple[str, str | None] | None  # the endpoint and token a checkpoint URL is downloaded with
    task: str
    max_steps: int
    image_size: tuple[int, int] | None
    device: str
    inference: dict | None
    backend: str
    shadow_map: int | None = None  # the sims' shadow maps (None: `shadow_map_size` of the image)


@dataclass(frozen=True)
class WaveDone:
    """An actor's answer for one wave: where it ran, its episodes, and its filmed episodes' mp4s (name, bytes)."""

    node: str
    results: list  # EpisodeResult, video None
    videos: dict[int, tuple[str, bytes]]


class EvalWorker:
    """A Ray actor (`ray.remote(EvalWorker)`): a policy and a batch of `size` sims in one Ray worker process."""

    def __init__(self, job: EvalJob, size: int) -> None:
        import torch

        from ..deploy.evaluate import _load_quietly
        from ..deploy.resolve import locate_policy
        from ..output import log_to_console, quiet_libraries
        from ..storage import BucketClient

        quiet_libraries()
        log_to_console()
        # Set, not left to torch: it reads OMP_NUM_THREADS at import, which Ray sets to the actor's CPUs only when
        # the call starts, and a worker process may have imported torch before (then it took the node's cores).
        torch.set_num_threads(ACTOR_CPUS)
        client = None if job.bucket is None else BucketClient(*job.bucket)
        found = locate_policy(job.policy, lambda: client)  # into this node's cache (robotloop's cache dir)
        self.runner = _load_quietly(found.path, job.device, job.inference, job.backend)
        remove_dead_films()
        self.films = Path(tempfile.mkdtemp(prefix=f"{FILMS_PREFIX}{os.getpid()}-"))
        self.sims = SimBatch(
            job.task, size, 1, job.image_size, job.max_steps, str(self.films), shadow_map=job.shadow_map
        )

    def run(self, wave: list[Slot]) -> WaveDone:
        """Run `wave` as the local evaluation runs a wave; its filmed episodes' mp4s come back as bytes."""
        from ..deploy.evaluate import _run_lockstep

        results = list(_run_lockstep(self.runner, self.sims, wave, self.sims.max_steps))
        videos = {r.index: (Path(r.video).name, Path(r.video).read_bytes()) for r in results if r.video}
        for path in self.films.iterdir():
            path.unlink()
        return WaveDone(node_id(), [replace(r, video=None) for r in results], videos)

    def close(self) -> None:
        """Close the sims and remove the film folder (`ray.kill` alone would leave the folder behind)."""
        self.sims.close()
        shutil.rmtree(self.films, ignore_errors=True)


def remove_dead_films() -> None:
    """Remove the film folders of actors on this node whose process is gone: one killed (OOM, `ray.kill`, a lost
    node's restart) never ran `close`. Its folder name holds its pid."""
    for folder in Path(tempfile.gettempdir()).glob(f"{FILMS_PREFIX}*-*"):
        pid = folder.name.removeprefix(FILMS_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def evaluate_on_ray(
    address: str,
    job: EvalJob,
    slots: list[Slot],
    size: int,
    workers: int,
    video_dir: str | None,
    nodes: dict[str, list[int]],
) -> Iterator[Any]:
    """Run `slots` in waves of `size` on `workers` actors of the cluster at `address`; yield each `EpisodeResult`
    as its wave ends (filmed ones with their mp4 written under `video_dir`). `nodes` gets the episodes each node
    ran. A wave whose actor died is run again on a fresh actor, `ATTEMPTS` times at most.

    Raises:
        RayUnavailable: no Ray or no cluster at `address`, or the actors running one wave kept dying.
        What a wave raised in its actor (NonFiniteAction, ...), as itself.
    """
    with ray_session(address) as ray:
        actor_class = ray.remote(EvalWorker).options(
            num_cpus=ACTOR_CPUS,
            num_gpus=gpu_share(job.device, workers),
            scheduling_strategy="SPREAD",  # over the nodes: each holds one EGL renderer per sim
            max_restarts=0,  # a dead actor is replaced here, with its wave put back in the queue
            runtime_env={"env_vars": worker_env()},
        )
        waves = deque((slots[i : i + size], 1) for i in range(0, len(slots), size))
        idle = [actor_class.remote(job, size) for _ in range(workers)]
        running: dict[Any, tuple[Any, list[Slot], int]] = {}
        try:
            while waves or running:
                while waves and idle:
                    wave, attempt = waves.popleft()
                    actor = idle.pop()
                    running[actor.run.remote(wave)] = (actor, wave, attempt)
                [ref], _ = ray.wait(list(running), num_returns=1)
                actor, wave, attempt = running.pop(ref)
                try:
                    done: WaveDone = ray.get(ref)
                except Exception as error:
                    if not worker_died(ray, error):
                        raise call_error(ray, error) from None
                    episodes = [s.index for s in wave]
                    if attempt >= ATTEMPTS:
                        raise RayUnavailable(
                            f"the Ray workers running episodes {episodes} died {attempt} times; last: {error}"
                        ) from None
                    log.warning("a Ray worker died running episodes %s; they run again on another", episodes)
                    ray.kill(actor)
                    idle.append(actor_class.remote(job, size))  # takes the wave back: its calls wait for its start
                    waves.appendleft((wave, attempt + 1))
                    continue
                idle.append(actor)
                nodes.setdefault(done.node, []).extend(r.index for r in done.results)
                for result in done.results:
                    if result.index in done.videos:
                        name, data = done.videos[result.index]
                        assert video_dir is not None  # an episode is filmed only with a folder to film into
                        path = Path(video_dir) / name
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_bytes(data)
                        result = replace(result, video=str(path))
                    yield result
        finally:  # the actors go with the evaluation, not with the driver's Ray connection (`ray.init` by caller)
            _close(ray, idle, [a for a, _, _ in running.values()])


def _close(ray: Any, idle: list, busy: list) -> None:
    """Idle actors close themselves (a few seconds at most); busy ones (after an error) and the rest are killed."""
    with contextlib.suppress(Exception):  # an actor that cannot close is killed below all the same
        ray.get([actor.close.remote() for actor in idle], timeout=CLOSE_S)
    for actor in [*idle, *busy]:
        ray.kill(actor)
