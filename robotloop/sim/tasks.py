"""Task specifications: scenes, initial object poses and staged contact rewards, as in gym-aloha.

Rewards are gym-aloha's `TransferCubeTask.get_reward` / `InsertionTask.get_reward`, evaluated on the ordered
(geom1, geom2) contact pairs MuJoCo reports (gym-aloha also matches ordered name pairs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the task table is read without MuJoCo (the CLI lists tasks); rewards load it when built
    import mujoco

from ..errors import BadValue

Pairs = set[tuple[int, int]]


def _contact_pairs(data: mujoco.MjData) -> Pairs:
    from robotloop.sim.physics import contact_pairs  # MuJoCo loads with the first reward, not with the task table

    return contact_pairs(data)


def sample_box_pose(seed: int | None = None) -> np.ndarray:
    """Cube pose [x, y, z, qw, qx, qy, qz]: gym-aloha's `sample_box_pose` (one uniform draw of 3)."""
    rng = np.random.RandomState(seed)
    low, high = np.array([0.0, 0.4, 0.05]), np.array([0.2, 0.6, 0.05])
    return np.concatenate([rng.uniform(low, high), [1.0, 0.0, 0.0, 0.0]])


def sample_insertion_pose(seed: int | None = None) -> np.ndarray:
    """Peg pose then socket pose (14 values): gym-aloha's `sample_insertion_pose`, same draw order."""
    rng = np.random.RandomState(seed)
    quat = [1.0, 0.0, 0.0, 0.0]
    peg = rng.uniform(np.array([0.1, 0.4, 0.05]), np.array([0.2, 0.6, 0.05]))
    socket = rng.uniform(np.array([-0.2, 0.4, 0.05]), np.array([-0.1, 0.6, 0.05]))
    return np.concatenate([peg, quat, socket, quat])


class TransferCubeReward:
    """1 right finger touches cube, 2 lifted, 3 left finger touches, 4 left holds it off the table."""

    def __init__(self, model: mujoco.MjModel):
        from robotloop.sim.physics import geom_id

        box = geom_id(model, "red_box")
        self.left = (box, geom_id(model, "vx300s_left/10_left_gripper_finger"))
        self.right = (box, geom_id(model, "vx300s_right/10_right_gripper_finger"))
        self.table = (box, geom_id(model, "table"))

    def __call__(self, data: mujoco.MjData) -> int:
        pairs = _contact_pairs(data)
        left, right, table = self.left in pairs, self.right in pairs, self.table in pairs
        reward = 0
        if right:
            reward = 1
        if right and not table:
            reward = 2
        if left:
            reward = 3
        if left and not table:
            reward = 4
        return reward


class InsertionReward:
    """1 both grippers touch, 2 both lifted, 3 peg touches socket in the air, 4 peg touches the pin."""

    def __init__(self, model: mujoco.MjModel):
        from robotloop.sim.physics import geom_id

        g = lambda name: geom_id(model, name)  # noqa: E731
        peg, table, pin = g("red_peg"), g("table"), g("pin")
        sockets = [g(f"socket-{i}") for i in range(1, 5)]
        left_finger = g("vx300s_left/10_left_gripper_finger")
        self.right = {(peg, g("vx300s_right/10_right_gripper_finger"))}
        self.left = {(s, left_finger) for s in sockets}
        self.peg_table = {(peg, table)}
        self.socket_table = {(s, table) for s in sockets}
        self.peg_socket = {(peg, s) for s in sockets}
        self.pin = {(peg, pin)}

    def __call__(self, data: mujoco.MjData) -> int:
        pairs = _contact_pairs(data)
        hit = lambda group: not group.isdisjoint(pairs)  # noqa: E731
        left, right = hit(self.left), hit(self.right)
        on_table = hit(self.peg_table) or hit(self.socket_table)
        reward = 0
        if left and right:
            reward = 1
        if left and right and not on_table:
            reward = 2
        if hit(self.peg_socket) and not on_table:
            reward = 3
        if hit(self.pin):
            reward = 4
        return reward


@dataclass(frozen=True)
class TaskSpec:
    """One ALOHA task: its two scenes, object sampler, reward and episode settings."""

    name: str
    text: str  # the instruction stored with every recorded frame (LeRobot's `task`)
    joint_xml: str  # joint-position-controlled scene (the env)
    mocap_xml: str  # end-effector (mocap) scene used by the scripted expert
    object_dim: int  # free-joint qpos entries of the objects (7 per object)
    sample_objects: Callable[[int | None], np.ndarray]
    make_reward: Callable[[mujoco.MjModel], Callable[[mujoco.MjData], int]]
    gym_id: str
    episode_length: int = 400  # lerobot's AlohaEnv.episode_length (gym-aloha registers max_episode_steps=300)
    max_reward: int = 4
    stages: tuple[str, ...] = ()  # what reward 1, 2, ... max_reward means, in words (its reward's docstring)

    def stage_name(self, reward: float) -> str:
        """The furthest stage an episode with this max reward reached, in words ("no stage" for 0)."""
        index = int(reward)
        if index == 0:
            return "no stage"
        return self.stages[index - 1] if index <= len(self.stages) else str(index)


TASKS: dict[str, TaskSpec] = {
    "transfer_cube": TaskSpec(
        name="transfer_cube",
        text="Pick up the cube with the right arm and transfer it to the left arm.",
        joint_xml="bimanual_viperx_transfer_cube.xml",
        mocap_xml="bimanual_viperx_end_effector_transfer_cube.xml",
        object_dim=7,
        sample_objects=sample_box_pose,
        make_reward=TransferCubeReward,
        gym_id="gym_aloha/AlohaTransferCube-v0",
        stages=("right finger on the cube", "cube lifted", "left finger on the cube", "left arm holds it"),
    ),
    "insertion": TaskSpec(
        name="insertion",
        text="Pick up the socket and the peg and insert the peg into the socket.",
        joint_xml="bimanual_viperx_insertion.xml",
        mocap_xml="bimanual_viperx_end_effector_insertion.xml",
        object_dim=14,
        sample_objects=sample_insertion_pose,
        make_reward=InsertionReward,
        gym_id="gym_aloha/AlohaInsertion-v0",
        stages=("both grippers on", "both lifted", "peg on the socket", "peg inserted"),
    ),
}

ALIASES = {
    "AlohaTransferCube-v0": "transfer_cube",
    "gym_aloha/AlohaTransferCube-v0": "transfer_cube",
    "AlohaInsertion-v0": "insertion",
    "gym_aloha/AlohaInsertion-v0": "insertion",
}


def get_task(task: str | TaskSpec) -> TaskSpec:
    """A TaskSpec by name (`transfer_cube`, `insertion`, or the gym ids), or the spec itself."""
    if isinstance(task, TaskSpec):
        return task
    name = ALIASES.get(task, task)
    if name not in TASKS:
        raise BadValue(f"unknown ALOHA task {task!r}; choose one of {', '.join(sorted(TASKS) + sorted(ALIASES))}")
    return TASKS[name]
