"""A round's sim fleet: N robots, each its own process, registered on channel stable; each pulls the stable release
through the deploy service and the bucket (signature and hashes checked, only changed bytes fetched), runs it on
its own fresh seeds with the scripted expert taking over after a stall, and records every episode into its own
fleet dataset (`robotloop.fleet`). Nothing passes through the driver but each robot's counts at the end: the
episodes themselves are read back from the bucket (`fleet_episodes`), as a team's would be.

Each robot is a process, not a thread: policy inference, MuJoCo and rendering would share one interpreter lock.
The processes are forked from one fork server (multiprocessing's `forkserver`) that imported what a robot needs
(torch, lerobot's ACT, MuJoCo: about 5 CPU seconds) once, instead of each robot importing it at the same moment:
ten robots importing at once took 20-27 s on a 16-core machine before their first step (2026-12-06). The server
imports with the GPU hidden, and a robot makes its CUDA and EGL contexts fresh after the fork; where a process forked
from the server still cannot use the GPU (checked once), the robots are spawned instead.
With `ray` (the loop's `--ray`) each robot is a Ray task instead, one CPU and an equal share of the GPU each, spread
over the cluster's nodes; it reaches the deploy service and the bucket over the network as a robot would and trusts
the key whose text it was given. Its release store is the driver's folder on the driver's node, and under
robotloop's cache folder on any other node (where the driver's folder need not exist).

Example:
    ```python
    >>> results = run_fleet([FleetRobot(...), FleetRobot(...)])     # blocks until every robot ran its episodes
    >>> episodes = fleet_episodes(client, [r.record_to for r in robots], release="run-r0-3000")
    ```
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import multiprocessing as mp
import os
import queue
import tempfile
import time
from dataclasses import dataclass, field, replace
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

from ..capture.recorder import EPISODE_FACTS_FILE
from ..storage import BucketClient, BucketUrl, NotFound
from ..workers import start_worker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetRobot:
    """What one fleet robot's process needs (plain values: it crosses a spawn)."""

    robot_id: str
    token: str  # its robot token, from the deploy service's registration
    deploy_url: str
    endpoint: str  # the bucket server's (or the Hub's)
    storage_token: str | None
    task: str
    image_size: tuple[int, int]
    shadow_map: int | None  # its camera's shadow-map side (None: gym-aloha's for the size)
    device: str
    first_seed: int  # its episodes run the scenes first_seed + 1, + 2, ...
    episodes: int
    policy_steps: int  # the policy's ticks per episode; a takeover's steps come on top
    stall_steps: int  # K: no new reward stage for K steps hands the robot to the expert
    record_to: str  # its fleet dataset
    vcodec: str
    store: Path  # its release store (kept across rounds: a new release pulls only what changed); absolute
    trusted_keys: str  # the deploy key's public key file, its text (the driver's path need not exist on a Ray node)
    rate_hz: float = 50.0  # ALOHA's rate; math.inf runs as fast as the machine does
    # Branch points per episode the policy did not finish alone: n of its states after its last progress
    # (`Takeovers`), from which the expert drives again once the episodes are run, each drive an episode of expert
    # frames (0: none)
    branches: int = 0


@dataclass
class FleetRobotResult:
    robot_id: str
    finished: int  # episodes run to their end
    running: str | None  # the release it ran
    recording: dict[str, Any]  # RecordingStats.as_dict()
    takeovers: dict[str, Any]  # TakeoverStats.as_dict()
    control_hz: float | None
    bytes_pulled: int
    error: str | None = None  # the robot failed: why
    backend: str | None = None  # what ran the release, e.g. "torch (cuda:0)" (`RobotRuntime.backend`)
    # Seconds from the driver's start of the robots until: its code runs (process start, imports), its assignment,
    # its release pulled and checked, its policy loaded, then warmed up, its swap-in (its first action follows), its
    # last episode's end, its recorder closed (the last commit). Where a fleet stage's time goes beside the control.
    timings: dict[str, float] = field(default_factory=dict)
    node: str | None = None  # the Ray node that ran it (None: a process of the driver's machine)


def run_fleet(robots: list[FleetRobot], timeout_s: float = 3600.0, ray: str | None = None) -> list[FleetRobotResult]:
    """Run every robot until each has finished its episodes, in its own process or, with `ray` (a `--ray` address),
    as a task of that Ray cluster; their results, in order.

    A robot that dies or runs past `timeout_s` is reported with its `error`; the others' results stand.

    Raises:
        RayUnavailable: `ray` given, and Ray is missing or no cluster answers there.
    """
    if ray is not None:
        return _run_on_ray(robots, timeout_s, ray)
    ctx = _robot_context()
    results = ctx.Queue()
    # Not daemons: each robot starts its recorder's writer process. `start_worker` ends a robot with its driver.
    started = time.time()  # wall clock: the robots' own monotonic clocks are not the driver's
    env = dict(os.environ)  # now, not the fork server's from its start: a robot runs with the driver's settings
    processes = [
        ctx.Process(target=_robot_main, args=(r, results, os.getpid(), started, env), name=f"fleet-{r.robot_id}")
        for r in robots
    ]
    for process in processes:
        process.start()
    found: dict[str, FleetRobotResult] = {}
    deadline = time.monotonic() + timeout_s
    while len(found) < len(robots) and time.monotonic() < deadline:
        try:
            result = results.get(timeout=1.0)
            found[result.robot_id] = result
        except queue.Empty:
            if not any(p.is_alive() for p in processes) and results.empty():
                break
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
    return [found.get(r.robot_id) or _failed(r, "the robot died") for r in robots]


def _run_on_ray(robots: list[FleetRobot], timeout_s: float, address: str) -> list[FleetRobotResult]:
    """`run_fleet` on a Ray cluster: a task a robot, never retried (a rerun would record its episodes twice)."""
    from ..cluster import call_error, gpu_share, ray_session, worker_died, worker_env

    with ray_session(address) as ray:
        robot_task = ray.remote(_ray_robot).options(
            num_cpus=1,
            num_gpus=gpu_share(robots[0].device, len(robots)) if robots else 0,
            scheduling_strategy="SPREAD",  # each robot holds an EGL renderer and a policy: over the nodes
            max_retries=0,
            runtime_env={"env_vars": worker_env()},
        )
        started = time.time()
        # Ray Client (ray://) drivers run on no node of the cluster: their folders are on none
        here = None if address.startswith("ray://") else ray.get_runtime_context().get_node_id()
        refs = [robot_task.remote(r, started, here) for r in robots]
        done, late = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for ref in late:
            ray.cancel(ref, force=True)  # its process goes, and its recorder's writer with it (`start_worker`)
        results = []
        for robot, ref in zip(robots, refs, strict=True):
            if ref in late:
                results.append(_failed(robot, f"still running after {timeout_s:.0f} s"))
                continue
            try:
                results.append(ray.get(ref))
            except Exception as error:  # noqa: BLE001 - reported, as the process pool's robots report theirs
                why = "the robot died" if worker_died(ray, error) else _why(call_error(ray, error))
                log.warning("fleet robot %s failed: %s", robot.robot_id, why)
                results.append(_failed(robot, why))
        return results


def _ray_robot(robot: FleetRobot, started: float, driver_node: str | None) -> FleetRobotResult:
    """A robot as a Ray task: quiet and logging as the driver does, as `start_worker` makes a pool's robot; away
    from the driver's node, its release store under this node's robotloop cache."""
    from ..cluster import node_id
    from ..config import cache_home
    from ..output import log_to_console, quiet_libraries

    quiet_libraries()
    log_to_console()
    node = node_id()
    if node != driver_node:  # the same store each round on this node: a new release pulls only what changed
        digest = hashlib.sha256(str(robot.store).encode()).hexdigest()[:12]
        robot = replace(robot, store=cache_home() / "fleet" / f"{robot.robot_id}-{digest}")
    return replace(_run_robot(robot, started), node=node)


def _failed(robot: FleetRobot, why: str) -> FleetRobotResult:
    return FleetRobotResult(robot.robot_id, 0, None, {}, {}, None, 0, error=why)


def _why(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


# What a robot imports before its first step, imported once by the fork server its processes are forked from.
ROBOT_IMPORTS = (
    "robotloop.deploy.runner",  # torch
    "robotloop.deploy.runtime",
    "robotloop.deploy.envs",  # MuJoCo and the ALOHA sim
    "robotloop.fleet",
    "robotloop.sim.expert",
    "lerobot.policies.act.modeling_act",  # what `load_policy` imports
    "lerobot.policies.factory",
    "lerobot.configs.policies",
    "safetensors.torch",
)


def _robot_context() -> Any:
    """Fork server processes: each robot starts with `ROBOT_IMPORTS` in place (the server imports them once, from its
    start (`start_fork_server`), and forks every robot of this driver process, round after round). Spawned processes
    instead where a process forked from the server cannot use the GPU the driver has: checked once, by a probe."""
    global _FORKS_USABLE
    ctx = start_fork_server()
    if _FORKS_USABLE is None:
        _FORKS_USABLE = _probe_fork_server(ctx)
        if not _FORKS_USABLE:
            log.warning("processes forked from the fleet's fork server cannot use CUDA: robots are spawned instead")
    return ctx if _FORKS_USABLE else mp.get_context("spawn")


_FORKS_USABLE: bool | None = None  # whether a process forked from the fork server can use CUDA (None: not probed)
# The fork server imports with no GPU to see. On an H100 machine (2026-12-06) its imports started CUDA, and a process
# forked after that cannot use it; an import that asks whether there is a GPU is told no (through NVML, which starts
# nothing), as on a CPU machine. Each robot then takes the driver's environment back (`_as_driver`) and its GPU.
_SERVER_HIDES_GPU = {"CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


def start_fork_server() -> Any:
    """Start the robots' fork server, if it is not running, and return its multiprocessing context. The server starts
    with `_SERVER_HIDES_GPU` over the driver's environment and makes `ROBOT_IMPORTS` on its own, beside whatever the
    driver does next: `run_rounds` starts it before round 0, so round 1's robots do not wait for its imports and
    probe (14-15 s on an H100 machine, 4 s on the 2-core one, 2026-12-07). The first robot forked waits for whatever
    is left of them.

    Example:
        ```python
        >>> start_fork_server()     # returns at once (milliseconds); the server imports torch, lerobot, MuJoCo
        ```
    """
    import torch

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", *ROBOT_IMPORTS])  # "__main__": what a spawned process would import too
    torch.cuda.is_available()  # starts CUDA here first: the moment below cannot hide this process's GPU
    driver_env = dict(os.environ)
    os.environ.update(_SERVER_HIDES_GPU)
    try:
        forkserver.ensure_running()  # the server takes this environment; a running one is left as it is
    finally:
        for key in _SERVER_HIDES_GPU:
            if key in driver_env:
                os.environ[key] = driver_env[key]
            else:
                os.environ.pop(key, None)
    return ctx


def _probe_fork_server(ctx: Any) -> bool:
    """Fork a child from the (started) fork server that uses the GPU as a robot would (`_cuda_works_after_fork`)."""
    import torch

    with ctx.Pool(1) as probe:
        return probe.apply(_cuda_works_after_fork, (dict(os.environ), torch.cuda.is_available()))


def _cuda_works_after_fork(env: dict[str, str], wants_cuda: bool) -> bool:
    """A robot's first uses of the GPU: a tensor on it where the driver has one, and a sim's camera frame (EGL
    through the GPU's driver, which is loaded, not started, in the server)."""
    _as_driver(env)
    import torch

    from ..sim import AlohaSim

    if torch.cuda._is_in_bad_fork():
        return False
    try:
        if wants_cuda and torch.ones(1, device="cuda").item() != 1:
            return False
    except RuntimeError:  # CUDA started before the fork by another library (not torch): "initialization error"
        return False
    try:
        sim = AlohaSim("transfer_cube", image_size=(24, 32))
        try:
            return sim.reset(seed=0)["pixels"]["top"].shape == (24, 32, 3)
        finally:
            sim.close()
    except Exception:  # noqa: BLE001 - whatever the GL stack raises after a fork: the robots are spawned instead
        return False


def _as_driver(env: dict[str, str]) -> None:
    """The driver's environment of this run, over the fork server's (which it had at the server's start). The
    thread count torch took from it at import is set again: libgomp read OMP_NUM_THREADS in the fork server.
    Libraries that keep what they read at import (huggingface_hub's constants) keep the server's: a robot is given
    its endpoints, tokens and folders explicitly (`FleetRobot`)."""
    os.environ.clear()
    os.environ.update(env)
    if threads := env.get("OMP_NUM_THREADS"):
        import torch

        torch.set_num_threads(int(threads))


def _robot_main(robot: FleetRobot, results: Any, parent_pid: int, started: float, env: dict[str, str]) -> None:
    start_worker(parent_pid)
    _as_driver(env)
    try:
        results.put(_run_robot(robot, started))
    except Exception as error:  # noqa: BLE001 - reported to the driver, which goes on with the other robots
        log.warning("fleet robot %s failed: %s", robot.robot_id, error)
        results.put(_failed(robot, _why(error)))


def _run_robot(robot: FleetRobot, started: float) -> FleetRobotResult:
    import zlib

    since = time.time() - started - time.monotonic()  # + a monotonic time here: seconds since the driver's start
    running_at = time.monotonic()

    from ..config import RobotSettings
    from ..deploy.client import DeployClient
    from ..deploy.envs import SimControlEnv
    from ..deploy.fetch import XetFetcher
    from ..deploy.keys import parse_public_keys
    from ..deploy.runtime import RobotRuntime
    from ..deploy.store import ReleaseStore
    from ..fleet import FleetRecorder, RecordChoice, Takeovers
    from ..sim.expert import MAX_REPLAN_STEPS, ScriptedExpert, StallTrigger

    env = SimControlEnv(
        robot.task,
        robot.image_size,
        episode_steps=robot.policy_steps + MAX_REPLAN_STEPS,
        seed=robot.first_seed,
        rate_hz=robot.rate_hz,
        shadow_map=robot.shadow_map,
    )
    client = BucketClient(robot.endpoint, robot.storage_token)
    fps = 50 if math.isinf(robot.rate_hz) else round(robot.rate_hz)  # a dataset's fps is the robot's real rate
    recording = FleetRecorder(
        client,
        BucketUrl.parse(robot.record_to),
        RecordChoice("all"),
        fps=fps,
        vcodec=robot.vcodec,
        # Two of its longest episodes, and room for one waited for between episodes: the writer fell a whole queue
        # behind robots run as fast as the machine (4 of 60 episodes dropped in a round's fleet on an H100,
        # 2026-12-06), and a sim robot can wait at a reset where a real one could not.
        queue_frames=2 * (robot.policy_steps + MAX_REPLAN_STEPS),
        reserve_frames=robot.policy_steps + MAX_REPLAN_STEPS,
        seed=zlib.crc32(robot.robot_id.encode()),
    )
    takeovers = Takeovers(
        ScriptedExpert(robot.task),
        StallTrigger(robot.stall_steps),
        sim=lambda: env.sim,
        policy_steps=robot.policy_steps,
        at_end=True,  # a late stall never fires the trigger: the episode's failure goes to the expert all the same
        branch_points=robot.branches,
        scene=lambda: env.seed,
    )
    runtime = RobotRuntime(
        env,
        DeployClient(robot.deploy_url, robot.token),
        ReleaseStore(robot.store),
        parse_public_keys(robot.trusted_keys, "the loop's deploy key"),
        RobotSettings(robot_id=robot.robot_id, device=robot.device, poll_wait_s=5, heartbeat_s=1.0),
        lambda bucket: XetFetcher(robot.endpoint, robot.storage_token, bucket),
        recording=recording,
        takeovers=takeovers,
    )
    try:
        stats = runtime.run(episodes=robot.episodes, stop_when_refused=True)
        ended_at = time.monotonic()
        if runtime.running is not None and takeovers.branches:
            record_branches(env, recording, takeovers, robot.robot_id, runtime.running)
        branched_at = time.monotonic()
    finally:
        recording.close()  # the last episode's commit is waited for: the driver reads the bucket next
        env.close()
    marks = {
        "running": running_at,
        "assigned": min(stats.assigned_at.values(), default=None),
        "pulled": min(stats.pulled_at.values(), default=None),
        "loaded": min(stats.loaded_at.values(), default=None),
        "ready": min(stats.ready_at.values(), default=None),
        "swapped_in": stats.swaps[0]["at"] if stats.swaps else None,
        "episodes_done": ended_at,
        "branches_done": branched_at if takeovers.branches else None,
        "closed": time.monotonic(),
    }
    refused = [*stats.rollbacks, *stats.refused]  # its release could not run (a load failure, say): no round data
    return FleetRobotResult(
        robot.robot_id,
        stats.finished,
        runtime.running,
        recording.stats.as_dict(),
        takeovers.stats.as_dict(),
        stats.control_hz,
        sum(p.bytes_fetched for p in stats.pulls),
        error=f"release {refused[0]['release']} could not run: {refused[0]['reason']}" if refused else None,
        backend=runtime.backend,
        timings={k: round(since + t, 2) for k, t in marks.items() if t is not None},
    )


def record_branches(env: Any, recording: Any, takeovers: Any, robot_id: str, release: str) -> None:
    """The scripted expert from each of `takeovers.branches` (states the policy passed through in episodes it did not
    finish alone), each drive recorded as an episode of expert frames of `release`'s scene; `takeovers.stats` counts
    them. Sim only: the state is put back in the robot's sim, which hardware cannot do.
    """
    from ..fleet import EpisodeFacts
    from ..sim.expert import Unrecoverable, plan_takeover

    sim, stats = env.sim, takeovers.stats
    for scene, _tick, state in takeovers.branches:
        sim.reset(seed=scene)  # the step count starts over; the state then replaces the whole scene
        sim.set_physics_state(state)
        try:
            actions = plan_takeover(env.task, sim).actions
        except Unrecoverable as error:
            stats.branches_declined += 1
            log.info("the expert declined a branch of scene %s: %s", scene, error)
            continue
        recording.begin(EpisodeFacts(robot_id, release, env.instruction, scene), env.shadow_map)
        obs = sim.observation()
        for action in actions:
            after, reward, success, _truncated, _ = sim.step(action)
            recording.frame(obs, action, None, True, reward, success)
            obs = after
            stats.branch_frames += 1
            if success:
                break
        recording.end()
        stats.branches += 1


def fleet_episodes(client: BucketClient, datasets: list[str], release: str | None = None) -> list[dict[str, Any]]:
    """The episode facts (`meta/fleet_episodes.jsonl`) of `datasets`, each with its `dataset`; only `release`'s
    when given. A dataset not written yet (its robot recorded nothing) has none."""
    found: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, url in enumerate(datasets):
            try:
                path = client.download(BucketUrl.parse(f"{url}/{EPISODE_FACTS_FILE}"), Path(tmp) / f"{i}.jsonl")
            except NotFound:
                continue
            for line in path.read_text().splitlines():
                facts = json.loads(line)
                if release is None or facts.get("release") == release:
                    found.append({**facts, "dataset": url})
    return found


__all__ = ["FleetRobot", "FleetRobotResult", "fleet_episodes", "record_branches", "run_fleet"]
