"""A policy's inputs, checked: a robot's observation, or a lockstep batch of them, against the cameras and state
the policy was trained on. The torch and ONNX runners both take their inputs from here (no torch imported: a slim
robot runs the ONNX one), so a robot gets the same error, with the same words, whichever backend it runs.

Both give lerobot's feature names and numpy arrays: each camera's frames uint8 [B, H, W, C] as the camera gives
them, the state float32 [B, S]. What a backend does with them (to float on the GPU, into an ONNX graph) is its own.

Example:
    ```python
    >>> obs = {"pixels": {"top": frame}, "agent_pos": qpos}     # a 120x160 camera, 14 joints
    >>> feeds = observation_inputs(obs, {"observation.images.top": (3, 120, 160)}, 14)
    >>> feeds["observation.images.top"].shape, feeds["observation.state"].shape
    ((1, 120, 160, 3), (1, 14))
    ```
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..errors import BadValue
from ..features import STATE_KEY, camera_of


def observation_inputs(
    obs: dict, image_shapes: dict[str, tuple[int, int, int]], state_dim: int | None
) -> dict[str, np.ndarray]:
    """One observation (`{"pixels": {camera: uint8 [H, W, C]}, "agent_pos": [S]}`) as a batch of one. Extra
    cameras are ignored. `image_shapes` maps each camera's feature name to (C, H, W).

    Raises:
        BadValue: a camera or the state is missing, or has the wrong shape or dtype, or the state is not finite.
    """
    feeds: dict[str, np.ndarray] = {}
    pixels = obs.get("pixels") or {}
    for key, (c, h, w) in image_shapes.items():
        cam = camera_of(key)
        if cam not in pixels:
            has = ", ".join(sorted(pixels)) or "none"
            raise BadValue(f"the policy reads camera {cam!r}; the observation's cameras: {has}")
        img = np.asarray(pixels[cam])
        if img.shape != (h, w, c) or img.dtype != np.uint8:
            raise BadValue(
                f"camera {cam!r}: the policy was trained on uint8 {h}x{w}x{c} images, got "
                f"{img.dtype} {'x'.join(map(str, img.shape))} (the camera must give {h}x{w}: for the sim, "
                f"--image-size {h}x{w})"
            )
        feeds[key] = np.ascontiguousarray(img)[None]
    if state_dim is not None:
        state = np.asarray(obs.get("agent_pos", ()), dtype=np.float64)
        if state.shape != (state_dim,):
            raise BadValue(f"the policy reads a state of {state_dim} values; the robot's has {state.size}")
        feeds[STATE_KEY] = _finite_state(state[None])
    return feeds


def next_queued(queue: deque[np.ndarray], states: np.ndarray | None) -> np.ndarray:
    """The next action [B, action_dim] of a lockstep batch's queued chunk, read without its frames: midway through
    a chunk the policy looks at nothing, so the caller need not render them (`SimBatch.step(frames=False)`).

    Raises:
        BadValue: the batch is not the one the chunk was predicted for (`reset()` starts another batch).
    """
    action = queue[0]
    if action.ndim != 2 or (states is not None and len(states) != len(action)):
        got = "one episode" if action.ndim != 2 else f"{len(action)} episodes"
        raise BadValue(f"a batch of {len(states) if states is not None else '?'} episodes after {got}: reset() first")
    return queue.popleft()


def batch_inputs(
    images: dict[str, np.ndarray],
    states: np.ndarray | None,
    image_shapes: dict[str, tuple[int, int, int]],
    state_dim: int | None,
) -> dict[str, np.ndarray]:
    """B episodes' observations stepped in lockstep: `images` maps camera name (``top``) to uint8 [B, H, W, C]
    frames, `states` is [B, state_dim].

    Raises:
        BadValue: a camera is missing or has the wrong shape or dtype, or the states have the wrong shape or are
            not finite.
    """
    feeds: dict[str, np.ndarray] = {}
    for key, (c, h, w) in image_shapes.items():
        frames = images.get(camera_of(key))
        if frames is None or frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[1:] != (h, w, c):
            got = "none" if frames is None else f"{frames.dtype} {'x'.join(map(str, frames.shape))}"
            raise BadValue(f"camera {key!r}: the policy takes uint8 [B, {h}, {w}, {c}] frames, got {got}")
        feeds[key] = np.ascontiguousarray(frames)
    if state_dim is not None:
        if states is None or states.ndim != 2 or states.shape[1:] != (state_dim,):
            raise BadValue(f"the policy reads states of {state_dim} values, got {getattr(states, 'shape', None)}")
        feeds[STATE_KEY] = _finite_state(states)
    return feeds


def _finite_state(states: np.ndarray) -> np.ndarray:
    if not np.all(np.isfinite(states)):
        raise BadValue("the robot's state holds NaN or infinite values")
    return np.ascontiguousarray(states, dtype=np.float32)
