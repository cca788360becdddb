"""`AlohaSim`: gym-aloha's TransferCube / Insertion on plain `mujoco` (no dm_control).

Observation (gym-aloha's `obs_type="pixels_agent_pos"` layout, which lerobot consumes):
    {"pixels": {"top": uint8 [H, W, 3]}, "agent_pos": float64 [14]}
Action: float [14] = left arm joints (6), left gripper (0 closed .. 1 open), right arm (6), right gripper.
Reward: 0..4 staged contact reward; `info["is_success"]` is `reward == max_reward` (4), as in gym-aloha.
"""

from __future__ import annotations

import atexit
import os
import time
import weakref
from typing import Any

from ..errors import BadValue

os.environ.setdefault("MUJOCO_GL", "egl")

import gymnasium as gym  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402
from gymnasium import spaces  # noqa: E402

from robotloop.sim.constants import (  # noqa: E402
    ACTION_DIM,
    NO_SHADOWS,
    START_ARM_POSE,
    STATE_DIM,
    ImageSize,
    assets_dir,
    check_shadow_map,
    normalize_gripper,
    normalize_gripper_velocity,
    parse_image_size,
    rendered_shadow_map,
    unnormalize_gripper,
)
from robotloop.sim.physics import forward_without_actuation, legacy_step, load_model, n_substeps  # noqa: E402
from robotloop.sim.tasks import TaskSpec, get_task  # noqa: E402

Obs = dict[str, Any]


def joint_state(qpos: np.ndarray) -> np.ndarray:
    """Raw qpos[:16] -> 14-d state with normalized grippers (gym-aloha `get_qpos`)."""
    left, right = qpos[:8], qpos[8:16]
    return np.concatenate([left[:6], [normalize_gripper(left[6])], right[:6], [normalize_gripper(right[6])]])


def joint_velocity(qvel: np.ndarray) -> np.ndarray:
    """Raw qvel[:16] -> 14-d velocity with normalized gripper velocity (gym-aloha `get_qvel`)."""
    left, right = qvel[:8], qvel[8:16]
    return np.concatenate(
        [left[:6], [normalize_gripper_velocity(left[6])], right[:6], [normalize_gripper_velocity(right[6])]]
    )


def action_to_ctrl(action: np.ndarray) -> np.ndarray:
    """14-d joint command -> 16 actuator targets (each gripper drives its two fingers, mirrored)."""
    left_g, right_g = unnormalize_gripper(action[6]), unnormalize_gripper(action[13])
    return np.concatenate([action[:6], [left_g, -left_g], action[7:13], [right_g, -right_g]])


def check_action(action: Any, dim: int = ACTION_DIM) -> np.ndarray:
    """A float64 copy of a 14-d finite action, or a ValueError saying what is wrong."""
    arr = np.asarray(action, dtype=np.float64)
    if arr.shape != (dim,):
        raise BadValue(f"action must have shape ({dim},), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise BadValue(f"action has non-finite values: {arr}")
    return arr


class TopCamera:
    """Offscreen renderer of the `top` camera at a fixed size.

    One renderer (one GL context) can film any number of sims of the same task, one `data` at a time: a worker
    stepping ~13 sims side by side then builds one context, not 13 (13 s less per evaluation start on the H200; a
    frame costs the same, its time is the shadow maps': BENCHMARKS.md, "One renderer per lockstep worker").
    """

    def __init__(
        self,
        model: mujoco.MjModel,
        size: ImageSize,
        camera: str = "top",
        shadow_map: int | None = None,
    ):
        h, w = size
        self.size = (h, w)
        self.shadow_map = rendered_shadow_map(check_shadow_map(shadow_map), h, w)
        model.vis.global_.offheight = max(model.vis.global_.offheight, h)
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, w)
        if self.shadow_map != NO_SHADOWS:
            model.vis.quality.shadowsize = self.shadow_map
        self.renderer = mujoco.Renderer(model, height=h, width=w)
        self.renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = self.shadow_map != NO_SHADOWS
        self.camera = camera
        self.render_s = 0.0  # time spent rendering, for the evaluation's account of its time
        self.rendered = 0  # frames rendered, the same
        _close_at_exit(self)

    def __call__(self, data: mujoco.MjData) -> np.ndarray:
        start = time.perf_counter()
        self.renderer.update_scene(data, camera=self.camera)
        frame = self.renderer.render().copy()
        self.render_s += time.perf_counter() - start
        self.rendered += 1
        return frame

    def close(self) -> None:
        self.renderer.close()
        _open_cameras.discard(self)


def _close_at_exit(camera: TopCamera) -> None:
    """Close `camera` at exit if nothing did before (a script's sim, the scripted demos' cached ones), while EGL is up.

    Left to the garbage collector in the interpreter's teardown, a renderer's free fails after EGL's own exit hook
    has terminated the display, and prints an EGLError traceback ("Exception ignored in Renderer.__del__"). Exit
    hooks run last-registered first, and EGL's is registered with the first renderer: ours goes in after it.
    """
    global _exit_hook
    _open_cameras.add(camera)
    if not _exit_hook:
        atexit.register(_close_open_cameras)
        _exit_hook = True


def _close_open_cameras() -> None:
    for camera in list(_open_cameras):
        camera.close()


_open_cameras: weakref.WeakSet[TopCamera] = weakref.WeakSet()
_exit_hook = False


class AlohaSim:
    """Joint-position-controlled ALOHA task, stepping exactly like gym-aloha's dm_control env.

    Args:
        task: "transfer_cube" / "insertion" (or the gym ids), or a TaskSpec.
        image_size: (height, width) of the `top` image; None renders nothing (state-only observations).
        seed: used by the first `reset()` that gets no seed; later seedless resets draw from it.
        max_episode_steps: `truncated` turns True at this step count (default: task.episode_length = 400).
        shadow_map: side of the lights' shadow maps (default: `shadow_map_size` of the image, gym-aloha's 4096 at
            480x640). Smaller renders faster on a GPU (2048 at 240x320: 2.6x on an H200) and moves a few pixels:
            a policy should be evaluated with the maps its data was recorded with. `NO_SHADOWS` (0) renders none,
            which halves CPU (llvmpipe) render time and changes every shadowed pixel.
        camera: another sim's `camera` (same task and image size) to render with, instead of a renderer of its own:
            sims stepped side by side in one process then share one GL context (see `TopCamera`). The sim does
            not close a camera it was given.
    """

    def __init__(
        self,
        task: str | TaskSpec = "transfer_cube",
        image_size: ImageSize | str | None = (480, 640),
        seed: int | None = None,
        max_episode_steps: int | None = None,
        camera: TopCamera | None = None,
        shadow_map: int | None = None,
    ):
        self.task = get_task(task)
        self.model = load_model(assets_dir() / self.task.joint_xml)
        self.data = mujoco.MjData(self.model)
        if self.model.nq != 16 + self.task.object_dim or self.model.nu != 16:
            raise RuntimeError(f"unexpected scene layout nq={self.model.nq} nu={self.model.nu}")
        self.n_substeps = n_substeps(self.model)
        self.image_size = parse_image_size(image_size)
        if camera is not None and camera.size != self.image_size:
            raise BadValue(f"a shared camera renders {camera.size}, this sim's image size is {self.image_size}")
        self._owns_camera = camera is None
        if camera is None and self.image_size:
            camera = TopCamera(self.model, self.image_size, shadow_map=shadow_map)
        self.camera = camera
        self.reward_fn = self.task.make_reward(self.model)
        self.max_episode_steps = max_episode_steps or self.task.episode_length
        self._first_seed = seed
        self._seed_rng = np.random.RandomState(seed)
        self.step_count = 0
        self.seed: int | None = None
        self.object_pose: np.ndarray | None = None

    # -- episode ---------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, object_pose: np.ndarray | None = None) -> Obs:
        """Start an episode; objects come from `object_pose` if given, else are sampled from `seed`
        exactly as gym-aloha's `AlohaEnv.reset(seed=seed)` does."""
        if seed is None:
            seed = self._first_seed if self._first_seed is not None else int(self._seed_rng.randint(2**31))
            self._first_seed = None
        self.seed = seed
        if object_pose is None:
            object_pose = self.task.sample_objects(seed)
        object_pose = np.asarray(object_pose, dtype=np.float64)
        if object_pose.shape != (self.task.object_dim,):
            raise BadValue(f"object_pose must have shape ({self.task.object_dim},), got {object_pose.shape}")
        self.object_pose = object_pose.copy()
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        d.qpos[:16] = START_ARM_POSE
        d.ctrl[:] = START_ARM_POSE
        d.qpos[16:] = object_pose
        forward_without_actuation(m, d)  # inner reset_context exit (gym-aloha task)
        forward_without_actuation(m, d)  # outer reset_context exit (dm_control Environment.reset)
        self.step_count = 0
        return self.observation()

    def step(self, action: Any, render: bool = True) -> tuple[Obs, float, bool, bool, dict[str, Any]]:
        """Apply a 14-d joint command for one control period (DT = 0.02 s). `render=False` leaves the camera off
        this step, for a frame no one will look at (a policy midway through its action chunk): the observation
        then has no pixels. Rendering never changes the physics."""
        action = check_action(action)
        self.data.ctrl[:] = action_to_ctrl(action)
        legacy_step(self.model, self.data, self.n_substeps)
        self.step_count += 1
        reward = self.reward()
        success = reward == self.task.max_reward
        truncated = self.step_count >= self.max_episode_steps
        return self.observation(render), float(reward), success, truncated, {"is_success": success}

    # -- the whole physical state, to continue elsewhere ------------------------------------------
    def physics_state(self) -> np.ndarray:
        """Everything the next steps depend on (MuJoCo's `mjSTATE_INTEGRATION`: time, joints, velocities,
        actuator targets, solver warm start): a sim of the same task given it steps on bit for bit alike."""
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        state = np.empty(mujoco.mj_stateSize(self.model, spec))
        mujoco.mj_getState(self.model, self.data, state, spec)
        return state

    def set_physics_state(self, state: np.ndarray) -> None:
        """Continue from `physics_state()` of a sim of the same task (step count and seed are not part of it).

        Raises:
            BadValue: `state` has the wrong size (another task's).
        """
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        if np.shape(state) != (mujoco.mj_stateSize(self.model, spec),):
            raise BadValue(f"a {self.task.name} physics state has {mujoco.mj_stateSize(self.model, spec)} values")
        mujoco.mj_setState(self.model, self.data, np.asarray(state, dtype=np.float64), spec)
        mujoco.mj_forward(self.model, self.data)

    # -- views -----------------------------------------------------------------------------------
    def reward(self) -> int:
        return self.reward_fn(self.data)

    def state(self) -> np.ndarray:
        """14-d joint state (`agent_pos`)."""
        return joint_state(self.data.qpos)

    def velocity(self) -> np.ndarray:
        return joint_velocity(self.data.qvel)

    def env_state(self) -> np.ndarray:
        """Object poses, qpos[16:] (gym-aloha `get_env_state`)."""
        return self.data.qpos[16:].copy()

    def render(self) -> np.ndarray:
        if self.camera is None:
            raise RuntimeError("this AlohaSim was built with image_size=None; it renders nothing")
        return self.camera(self.data)

    def observation(self, render: bool = True) -> Obs:
        obs: Obs = {"agent_pos": self.state()}
        if self.camera is not None and render:
            obs["pixels"] = {"top": self.render()}
        return obs

    def close(self) -> None:
        if self.camera is not None and self._owns_camera:
            self.camera.close()
        self.camera = None

    def __enter__(self) -> AlohaSim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AlohaGymEnv(gym.Env):
    """gymnasium API over AlohaSim, shaped like `gym_aloha.env.AlohaEnv(obs_type="pixels_agent_pos")`."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 50}

    def __init__(
        self,
        task: str = "transfer_cube",
        observation_height: int = 480,
        observation_width: int = 640,
        max_episode_steps: int | None = None,
        render_mode: str = "rgb_array",
    ):
        super().__init__()
        self.render_mode = render_mode
        self.sim = AlohaSim(task, (observation_height, observation_width), max_episode_steps=max_episode_steps)
        img = spaces.Box(0, 255, (observation_height, observation_width, 3), dtype=np.uint8)
        state = spaces.Box(-1000.0, 1000.0, (STATE_DIM,), dtype=np.float64)
        self.observation_space = spaces.Dict({"pixels": spaces.Dict({"top": img}), "agent_pos": state})
        self.action_space = spaces.Box(-1, 1, (ACTION_DIM,), dtype=np.float32)  # as gym-aloha declares it

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Obs, dict]:
        super().reset(seed=seed)
        obs = self.sim.reset(seed, object_pose=(options or {}).get("object_pose"))
        return obs, {"is_success": False, "seed": self.sim.seed}

    def step(self, action: Any) -> tuple[Obs, float, bool, bool, dict[str, Any]]:
        return self.sim.step(action)

    def render(self) -> np.ndarray:
        return self.sim.render()

    def close(self) -> None:
        self.sim.close()


def register_envs() -> None:
    """Register `robotloop/AlohaTransferCube-v0` and `robotloop/AlohaInsertion-v0` with gymnasium."""
    for env_id, task in (("AlohaTransferCube-v0", "transfer_cube"), ("AlohaInsertion-v0", "insertion")):
        full = f"robotloop/{env_id}"
        if full not in gym.registry:
            gym.register(full, entry_point=AlohaGymEnv, max_episode_steps=400, kwargs={"task": task})
