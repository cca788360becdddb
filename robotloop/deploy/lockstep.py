"""Many sim episodes stepped together, so that one policy forward pass serves all of them: evaluation's engine.

Evaluating one episode per worker process runs the policy at batch 1 in every process. With ACT's temporal
ensembling the model runs every step, and 15 such workers kept an H200 77% busy while evaluating 50 Insertion
episodes in 106 s. Here worker processes only step and render sims, each holding a slice of the batch. Their
camera frames land in shared memory, and the calling process runs the policy once per step on the whole batch.

Written here rather than with gymnasium's `AsyncVectorEnv`: that runs one env per process, and a batch of 200
episodes on 16 cores needs ~13 sims in each process.

Example:
    ```python
    >>> with SimBatch("transfer_cube", size=8, workers=2, image_size=(48, 64), max_steps=400) as sims:
    ...     images, states = sims.reset([Slot(i, 1000 + i, record=False) for i in range(8)])
    ...     images, states, rewards, successes = sims.step(np.zeros((8, 14)), np.ones(8, bool))
    ```
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np

STATE_DIM = 14


@dataclass(frozen=True)
class Slot:
    """One episode of a batch: its index in the evaluation, its seed, whether its frames are filmed."""

    index: int
    seed: int
    record: bool = False


class _Sims:
    """One process's slice of the batch: its sims and the frames of the episodes it films."""

    def __init__(
        self,
        task: str,
        count: int,
        image_size: tuple[int, int] | None,
        max_steps: int,
        images: np.ndarray | None,
        video_dir: str | None,
        shadow_map: int | None = None,
    ) -> None:
        from ..sim import AlohaSim

        first = AlohaSim(task, image_size=image_size, max_episode_steps=max_steps, shadow_map=shadow_map)
        # one renderer for the slice: one GL context to build, not one per sim
        self.sims = [first] + [
            AlohaSim(task, image_size=image_size, max_episode_steps=max_steps, camera=first.camera)
            for _ in range(count - 1)
        ]
        self.images = images  # this slice's rows of the shared frames, [count, H, W, 3]
        self.video_dir = video_dir
        self.slots: list[Slot | None] = [None] * count
        self.states = np.zeros((0, STATE_DIM), np.float32)
        self.frames: dict[int, list[np.ndarray]] = {}
        self.busy_s = 0.0  # time in `reset` and `step`, rendering included

    def reset(self, slots: list[Slot]) -> np.ndarray:
        """Start `slots[j]` in sim j (the sims past them idle); the states, [len(slots), 14]."""
        start = time.perf_counter()
        self.slots = [*slots, *[None] * (len(self.sims) - len(slots))]
        self.frames = {}
        self.states = np.zeros((len(slots), STATE_DIM), np.float32)
        for j, slot in enumerate(slots):
            self._observe(j, self.sims[j].reset(seed=slot.seed))
        self.busy_s += time.perf_counter() - start
        return self.states.copy()

    def step(
        self, actions: np.ndarray, active: np.ndarray, frames: bool = True
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step the active sims of this slice: states, rewards and successes. An inactive sim keeps its last frame
        and state, and gets reward 0 and no success. `frames=False` renders only the filmed episodes."""
        start = time.perf_counter()
        n = len(actions)
        rewards, successes = np.zeros(n), np.zeros(n, bool)
        for j in np.flatnonzero(active):
            slot = self.slots[j]
            render = frames or (slot is not None and slot.record)
            obs, rewards[j], successes[j], _, _ = self.sims[j].step(actions[j], render=render)
            self._observe(j, obs)
        self.busy_s += time.perf_counter() - start
        return self.states[:n].copy(), rewards, successes

    def busy(self) -> tuple[float, float, int]:
        """Seconds this slice spent resetting and stepping its sims, of those rendering, and the frames rendered."""
        camera = self.sims[0].camera  # the slice's one renderer
        return (self.busy_s, camera.render_s, camera.rendered) if camera is not None else (self.busy_s, 0.0, 0)

    def _observe(self, j: int, obs: dict) -> None:
        self.states[j] = obs["agent_pos"]
        if self.images is not None and "pixels" in obs:
            frame = obs["pixels"]["top"]
            self.images[j] = frame
            slot = self.slots[j]
            if slot is not None and slot.record:
                self.frames.setdefault(j, []).append(frame)

    def videos(self) -> dict[int, str]:
        """Write the filmed episodes' mp4s: {episode index: path}."""
        written = {}
        for j, frames in self.frames.items():
            slot = self.slots[j]
            assert slot is not None and self.video_dir is not None
            path = Path(self.video_dir) / f"episode_{slot.index:03d}_seed{slot.seed}.mp4"
            written[slot.index] = str(write_video(path, frames))
        self.frames = {}
        return written

    def close(self) -> None:
        for sim in self.sims[::-1]:  # the first, which owns the shared renderer, last
            sim.close()


def write_video(path: Path, frames: list[np.ndarray], fps: int = 50) -> Path:
    """Write uint8 [H, W, 3] RGB frames as an H.264 mp4 with PyAV (odd sizes are padded by one pixel). The same
    frames give the same bytes."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = frames[0].shape[:2]
    ph, pw = h + h % 2, w + w % 2  # yuv420p needs even sizes
    with av.open(str(path), "w") as container:
        # No macroblock tree: with it, x264 (PyAV's build) coded the same frames another way depending on what the
        # process's heap held before (11 codings of one 17-frame film in 200 encodes, 26 of a 240x320 one in 40),
        # so a film did not match its episode. Without it, one coding each time (2026-12-07).
        stream = container.add_stream("libx264", rate=fps, options={"x264-params": "mbtree=0"})
        stream.width, stream.height, stream.pix_fmt = pw, ph, "yuv420p"
        for frame in frames:
            if (ph, pw) != (h, w):
                frame = np.pad(frame, ((0, ph - h), (0, pw - w), (0, 0)), mode="edge")
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
        container.mux(stream.encode())
    return path


def _serve(conn: Connection, parent_pid: int, shm_name: str | None, rows: tuple[int, int], args: tuple) -> None:
    """A worker process: build its slice of sims, then answer the batch's calls until told to close."""
    from ..workers import start_worker

    start_worker(parent_pid)
    shm = SharedMemory(shm_name) if shm_name else None
    try:
        task, image_size, max_steps, video_dir, size, shadow_map = args
        images = None
        if shm is not None:
            frames = np.ndarray((size, *image_size, 3), np.uint8, buffer=shm.buf)
            images = frames[rows[0] : rows[1]]
        sims = _Sims(task, rows[1] - rows[0], image_size, max_steps, images, video_dir, shadow_map)
        conn.send(("ok", None))
        while True:
            method, call_args = conn.recv()
            if method == "close":
                sims.close()
                return
            try:
                conn.send(("ok", getattr(sims, method)(*call_args)))
            except Exception as error:  # sent to the batch, which raises it there
                conn.send(("error", error))
    except Exception as error:
        conn.send(("error", error))
    finally:
        images = frames = None  # the views go before the buffer they point into
        if shm is not None:
            shm.close()


class SimBatch:
    """`size` ALOHA sims of `task` stepped in lockstep by `workers` processes (in this process for one worker).

    The camera frames of the whole batch live in one shared-memory array, [size, H, W, 3] uint8, that `reset` and
    `step` hand back (a view: valid until the next call). Worker processes die with this one, however it dies.

    Raises (from `reset`, `step`): whatever a sim raised in its worker (ValueError for a bad action, ...).
    """

    def __init__(
        self,
        task: str,
        size: int,
        workers: int,
        image_size: tuple[int, int] | None,
        max_steps: int,
        video_dir: str | None = None,
        shadow_map: int | None = None,
    ) -> None:
        self.size, self.image_size, self.max_steps = size, image_size, max_steps
        self.shadow_map = shadow_map  # None: `shadow_map_size` of the image
        workers = max(1, min(workers, size))
        self._shm: SharedMemory | None = None
        self.images: np.ndarray | None = None
        if image_size is not None:
            nbytes = size * image_size[0] * image_size[1] * 3
            self._shm = SharedMemory(create=True, size=nbytes)
            self.images = np.ndarray((size, *image_size, 3), np.uint8, buffer=self._shm.buf)
        bounds = np.linspace(0, size, workers + 1).round().astype(int)
        self.rows = [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        self._local: _Sims | None = None
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        try:
            if workers == 1:
                self._local = _Sims(task, size, image_size, max_steps, self.images, video_dir, shadow_map)
            else:
                self._start(task, max_steps, video_dir)
        except BaseException:
            self.close()
            raise

    def _start(self, task: str, max_steps: int, video_dir: str | None) -> None:
        # spawn, not fork: MuJoCo's EGL context must be created in the worker, never inherited.
        ctx = mp.get_context("spawn")
        shm_name = self._shm.name if self._shm else None
        for rows in self.rows:
            ours, theirs = ctx.Pipe()
            args = (task, self.image_size, max_steps, video_dir, self.size, self.shadow_map)
            proc = ctx.Process(target=_serve, args=(theirs, os.getpid(), shm_name, rows, args), daemon=True)
            proc.start()
            theirs.close()
            self._conns.append(ours)
            self._procs.append(proc)
        for conn in self._conns:  # every worker has built its sims (a worker that could not raises here)
            self._answer(conn)

    # -- the batch's calls -----------------------------------------------------------------------------------
    def reset(self, slots: list[Slot]) -> tuple[np.ndarray | None, np.ndarray]:
        """Start one episode per slot in the first len(slots) sims: (frames [n, H, W, 3] or None, states [n, 14])."""
        if not 1 <= len(slots) <= self.size:
            raise ValueError(f"a batch of {self.size} sims runs 1..{self.size} episodes at once, not {len(slots)}")
        n = len(slots)
        parts = self._call("reset", lambda lo, hi: (slots[lo:hi],), n)
        return self._frames(n), np.concatenate(parts)[:n]

    def step(
        self, actions: np.ndarray, active: np.ndarray, frames: bool = True
    ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
        """One control step of the first len(actions) sims, where `active`: (frames, states, rewards, successes).

        `frames=False`: the caller will not look at this step's frames (its policy acts from a chunk it already
        has), so only filmed episodes render, and the frames come back as None."""
        n = len(actions)
        parts = self._call("step", lambda lo, hi: (actions[lo:hi], active[lo:hi], frames), n)
        states, rewards, successes = (np.concatenate([p[i] for p in parts]) for i in range(3))
        return self._frames(n) if frames else None, states, rewards, successes

    def videos(self) -> dict[int, str]:
        """Write the mp4s of the episodes filmed since the last reset: {episode index: path}."""
        written: dict[int, str] = {}
        for part in self._call("videos", lambda lo, hi: (), self.size):
            written.update(part)
        return written

    def busy(self) -> list[tuple[float, float, int]]:
        """Per worker process: seconds spent resetting and stepping its sims, of those rendering, and the frames
        rendered."""
        return self._call("busy", lambda lo, hi: (), self.size)

    def _frames(self, n: int) -> np.ndarray | None:
        return None if self.images is None else self.images[:n]

    def _call(self, method: str, args_for, n: int) -> list:
        """Call `method` on every slice holding one of the first n rows; their answers in row order."""
        if self._local is not None:
            return [getattr(self._local, method)(*args_for(0, n))]
        busy = [(conn, lo, hi) for conn, (lo, hi) in zip(self._conns, self.rows, strict=True) if lo < n]
        for conn, lo, hi in busy:  # all sent first: the workers run side by side
            conn.send((method, args_for(lo, min(hi, n))))
        return [self._answer(conn) for conn, _, _ in busy]

    @staticmethod
    def _answer(conn: Connection) -> Any:
        try:
            status, value = conn.recv()
        except EOFError:
            raise RuntimeError("a sim worker process died (see its output above)") from None
        if status == "error":
            raise value
        return value

    # -- closing ---------------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._local is not None:
            self._local.close()
            self._local = None
        for conn in self._conns:
            with contextlib.suppress(OSError):  # that worker is gone already
                conn.send(("close", ()))
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        self._conns, self._procs = [], []
        self.images = None
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None

    def __enter__(self) -> SimBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
