"""Sim work on a Ray cluster: `robotloop record --ray` and `robotloop eval --ray` run their sim workers as Ray actors.

Without `--ray` nothing here runs and Ray is never imported: the commands keep their process pools. With it, each
worker is a Ray actor that does what a pool worker does, on whichever node Ray places it, and talks to the bucket
itself: an evaluation worker locates the policy on its own node (downloads a bucket checkpoint into its node's
cache) and hands back small `EpisodeResult` rows; a recording worker encodes its demo on its node and commits it to
the bucket's dataset when the driver says it is its turn (commits to one dataset go one at a time). No camera frame
passes through the driver (an evaluation's filmed episodes come back as their mp4 files, for the report).

`--ray` takes `auto` (the cluster this machine belongs to: RAY_ADDRESS, or a `ray start` on this machine),
`local` (a one-machine cluster started for this command and stopped after it) or an ADDRESS (`host:6379`, or
`ray://host:10001` through Ray Client). Every node needs robotloop installed (`pip install 'robotloop[ray]'`), the
same version, and must reach the bucket endpoint.

Faults: a worker killed mid-episode loses only that episode; it is run again on a fresh worker (`ATTEMPTS` times
at most) and the run goes on. The driver killed: Ray stops the actors it owns with it.

Example:
    ```python
    >>> with ray_session("auto") as ray:
    ...     ray.cluster_resources()["CPU"]
    32.0
    ```
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from ..errors import BadValue, Unavailable

ATTEMPTS = 3  # runs of one piece of work (an evaluation wave, a demo) before its worker's deaths stop the command
RAY_HELP = (
    "Run the sim workers as Ray actors: auto (this machine's cluster: RAY_ADDRESS or `ray start`), local (a "
    "cluster of this machine, for this command) or a cluster ADDRESS (host:6379, ray://host:10001). Needs "
    "robotloop[ray]. Off: process pools, Ray not imported."
)
_ADDRESS = re.compile(r"^(ray://)?[A-Za-z0-9._-]+:\d{1,5}$")


class RayUnavailable(Unavailable):
    """Ray is not installed, or the cluster `--ray` names cannot be reached."""


def check_address(address: str) -> str:
    """`address` if `--ray` may take it: auto, local, host:port or ray://host:port.

    Example:
        ```python
        >>> check_address("10.0.0.5:6379")
        '10.0.0.5:6379'
        ```

    Raises:
        BadValue: anything else (checked before any worker starts).
    """
    if address in ("auto", "local") or _ADDRESS.match(address):
        return address
    raise BadValue(f"--ray {address!r}: expected auto, local, host:port or ray://host:port")


def import_ray() -> ModuleType:
    """Ray, imported here and only here (so a command without `--ray` never loads it).

    Raises:
        RayUnavailable: Ray is not installed.
    """
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs Ray: pip install 'robotloop[ray]'") from None
    return ray


@contextlib.contextmanager
def ray_session(address: str) -> Iterator[Any]:
    """Ray connected to the cluster at `address` (see `check_address`) for the block; disconnected when the last
    block open in this process ends (a `local` cluster is stopped then). Blocks may overlap, in threads too (the
    loop records in one while it evaluates in another): they share the first one's connection. A process that
    connected itself keeps its connection.

    Raises:
        BadValue: a malformed address. RayUnavailable: Ray missing, or no cluster answers there.
    """
    global _sessions, _owned
    check_address(address)
    ray = import_ray()
    with _session_lock:
        if _sessions == 0 and not ray.is_initialized():
            options: dict[str, Any] = {"logging_level": logging.WARNING, "configure_logging": True}
            if address == "local":
                options.update(include_dashboard=False)  # a cluster for one command: nobody looks at a dashboard
                options.update(_system_config={"worker_niceness": local_worker_niceness()})
            try:
                # "local" as Ray spells it: a new cluster even where RAY_ADDRESS or a `ray start` names one (None
                # would join that one, and refuse the local cluster's `_system_config`)
                ray.init(address=address, **options)
            except ConnectionError as error:
                raise RayUnavailable(f"--ray {address}: {_why_unreachable(error)}") from None
            _owned = True
        _sessions += 1
    try:
        yield ray
    finally:
        with _session_lock:
            _sessions -= 1
            if _sessions == 0 and _owned:
                ray.shutdown()
                _owned = False


def _why_unreachable(error: ConnectionError) -> str:
    """Why `ray.init` could not connect, in one line: Ray's own message hides a refused auth token in its chain."""
    chain, cause = [], error.__cause__ or error.__context__
    while cause is not None and len(chain) < 5:
        chain.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    if any("InvalidAuthToken" in text for text in chain):
        # `ray start` turns token authentication on (Ray 2.5x and later) while a driver's RAY_AUTH_MODE stays disabled
        return (
            "the cluster asks for its auth token: run with RAY_AUTH_MODE=token, the token in ~/.ray/auth_token (as "
            "`ray start` left it on its node), RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN"
        )
    return f"no Ray cluster answers ({error})"


def local_worker_niceness() -> int:
    """The niceness of a `local` cluster's workers: 0, the driver's and a process pool's, unless RAY_worker_niceness
    says otherwise. Ray's default is 15, below every other process of the machine, which fits a driver that only
    coordinates: here the workers are the command's work (sim, rendering, encoding), and at 15 they lose the cores
    to the bucket server and the trainer beside them, where a pool's workers would not."""
    value = os.environ.get("RAY_worker_niceness", "0")  # noqa: SIM112 - spelled as Ray reads it
    try:
        return int(value)
    except ValueError:
        raise BadValue(f"RAY_worker_niceness={value!r}: expected an integer") from None


_session_lock = threading.Lock()
_sessions = 0  # `ray_session` blocks open in this process
_owned = False  # whether the first of them connected (and the last must disconnect)


def worker_env() -> dict[str, str]:
    """The environment Ray workers get (`runtime_env`'s env_vars), which they need before they import anything: the
    libraries kept quiet as in this process (`robotloop.output.QUIET_ENV`, this process's values first), its MuJoCo
    renderer and `--debug`. A Ray worker starts from its node's environment, not from the driver's."""
    from ..output import QUIET_ENV
    from ..workers import DEBUG_ENV

    env = {name: os.environ.get(name, value) for name, value in QUIET_ENV.items()}
    return env | {name: os.environ[name] for name in ("MUJOCO_GL", DEBUG_ENV) if name in os.environ}


def gpu_share(device: str, workers: int) -> float:
    """The GPU each of `workers` actors or tasks asks Ray for: none on CPU (Ray then hides the GPUs from it), else an
    equal share of one (to 4 decimals, Ray's resolution), so that they fit on one GPU as a process pool's do."""
    return 0.0 if not device.startswith("cuda") else math.floor(10_000 / workers) / 10_000


def driver_host(address: str) -> str:
    """Where Ray workers reach a service this driver starts: 127.0.0.1 on a `local` cluster (this machine alone),
    else this machine's address on the cluster's network, as Ray finds it for its own nodes."""
    if address == "local":
        return "127.0.0.1"
    return import_ray().util.get_node_ip_address()


def node_id() -> str:
    """The Ray node this worker runs on (called inside a Ray worker)."""
    import ray

    return ray.get_runtime_context().get_node_id()


def worker_died(ray: ModuleType, error: BaseException) -> bool:
    """Whether `error` (from `ray.get`) says the worker or node running the call died, rather than the call raising
    (a task pinned to a node that died cannot be scheduled any more)."""
    died = (
        ray.exceptions.RayActorError,
        ray.exceptions.WorkerCrashedError,
        ray.exceptions.NodeDiedError,
        ray.exceptions.TaskUnschedulableError,
    )
    return isinstance(error, died)


def call_error(ray: ModuleType, error: BaseException) -> BaseException:
    """What a worker's call raised, as the driver should raise it: robotloop's own errors as themselves (a bad
    action, a policy that would not load), so the CLI answers them as it does without Ray."""
    if isinstance(error, ray.exceptions.RayTaskError) and isinstance(error.cause, Exception):
        return error.cause
    return error
