"""ALOHA TransferCube / Insertion on plain MuJoCo, matching gym-aloha; scripted experts and demo recording.

    >>> from robotloop.sim import AlohaSim, record_demo
    >>> sim = AlohaSim("transfer_cube", image_size=(480, 640))
    >>> obs = sim.reset(seed=0)  # {"pixels": {"top": uint8 [480, 640, 3]}, "agent_pos": float64 [14]}
    >>> obs, reward, terminated, truncated, info = sim.step(obs["agent_pos"])
    >>> demo = record_demo("insertion", seed=0, image_size=(480, 640))  # demo.success, demo.frames, ...

`MUJOCO_GL` defaults to `egl` (headless) when this package is imported before mujoco.
"""

import os

os.environ.setdefault("MUJOCO_GL", "egl")

from robotloop.sim.env import AlohaGymEnv, AlohaSim, register_envs  # noqa: E402
from robotloop.sim.scripted import Demo, record_demo, rollout_mocap  # noqa: E402
from robotloop.sim.tasks import TASKS, TaskSpec, get_task  # noqa: E402

__all__ = [
    "TASKS",
    "AlohaGymEnv",
    "AlohaSim",
    "Demo",
    "TaskSpec",
    "get_task",
    "record_demo",
    "register_envs",
    "rollout_mocap",
]
