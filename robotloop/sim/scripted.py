"""Scripted experts (ACT paper, Zhao et al. 2023) and demo recording.

Recipe, as ACT's `record_sim_episodes.py`:
 1. In the mocap scene (`bimanual_viperx_end_effector_*.xml`, grippers welded to mocap bodies), follow
    end-effector waypoints linearly interpolated per step; record the joint trajectory, with each gripper
    entry replaced by the normalized gripper *command*.
 2. Replay that joint trajectory as actions in the joint-space scene (AlohaSim) from the same object pose;
    the replay gives the demo's observations, actions and rewards. The demo succeeded iff its replay reached
    the max reward (4); failures are returned with `success=False`, never hidden.

As in ACT, `actions[t]` is the mocap-pass joint vector at step t, and `states[t]`/`frames[t]` are the replay's
observation before `actions[t]` is applied; `rewards[t]` is the reward after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import mujoco
import numpy as np

from robotloop.errors import BadValue
from robotloop.sim.constants import (
    MOCAP_LEFT_START,
    MOCAP_RIGHT_START,
    PUPPET_GRIPPER_POSITION_CLOSE,
    START_ARM_POSE,
    assets_dir,
    normalize_gripper,
    unnormalize_gripper,
)
from robotloop.sim.env import AlohaSim, ImageSize, joint_state, parse_image_size
from robotloop.sim.physics import forward_without_actuation, legacy_step, load_model, n_substeps
from robotloop.sim.tasks import TaskSpec, get_task


# -- quaternions (w, x, y, z), Hamilton product ------------------------------------------------------
def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return np.array(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ]
    )


def axis_angle_quat(axis: tuple[float, float, float], degrees: float) -> np.ndarray:
    half = np.deg2rad(degrees) / 2
    return np.concatenate([[np.cos(half)], np.sin(half) * np.asarray(axis, dtype=np.float64)])


# -- waypoints ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Waypoint:
    t: int  # control step at which the pose is reached
    xyz: np.ndarray
    quat: np.ndarray
    gripper: float  # normalized: 0 closed, 1 open


def wp(t: int, xyz, quat, gripper: float) -> Waypoint:
    return Waypoint(t, np.asarray(xyz, dtype=np.float64), np.asarray(quat, dtype=np.float64), float(gripper))


def interpolate(path: list[Waypoint], t: int) -> np.ndarray:
    """[xyz, quat, gripper] at step t, linear between the surrounding waypoints (quat too, unnormalized:
    MuJoCo normalizes mocap quaternions), held after the last one."""
    nxt = next((i for i, w in enumerate(path) if w.t > t), None)
    if nxt is None:
        last = path[-1]
        return np.concatenate([last.xyz, last.quat, [last.gripper]])
    a, b = path[nxt - 1], path[nxt]
    frac = (t - a.t) / (b.t - a.t)
    lerp = lambda x, y: x + (y - x) * frac  # noqa: E731
    return np.concatenate([lerp(a.xyz, b.xyz), lerp(a.quat, b.quat), [lerp(a.gripper, b.gripper)]])


@dataclass(frozen=True)
class Plan:
    """Per-arm end-effector waypoints of a scripted episode."""

    left: list[Waypoint]
    right: list[Waypoint]

    def action(self, t: int) -> np.ndarray:
        """16-d mocap action: left [xyz, quat, gripper], right [xyz, quat, gripper]."""
        return np.concatenate([interpolate(self.left, t), interpolate(self.right, t)])


def transfer_cube_plan(objects: np.ndarray, left0: np.ndarray, right0: np.ndarray) -> Plan:
    """Right arm picks the cube, lifts it to a meeting point, the left arm takes it, the right lets go.

    ACT's waypoints with two changes for MuJoCo >= 3 (measured on 30 seeds, replayed): the left gripper meets
    the cube at the meeting height (ACT: 2 cm below, where its finger now knocks the cube out of the right
    hand), and the right gripper opens only once the left one has closed (ACT: opens during 220..310), so the
    cube is held to the end instead of being dropped after a brief reward-4 touch.
    """
    box = objects[:3]
    pick = quat_mul(right0[3:], axis_angle_quat((0, 1, 0), -60))  # tilt the right gripper down
    meet_left = axis_angle_quat((1, 0, 0), 90)  # left gripper rolled to grasp the held cube from the side
    meet = np.array([0.0, 0.5, 0.25])
    left = [
        wp(0, left0[:3], left0[3:], 0),
        wp(100, meet + [-0.1, 0, 0], meet_left, 1),  # approach meeting point, open
        wp(260, meet + [0.02, 0, 0], meet_left, 1),  # reach the cube
        wp(310, meet + [0.02, 0, 0], meet_left, 0),  # close
        wp(360, meet + [-0.1, 0, 0], [1, 0, 0, 0], 0),  # pull away with the cube
        wp(400, meet + [-0.1, 0, 0], [1, 0, 0, 0], 0),  # hold
    ]
    right = [
        wp(0, right0[:3], right0[3:], 0),
        wp(90, box + [0, 0, 0.08], pick, 1),  # above the cube, open
        wp(130, box + [0, 0, -0.015], pick, 1),  # down
        wp(170, box + [0, 0, -0.015], pick, 0),  # close
        wp(200, meet + [0.05, 0, 0], pick, 0),  # lift towards the meeting point
        wp(220, meet, pick, 0),
        wp(310, meet, pick, 0),  # hold while the left closes
        wp(330, meet, pick, 1),  # release
        wp(360, meet + [0.1, 0, 0], pick, 1),  # retreat
        wp(400, meet + [0.1, 0, 0], pick, 1),
    ]
    return Plan(left, right)


def insertion_plan(objects: np.ndarray, left0: np.ndarray, right0: np.ndarray) -> Plan:
    """Left arm grasps the socket, right arm the peg; both meet mid-air and the peg slides into the socket."""
    peg, socket = objects[:3], objects[7:10]
    pick_right = quat_mul(right0[3:], axis_angle_quat((0, 1, 0), -60))
    pick_left = quat_mul(right0[3:], axis_angle_quat((0, 1, 0), 60))  # ACT derives both from the right pose
    meet = np.array([0.0, 0.5, 0.15])
    lift_right = 0.00715  # peg held slightly higher to line up with the socket opening
    left = [
        wp(0, left0[:3], left0[3:], 0),
        wp(120, socket + [0, 0, 0.08], pick_left, 1),
        wp(170, socket + [0, 0, -0.03], pick_left, 1),
        wp(220, socket + [0, 0, -0.03], pick_left, 0),
        wp(285, meet + [-0.1, 0, 0], pick_left, 0),
        wp(340, meet + [-0.05, 0, 0], pick_left, 0),
        wp(400, meet + [-0.05, 0, 0], pick_left, 0),
    ]
    right = [
        wp(0, right0[:3], right0[3:], 0),
        wp(120, peg + [0, 0, 0.08], pick_right, 1),
        wp(170, peg + [0, 0, -0.03], pick_right, 1),
        wp(220, peg + [0, 0, -0.03], pick_right, 0),
        wp(285, meet + [0.1, 0, lift_right], pick_right, 0),
        wp(340, meet + [0.05, 0, lift_right], pick_right, 0),
        wp(400, meet + [0.05, 0, lift_right], pick_right, 0),
    ]
    return Plan(left, right)


PLANNERS = {"transfer_cube": transfer_cube_plan, "insertion": insertion_plan}


# -- mocap (end-effector) pass ---------------------------------------------------------------------
# The MJCF welds (solimp 0.25 0.25) are so soft that under MuJoCo >= 3 the grippers lag and roll away from the
# mocap orientation; ACT's waypoints (tuned on MuJoCo 2.3) then miss the cube (25% mocap-pass success over
# 20 seeds vs 100% with mujoco 2.3.7). A stiffer weld restores the tracking. Only the expert's scene changes.
WELD_SOLIMP = (0.9, 0.95, 0.001)


class MocapScene:
    """gym-aloha's end-effector scene: mocap bodies welded to the grippers, position-controlled fingers."""

    def __init__(self, task: TaskSpec, weld_solimp: tuple[float, float, float] | None = WELD_SOLIMP):
        self.task = task
        self.model = load_model(assets_dir() / task.mocap_xml)
        if weld_solimp is not None:
            self.model.eq_solimp[:, :3] = weld_solimp
        self.data = mujoco.MjData(self.model)
        self.n_substeps = n_substeps(self.model)
        self.reward_fn = task.make_reward(self.model)

    def reset(self, objects: np.ndarray) -> None:
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        d.qpos[:16] = START_ARM_POSE
        d.mocap_pos[0], d.mocap_quat[0] = MOCAP_LEFT_START[:3], MOCAP_LEFT_START[3:]
        d.mocap_pos[1], d.mocap_quat[1] = MOCAP_RIGHT_START[:3], MOCAP_RIGHT_START[3:]
        c = PUPPET_GRIPPER_POSITION_CLOSE
        d.ctrl[:] = [c, -c, c, -c]
        d.qpos[16 : 16 + self.task.object_dim] = objects
        forward_without_actuation(m, d)

    def sync(self, sim: AlohaSim) -> None:
        """Put this scene in `sim`'s physical state (arm joints, fingers, objects, velocities, finger commands),
        each mocap body where its weld already holds the gripper as it is: the first step moves nothing.

        Raises:
            BadValue: `sim` runs another task.
        """
        if sim.task.name != self.task.name:
            raise BadValue(f"a {self.task.name} expert cannot take over a {sim.task.name} sim")
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        d.qpos[:], d.qvel[:] = sim.data.qpos, sim.data.qvel
        d.ctrl[:] = sim.data.ctrl[[6, 7, 14, 15]]  # the joint scene's finger targets: left pair, right pair
        mujoco.mj_kinematics(m, d)
        for k in range(2):
            d.mocap_pos[k], d.mocap_quat[k] = self.weld_source(k)
        forward_without_actuation(m, d)

    def weld_source(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The mocap pose (xyz, quat) whose weld `k` (0 left, 1 right) is satisfied by the gripper's current
        pose. The weld holds gripper = mocap * relpose (MuJoCo's `relpose`, here fixed by the model's qpos0)."""
        m, d = self.model, self.data
        gripper = m.eq_obj2id[k]
        rel_pos, rel_quat = m.eq_data[k, 3:6], m.eq_data[k, 6:10]
        inverse, quat, offset = np.zeros(4), np.zeros(4), np.zeros(3)
        mujoco.mju_negQuat(inverse, rel_quat)
        mujoco.mju_mulQuat(quat, d.xquat[gripper], inverse)
        mujoco.mju_rotVecQuat(offset, rel_pos, quat)
        return d.xpos[gripper] - offset, quat

    def mocap_pose(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Mocap body `k`'s commanded pose (0 left, 1 right), the frame the waypoints are written in."""
        return self.data.mocap_pos[k].copy(), self.data.mocap_quat[k].copy()

    def step(self, action: np.ndarray) -> None:
        d = self.data
        d.mocap_pos[0], d.mocap_quat[0] = action[0:3], action[3:7]
        d.mocap_pos[1], d.mocap_quat[1] = action[8:11], action[11:15]
        gl, gr = unnormalize_gripper(action[7]), unnormalize_gripper(action[15])
        d.ctrl[:] = [gl, -gl, gr, -gr]
        legacy_step(self.model, d, self.n_substeps)

    def joint_command(self) -> np.ndarray:
        """Joint state with the grippers replaced by their normalized commands (ACT's replay action)."""
        q = joint_state(self.data.qpos)
        q[6], q[13] = normalize_gripper(self.data.ctrl[0]), normalize_gripper(self.data.ctrl[2])
        return q


@dataclass
class MocapRollout:
    joint_traj: np.ndarray  # [T+1, 14], entry t = joint command recorded after t mocap steps
    rewards: np.ndarray  # [T] reward after each mocap step

    @property
    def success(self) -> bool:
        return bool(len(self.rewards) and self.rewards.max() == 4)


def rollout_mocap(
    task: str | TaskSpec, objects: np.ndarray, steps: int, scene: MocapScene | None = None
) -> MocapRollout:
    """Run the scripted expert for `steps` control steps in the mocap scene (no rendering)."""
    task = get_task(task)
    scene = scene or MocapScene(task)
    scene.reset(objects)
    plan = PLANNERS[task.name](objects, MOCAP_LEFT_START, MOCAP_RIGHT_START)
    traj, rewards = [scene.joint_command()], []
    for t in range(steps):
        scene.step(plan.action(t))
        traj.append(scene.joint_command())
        rewards.append(scene.reward_fn(scene.data))
    return MocapRollout(np.array(traj), np.array(rewards, dtype=np.float32))


# -- demos ------------------------------------------------------------------------------------------
@dataclass
class Demo:
    """One scripted demonstration, replayed in the joint-space env."""

    task: str
    seed: int
    object_pose: np.ndarray  # [7] cube, or [14] peg + socket
    frames: np.ndarray | None  # uint8 [T, H, W, 3] `top` images (None when recorded without images)
    states: np.ndarray  # float32 [T, 14] agent_pos before each action
    actions: np.ndarray  # float32 [T, 14]
    rewards: np.ndarray  # float32 [T] reward after each action
    success: bool  # replay reached max reward
    mocap_success: bool  # the end-effector pass reached max reward
    info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def max_reward(self) -> float:
        return float(self.rewards.max()) if len(self.rewards) else 0.0


@lru_cache(maxsize=4)
def _mocap_scene(task: str) -> MocapScene:
    return MocapScene(get_task(task))


@lru_cache(maxsize=4)
def _joint_sim(task: str, image_size: ImageSize | None, shadow_map: int | None = None) -> AlohaSim:
    return AlohaSim(task, image_size=image_size, shadow_map=shadow_map)


def record_demo(
    task: str | TaskSpec,
    seed: int,
    image_size: ImageSize | str | None = (480, 640),
    max_steps: int | None = None,
    on_step: Callable[[np.ndarray | None, np.ndarray, np.ndarray, float], None] | None = None,
    shadow_map: int | None = None,
) -> Demo:
    """Scripted demo for `seed`: objects placed as `gym_aloha` `reset(seed=seed)` places them.

    `max_steps` defaults to the task's episode length (400, as ACT's scripted datasets). Simulators are
    cached per process (one mocap scene per task, one renderer per task and image size).
    `shadow_map` sets the side of the lights' shadow maps (default: `shadow_map_size` of the image, gym-aloha's
    4096 at 480x640; `NO_SHADOWS` renders none, faster on a CPU, and images then differ from gym-aloha's).
    `on_step(frame, state, action, reward)` is called after each step, as it happens (a recorder streams the
    frames into its encoder while the replay renders the next ones).
    """
    spec = get_task(task)
    size = parse_image_size(image_size)
    steps = max_steps or spec.episode_length
    objects = spec.sample_objects(seed)
    mocap = rollout_mocap(spec, objects, steps, _mocap_scene(spec.name))
    sim = _joint_sim(spec.name, size, shadow_map)
    obs = sim.reset(seed, object_pose=objects)
    frames, states, rewards = [], [], []
    actions = mocap.joint_traj[:steps]
    for action in actions:
        states.append(obs["agent_pos"])
        if size is not None:
            frames.append(obs["pixels"]["top"])
        obs, reward, *_ = sim.step(action)
        rewards.append(reward)
        if on_step is not None:
            on_step(frames[-1] if size is not None else None, states[-1], action, reward)
    rewards_arr = np.array(rewards, dtype=np.float32)
    return Demo(
        task=spec.name,
        seed=seed,
        object_pose=objects,
        frames=np.stack(frames) if frames else None,
        states=np.array(states, dtype=np.float32),
        actions=actions.astype(np.float32),
        rewards=rewards_arr,
        success=bool(rewards_arr.max() == spec.max_reward),
        mocap_success=mocap.success,
        info={
            "mocap_max_reward": float(mocap.rewards.max()) if len(mocap.rewards) else 0.0,
            "final_object_pose": sim.env_state(),
            "image_size": size,
        },
    )
