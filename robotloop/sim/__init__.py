"""ALOHA TransferCube / Insertion on plain MuJoCo, matching gym-aloha; scripted experts and demo recording.

    >>> from robotloop.sim import AlohaSim, record_demo
    >>> sim = AlohaSim("transfer_cube", image_size=(480, 640))
    >>> obs = sim.reset(seed=0)  # {"pixels": {"top": uint8 [480, 640, 3]}, "agent_pos": float64 [14]}
    >>> obs, reward, terminated, truncated, info = sim.step(obs["agent_pos"])
    >>> demo = record_demo("insertion", seed=0, image_size=(480, 640))  # demo.success, demo.frames, ...
    >>> actions = replan("insertion", sim)  # the expert, from whatever state `sim` is in (robotloop.sim.expert)

`MUJOCO_GL` defaults to `egl` (headless) when this package is imported before mujoco.
"""

import os

os.environ.setdefault("MUJOCO_GL", "egl")

# Lazy (PEP 562): `robotloop.sim.tasks` and `.constants` are read without loading MuJoCo (the CLI lists tasks and
# parses image sizes at start-up); the simulator loads with the first name that needs it.
from robotloop.lazy import lazy_names  # noqa: E402 - after the environment default above

_LAZY = {
    "AlohaGymEnv": "env",
    "AlohaSim": "env",
    "register_envs": "env",
    "Demo": "scripted",
    "Expert": "expert",
    "FailingPolicy": "failing",
    "ScriptedExpert": "expert",
    "StallTrigger": "expert",
    "TeleopExpert": "expert",
    "Unrecoverable": "expert",
    "UserTrigger": "expert",
    "redemonstrate": "expert",
    "replan": "expert",
    "record_demo": "scripted",
    "rollout_mocap": "scripted",
    "TASKS": "tasks",
    "TaskSpec": "tasks",
    "get_task": "tasks",
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "TASKS",
    "AlohaGymEnv",
    "AlohaSim",
    "Demo",
    "Expert",
    "FailingPolicy",
    "ScriptedExpert",
    "StallTrigger",
    "TaskSpec",
    "TeleopExpert",
    "Unrecoverable",
    "UserTrigger",
    "get_task",
    "record_demo",
    "redemonstrate",
    "register_envs",
    "replan",
    "rollout_mocap",
]
