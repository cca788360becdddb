"""The sim expert that re-plans from any state, and the takeover interface the robot runtime drives.

A fleet's expert effort goes where the policy fails (issue 29): a *re-demonstration* replays the scripted expert on
a failed episode's scene from its initial state (`redemonstrate`, which is `record_demo` of the same seed), and a
*takeover* hands the robot to an expert from the state the policy left (`replan`, `ScriptedExpert`,
`TeleopExpert`), when a `StallTrigger` or the user (`UserTrigger`) says so.

`replan(task, sim)` reads the joint-space sim's physical state (arm joints, fingers, objects, velocities) and
scripts the rest of the task from there, in phases. Each phase is written as end-effector waypoints in the
expert's mocap scene put in the state the sim is in (`MocapScene.sync`: each mocap body where its weld already
holds the gripper, so nothing jumps), recorded as joint commands, and played in a private copy of the sim (its
"world", bit for bit the caller's state); what the world then shows picks the next phase. TransferCube: pick the
cube where it lies (unless the right hand holds it), bring it to the meeting point, hand it over to the left
hand, let go. Insertion: pick whichever of peg and socket is not held, lift both, line the peg up before the
socket's mouth, push it in (again from where it stopped, if it stopped short). Objects still moving are waited
for; a slipped grasp is tried again (twice at most); an object off the table, out of reach or tipped over is
declared `Unrecoverable`. The caller replays the actions in its own sim and reaches the success the world did.

    >>> actions = replan("transfer_cube", sim)      # [T, 14] joint actions, sim untouched
    >>> expert = ScriptedExpert("transfer_cube"); expert.start(sim)
    >>> while not expert.done: obs, *_ = sim.step(expert.act(obs))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import mujoco
import numpy as np

from robotloop.errors import BadValue, Unprocessable
from robotloop.sim.constants import ACTION_DIM, MOCAP_RIGHT_START
from robotloop.sim.env import AlohaSim, ImageSize
from robotloop.sim.physics import contact_pairs, geom_id
from robotloop.sim.scripted import Demo, MocapScene, Plan, Waypoint, axis_angle_quat, quat_mul, record_demo, wp
from robotloop.sim.tasks import TaskSpec, get_task


class Unrecoverable(Unprocessable):
    """The expert found no way to success from this state (an object off the table or out of reach, a grasp
    that failed twice, the step budget spent); the message says which, and the phases it ran before."""


# -- re-demonstration --------------------------------------------------------------------------------------------
def redemonstrate(task: str | TaskSpec, seed: int, image_size: ImageSize | str | None = (480, 640)) -> Demo:
    """The scripted expert on `seed`'s scene from its initial state: the scene a failed episode of that seed
    started from (the sim places objects from the seed alone), so this is `record_demo(task, seed)`."""
    return record_demo(task, seed, image_size=image_size)


# -- one arm's waypoints, built forward from where it is --------------------------------------------------------------
LINEAR_SPEED = 0.003  # m per control step (0.15 m/s), about the scripted plans' free moves
ANGULAR_SPEED = 1.0  # degrees per control step
MIN_MOVE_STEPS = 10


def quat_angle(a: np.ndarray, b: np.ndarray) -> float:
    """Angle in degrees between two unit rotations."""
    dot = abs(float(np.dot(a, b)) / (np.linalg.norm(a) * np.linalg.norm(b)))
    return math.degrees(2 * math.acos(min(1.0, dot)))


def rotate_about_z(quat: np.ndarray, degrees: float) -> np.ndarray:
    """`quat` turned by `degrees` about the world's vertical axis."""
    return quat_mul(axis_angle_quat((0, 0, 1), degrees), quat)


class ArmPath:
    """Waypoints of one arm (mocap pose and gripper command), each move timed by its distance."""

    def __init__(self, xyz: np.ndarray, quat: np.ndarray, gripper: float):
        self.points: list[Waypoint] = [wp(0, xyz, quat / np.linalg.norm(quat), gripper)]

    @property
    def end(self) -> Waypoint:
        return self.points[-1]

    def move(self, xyz=None, quat=None, gripper: float | None = None, steps: int | None = None) -> ArmPath:
        """Go to `xyz`/`quat`/`gripper` (None: keep), in `steps` or in the time the distance takes."""
        last = self.end
        xyz = last.xyz if xyz is None else np.asarray(xyz, dtype=np.float64)
        quat = last.quat if quat is None else np.asarray(quat, dtype=np.float64)
        if np.dot(quat, last.quat) < 0:  # the same rotation on the near side: the linear blend takes the short way
            quat = -quat
        if steps is None:
            distance = np.linalg.norm(xyz - last.xyz) / LINEAR_SPEED
            steps = math.ceil(max(MIN_MOVE_STEPS, distance, quat_angle(quat, last.quat) / ANGULAR_SPEED))
        self.points.append(wp(last.t + steps, xyz, quat, last.gripper if gripper is None else gripper))
        return self

    def hold_until(self, t: int) -> ArmPath:
        return self.move(steps=t - self.end.t) if t > self.end.t else self

    def rise_to(self, z: float) -> ArmPath:
        """Straight up to height `z` first when below it (so the next move does not sweep the table)."""
        return self.move(xyz=[*self.end.xyz[:2], z]) if self.end.xyz[2] < z else self


def both(left: ArmPath, right: ArmPath) -> Plan:
    """The two arms' paths, the shorter one holding its last pose until the longer one ends."""
    end = max(left.end.t, right.end.t)
    return Plan(left.hold_until(end).points, right.hold_until(end).points)


# -- what the scene shows -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectView:
    xyz: np.ndarray
    # [3, 3], rows: the object's x, y, z axes in world coordinates (x: the peg's and the socket's long one)
    axes: np.ndarray
    yaw: float  # degrees, of the grasp the object's symmetry allows (`grasp_yaw`)
    graspable: bool  # a grasp from above can close on it (`grasp_yaw`)
    on_table: bool

    def end(self, half_length: float, towards: float) -> np.ndarray:
        """The centre of the object's end face along its x axis, the one on the side of world x `towards`."""
        axis = self.axes[0] if self.axes[0][0] * towards >= 0 else -self.axes[0]
        return self.xyz + half_length * axis


def object_axes(quat: np.ndarray) -> np.ndarray:
    rot = np.zeros(9)
    mujoco.mju_quat2Mat(rot, quat)
    return rot.reshape(3, 3).T


MAX_TILT = 35  # degrees: a peg or socket tilted more than this along its length is not grasped from above


def grasp_yaw(axes: np.ndarray, elongated: bool) -> tuple[float, bool]:
    """The turn about the vertical that lines a gripper up with an object (within +-90 degrees for a bar, the
    peg and socket, along their local x axis; +-45 for the cube) and whether a grasp from above can close on it:
    a bar with its long axis within `MAX_TILT` of level (its square section closes alike at any roll); the cube
    at any tilt (the closing fingers press it flat: measured on the cubes shaken policies leave tilted)."""
    if elongated:
        graspable, long_axis = abs(axes[0][2]) < math.sin(math.radians(MAX_TILT)), axes[0]
    else:
        graspable, long_axis = True, min(axes, key=lambda a: abs(a[2]))  # its most level side
    symmetry = 180 if elongated else 90
    yaw = math.degrees(math.atan2(long_axis[1], long_axis[0]))
    return (yaw + symmetry / 2) % symmetry - symmetry / 2, graspable


class SceneFacts:
    """Contacts and object poses read off a mocap scene (geoms by gym-aloha's names)."""

    def __init__(self, scene: MocapScene):
        self.scene, m = scene, scene.model
        self.table = geom_id(m, "table")
        self.fingers = [
            {geom_id(m, f"vx300s_{arm}/10_{side}_gripper_finger") for side in ("left", "right")}
            for arm in ("left", "right")
        ]
        names = [m.geom(i).name for i in range(m.ngeom)]
        self.arms = [{i for i, n in enumerate(names) if n.startswith(f"vx300s_{arm}/")} for arm in ("left", "right")]

    def touching(self, geoms: set[int], others: set[int]) -> set[int]:
        """The members of `others` that touch any of `geoms` now."""
        hit = set()
        for a, b in contact_pairs(self.scene.data):
            if a in geoms and b in others:
                hit.add(b)
            elif b in geoms and a in others:
                hit.add(a)
        return hit

    def holds(self, arm: int, geoms: set[int]) -> bool:
        """`arm` (0 left, 1 right) is told to close and a finger of it touches the object made of `geoms` (an
        object held tight often touches one finger only, at a given instant)."""
        closed = self.scene.joint_command()[6 + 7 * arm] < 0.5
        return closed and bool(self.touching(geoms, self.fingers[arm]))

    def on_table(self, geoms: set[int]) -> bool:
        return bool(self.touching(geoms, {self.table}))

    def object(self, qpos_at: int, geoms: set[int], elongated: bool) -> ObjectView:
        qpos = self.scene.data.qpos[qpos_at : qpos_at + 7]
        axes = object_axes(qpos[3:])
        yaw, graspable = grasp_yaw(axes, elongated)
        return ObjectView(qpos[:3].copy(), axes, yaw, graspable, self.on_table(geoms))

    def reward(self) -> int:
        return self.scene.reward_fn(self.scene.data)

    def moving(self) -> bool:
        """Some object still slides or tumbles (faster than 1 cm/s or 0.1 rad/s): where it lies is not yet known."""
        free = self.scene.data.qvel[16:].reshape(-1, 6)  # per object: linear then angular velocity
        speed, spin = np.linalg.norm(free[:, :3], axis=1), np.linalg.norm(free[:, 3:], axis=1)
        return bool(np.any(speed > 0.01) or np.any(spin > 0.1))


# -- phases: each a plan from the scene's state now; `None` when the task is done -----------------------------------
@dataclass
class Progress:
    """What the phases have done so far in this re-plan."""

    phases: list[str] = field(default_factory=list)  # names of the phases run, in order
    picks: dict[str, int] = field(default_factory=dict)  # grasp attempts per object
    succeeded: bool = False  # the task's max reward was reached

    @property
    def last(self) -> str:
        return self.phases[-1] if self.phases else ""


Phase = tuple[str, Plan]
MAX_PICKS = 2
# Where each arm (0 left, 1 right) still grasps an object from above: x range, y range, in m. Measured with the
# cube placed on a 10 cm grid, the arms at their start pose: the right arm grasps it from x=-0.2 to 0.35 and y=0.2
# to 0.95 (but for the far corners, where two tries fail instead); the left arm mirrors it.
REACH = {0: ((-0.35, 0.2), (0.2, 0.95)), 1: ((-0.2, 0.35), (0.2, 0.95))}


def check_on_table(name: str, obj: ObjectView) -> None:
    """Raises Unrecoverable when `obj` fell below the table top (off its edge: no waiting brings it back)."""
    if obj.xyz[2] < 0:
        raise Unrecoverable(f"the {name} fell off the table")


def check_graspable(name: str, obj: ObjectView, arm: int) -> None:
    """Raises Unrecoverable when `obj` lies where `arm` (0 left, 1 right) cannot grasp it from above."""
    (x0, x1), (y0, y1) = REACH[arm]
    x, y, z = obj.xyz
    check_on_table(name, obj)
    if not (x0 <= x <= x1 and y0 <= y <= y1):
        raise Unrecoverable(f"the {name} is out of reach, at x={x:.2f} y={y:.2f} z={z:.2f} m")
    if not obj.graspable:
        raise Unrecoverable(f"the {name} is tipped over; a grasp from above cannot close on it")


MAX_CLEARS = 2


def clear_tipped(
    facts: SceneFacts, obj: ObjectView, geoms: set[int], left: ArmPath, right: ArmPath, progress: Progress
) -> Phase | None:
    """When `obj` leans tipped against an arm, that arm opens and backs 6 cm up, so the object falls flat (the
    phases wait for it to settle before they look again). None when it leans on neither arm, or was cleared
    `MAX_CLEARS` times."""
    leaning = [k for k in (0, 1) if facts.touching(geoms, facts.arms[k])]
    if obj.graspable or not leaning or progress.phases.count("clear") >= MAX_CLEARS:
        return None
    for k in leaning:
        path = (left, right)[k]
        path.move(gripper=1, steps=MIN_MOVE_STEPS).move(path.end.xyz + [0, 0, 0.06], steps=20)
    return "clear", both(left, right)


def count_pick(progress: Progress, name: str) -> None:
    """Raises Unrecoverable when `name` was already grasped for `MAX_PICKS` times."""
    progress.picks[name] = progress.picks.get(name, 0) + 1
    if progress.picks[name] > MAX_PICKS:
        raise Unrecoverable(f"the {name} slipped out of the gripper {MAX_PICKS} times")


MAX_WAITS, MAX_TIPPED_WAITS = 10, 3


def settle(facts: SceneFacts, objects: list[ObjectView], left: ArmPath, right: ArmPath, progress: Progress):
    """A phase of both arms holding still while the objects settle (or a tipped one falls flat), or None when
    they are at rest (or a tipped one stayed so for `MAX_TIPPED_WAITS` waits: `check_graspable` says so).

    Raises:
        Unrecoverable: they still move after `MAX_WAITS` waits.
    """
    waits, steps = progress.phases.count("wait"), 10
    if facts.moving():
        if waits >= MAX_WAITS:
            raise Unrecoverable(f"the objects still move after {MAX_WAITS * steps} steps")
    elif all(obj.graspable for obj in objects) or waits >= MAX_TIPPED_WAITS:
        return None
    return "wait", both(left.move(steps=steps), right.move(steps=steps))


def pick(path: ArmPath, obj: ObjectView, quat: np.ndarray, above: float, grip: float) -> ArmPath:
    """Open, rise clear of the table, turn to the grasp (`obj`'s yaw), go over `obj`, descend to `grip` above
    its centre, close (the scripted plans' 40-step descend and close).

    Turning before going keeps the wrist out of its singularity: from the arms' start pose, turning while the
    waist swings takes the welds' pull through forearm roll and wrist rotate near +-pi (a flipped wrist the
    joint controllers clip at their limits, measured on cubes off the arm's axis); turned first, neither
    passes 2 rad over the `REACH` grid."""
    turned = rotate_about_z(quat, obj.yaw)
    path.move(gripper=1, steps=MIN_MOVE_STEPS).rise_to(obj.xyz[2] + above)
    path.move(quat=turned).move(obj.xyz + [0, 0, above])
    path.move(obj.xyz + [0, 0, grip], turned, 1, steps=40)
    return path.move(gripper=0, steps=40)


class TransferCubePhases:
    """Right arm picks the cube, brings it to the meeting point, the left arm takes it, the right lets go."""

    right_pick = quat_mul(MOCAP_RIGHT_START[3:], axis_angle_quat((0, 1, 0), -60))  # as `transfer_cube_plan`
    left_meet = axis_angle_quat((1, 0, 0), 90)
    meet = np.array([0.0, 0.5, 0.25])
    # The left mocap target relative to the cube held at the meeting point: `transfer_cube_plan`'s meet + 2 cm
    # in x against where its cube is then (measured: 3.3 cm behind the gripper's mocap point, 0.7 cm lower).
    left_grasp_offset = np.array([0.033, 0.0, 0.007])

    def __init__(self, scene: MocapScene):
        self.facts = SceneFacts(scene)
        self.cube = {geom_id(scene.model, "red_box")}

    def next_plan(self, left: ArmPath, right: ArmPath, progress: Progress) -> Phase | None:
        """Raises Unrecoverable: see `check_graspable`, `count_pick`."""
        if progress.succeeded:
            return None
        f = self.facts
        cube = f.object(16, self.cube, elongated=False)
        if f.holds(0, self.cube):
            return "let go", self.let_go(left, right)
        if f.holds(1, self.cube) and not cube.on_table:
            if progress.last in ("pick", "bring"):  # both end with the cube at the meeting point
                return "hand over", self.hand_over(left, right, cube)
            return "bring", self.bring(left, right)
        check_on_table("cube", cube)
        if phase := clear_tipped(f, cube, self.cube, left, right, progress) or settle(f, [cube], left, right, progress):
            return phase
        check_graspable("cube", cube, arm=1)
        count_pick(progress, "cube")
        pick(right, cube, self.right_pick, above=0.11, grip=0.015)  # `transfer_cube_plan`: 8 cm, -1.5 cm over z=0.05
        return "pick", self.bring(left, right)

    def bring(self, left: ArmPath, right: ArmPath) -> Plan:
        """Right arm lifts the cube to the meeting point; the left waits, open, 10 cm before it."""
        right.move(self.meet + [0.05, 0, 0], self.right_pick, 0, steps=30).move(self.meet, steps=20)
        left.rise_to(0.15).move(self.meet + [-0.1, 0, 0], self.left_meet, 1)
        return both(left, right)

    def hand_over(self, left: ArmPath, right: ArmPath, cube: ObjectView) -> Plan:
        """Left arm reaches the cube where the right hand holds it, closes, and takes it (`let_go`)."""
        reach = cube.xyz + self.left_grasp_offset
        left.rise_to(0.15).move(reach + [-0.12, 0, 0], self.left_meet, 1)
        left.move(reach, steps=80).move(gripper=0, steps=50)
        return self.let_go(left, right.hold_until(left.end.t))

    def let_go(self, left: ArmPath, right: ArmPath) -> Plan:
        """Right hand opens and retreats; the left pulls the cube away (`transfer_cube_plan`'s last 90 steps)."""
        right.move(gripper=1, steps=20)
        left.hold_until(right.end.t).move(left.end.xyz + [-0.12, 0, 0], [1, 0, 0, 0], 0, steps=50)
        right.move(right.end.xyz + [0.1, 0, 0], steps=30)
        left.move(steps=20)
        return both(left, right)


class InsertionPhases:
    """Left arm picks the socket, right arm the peg; both lift, the peg is lined up before the socket's mouth,
    then slides in. Each step aims at where the objects are (they swing in the grippers: each phase ends with a
    still hold, so the next one measures them at rest)."""

    right_pick = quat_mul(MOCAP_RIGHT_START[3:], axis_angle_quat((0, 1, 0), -60))  # as `insertion_plan`
    left_pick = quat_mul(MOCAP_RIGHT_START[3:], axis_angle_quat((0, 1, 0), 60))
    meet = np.array([0.0, 0.5, 0.15])
    # The peg's end against the centre of the socket's mouth (6 cm from its centre), in x: 1.5 cm before it, then
    # 2.5 cm in, 5 mm onto the pin (whose end is 2 cm inside the mouth).
    half_length = 0.06
    before_mouth, inserted = 0.015, -0.025
    settle_steps = 25
    max_misalignment = 0.004  # m, peg axis off the socket's: the walls leave 8 mm each side
    max_pushes = 3  # insert phases in a row before pulling out to line up again

    def __init__(self, scene: MocapScene):
        self.facts = SceneFacts(scene)
        m = scene.model
        self.peg = {geom_id(m, "red_peg")}
        self.socket = {geom_id(m, name) for name in ("socket-1", "socket-2", "socket-3", "socket-4", "pin")}

    def next_plan(self, left: ArmPath, right: ArmPath, progress: Progress) -> Phase | None:
        """Raises Unrecoverable: see `check_graspable`, `count_pick`."""
        if progress.succeeded:
            return None
        f = self.facts
        peg, socket = f.object(16, self.peg, elongated=True), f.object(23, self.socket, elongated=True)
        has_peg, has_socket = f.holds(1, self.peg), f.holds(0, self.socket)
        if has_peg and has_socket and not (peg.on_table or socket.on_table):
            off_axis = np.linalg.norm((self.peg_end(peg) - self.mouth(socket))[1:])
            pushes = next((i for i, name in enumerate(reversed(progress.phases)) if name != "insert"), 0)
            if (progress.last == "align" and off_axis < self.max_misalignment) or (
                progress.last == "insert" and off_axis < 2 * self.max_misalignment and pushes < self.max_pushes
            ):  # in, or further in from where the last push stopped (the peg turns a little in the fingers)
                return "insert", self.slide(left, right, peg, socket, self.inserted)
            if progress.last in ("lift", "align"):
                return "align", self.slide(left, right, peg, socket, self.before_mouth)
            return "lift", self.lift(left, right)
        if has_peg and has_socket:
            return "lift", self.lift(left, right)
        for name, obj, geoms in (("socket", socket, self.socket), ("peg", peg, self.peg)):
            check_on_table(name, obj)
            if cleared := clear_tipped(f, obj, geoms, left, right, progress):
                return cleared
        if phase := settle(f, [peg, socket], left, right, progress):
            return phase
        if not has_socket:
            check_graspable("socket", socket, arm=0)
            count_pick(progress, "socket")
            pick(left, socket, self.left_pick, above=0.108, grip=-0.002)  # `insertion_plan`: 8 / -3 cm over z=0.05
        if not has_peg:
            check_graspable("peg", peg, arm=1)
            count_pick(progress, "peg")
            pick(right, peg, self.right_pick, above=0.12, grip=0.01)
        return "pick", both(left, right)

    def lift(self, left: ArmPath, right: ArmPath) -> Plan:
        """Both lift their object to 10 cm either side of the meeting point (`insertion_plan`'s 65 steps)."""
        left.move(self.meet + [-0.1, 0, 0], self.left_pick, 0, steps=65)
        right.move(self.meet + [0.1, 0, 0], self.right_pick, 0, steps=65)
        return both(left.move(steps=self.settle_steps), right.move(steps=self.settle_steps))

    def peg_end(self, peg: ObjectView) -> np.ndarray:
        return peg.end(self.half_length, towards=-1)  # the right hand holds the peg; the socket is to its left

    def mouth(self, socket: ObjectView) -> np.ndarray:
        return socket.end(self.half_length, towards=+1)

    def slide(self, left: ArmPath, right: ArmPath, peg: ObjectView, socket: ObjectView, gap: float) -> Plan:
        """The right hand moves the peg's end to `gap` in x from the socket's mouth, on its axis; the left holds
        the socket."""
        target = self.mouth(socket) + [gap, 0, 0]
        right.move(right.end.xyz + (target - self.peg_end(peg)), steps=40)
        return both(left, right.move(steps=self.settle_steps))


PHASES = {"transfer_cube": TransferCubePhases, "insertion": InsertionPhases}
MAX_REPLAN_STEPS = 800  # two episodes' worth: a plan longer than this is not a recovery


@dataclass
class Takeover:
    """A re-plan: the joint actions and the phases they came from (e.g. pick, bring, hand over, let go)."""

    actions: np.ndarray  # float32 [T, 14]
    phases: list[str]


MAX_BIAS = 0.05  # rad: larger gaps between command and joint are a push against something, not the arm's sag


def plan_takeover(task: str | TaskSpec, sim: AlohaSim, max_steps: int = MAX_REPLAN_STEPS) -> Takeover:
    """`replan`, with the phases it ran. Raises as `replan`.

    The expert works on a private copy of `sim` (its "world", same physical state, bit for bit): each phase is
    scripted in the mocap scene put in the world's state, then played in the world, which decides what comes
    next (and whether it succeeded). The caller's sim, replaying the same actions from the same state, does the
    same. From the second phase on, each command carries the gap the world's arms had between their last command
    and their joints (their sag under the position controllers), so a phase continues the last one's command.
    """
    spec = get_task(task)
    if sim.task.name != spec.name:
        raise BadValue(f"a {spec.name} expert cannot take over a {sim.task.name} sim")
    scene, world = _expert_scene(spec.name), _world(spec.name)
    world.set_physics_state(sim.physics_state())
    phases = PHASES[spec.name](scene)
    progress = Progress()
    scene.sync(world)
    actions, bias = [scene.joint_command().astype(np.float32)], np.zeros(ACTION_DIM)
    world.step(actions[0])  # the world steps on exactly the float32 values the caller (and a dataset) gets
    while True:
        scene.sync(world)
        try:
            phase = phases.next_plan(*_arm_paths(scene), progress)
        except Unrecoverable as error:
            raise Unrecoverable(f"{error} (after {', '.join(progress.phases) or 'no phase'})") from None
        if phase is None:
            return Takeover(np.array(actions), progress.phases)
        name, plan = phase
        steps = max(plan.left[-1].t, plan.right[-1].t)
        if len(actions) + steps > max_steps:
            raise Unrecoverable(
                f"no {spec.name} success within {max_steps} expert steps ({', '.join(progress.phases)})"
            )
        progress.phases.append(name)
        for t in range(1, steps + 1):
            scene.step(plan.action(t))
            actions.append((scene.joint_command() + bias).astype(np.float32))
            world.step(actions[-1])
            progress.succeeded |= world.reward() == spec.max_reward
        bias = arm_sag(actions[-1], world.state())


def arm_sag(command: np.ndarray, joints: np.ndarray) -> np.ndarray:
    """Command minus joint position per arm joint (0 for the grippers, whose command is not a position), each
    clipped to +-MAX_BIAS."""
    gap = np.clip(command - joints, -MAX_BIAS, MAX_BIAS)
    gap[[6, 13]] = 0
    return gap


def replan(task: str | TaskSpec, sim: AlohaSim, max_steps: int = MAX_REPLAN_STEPS) -> np.ndarray:
    """Joint actions [T, 14] that take `sim` from its current physical state to the task's success.

    The expert's mocap scene is put in `sim`'s state and scripted phase by phase from there (module docstring),
    each phase played in a private copy of `sim` that decides the next one; `sim` itself is not stepped: the
    caller replays the actions in it, and reaches the success the copy reached (same state, same physics).
    `actions[0]` holds the arms where they are, as a scripted demo's first action does.

    Raises:
        Unrecoverable: an object fell off the table, lies out of reach or tipped over, or still moves after
            `MAX_WAITS` waits; a grasp failed `MAX_PICKS` times; or no success within `max_steps`.
        BadValue: `sim` runs another task.
    """
    return plan_takeover(task, sim, max_steps).actions


def _arm_paths(scene: MocapScene) -> tuple[ArmPath, ArmPath]:
    """Each arm's path, starting at its mocap pose and gripper command now."""
    command = scene.joint_command()
    return ArmPath(*scene.mocap_pose(0), command[6]), ArmPath(*scene.mocap_pose(1), command[13])


_SCENES: dict[str, MocapScene] = {}
_WORLDS: dict[str, AlohaSim] = {}


def _expert_scene(task: str) -> MocapScene:
    """One mocap scene per task and process (its own, not `record_demo`'s: a re-plan must not disturb a demo)."""
    if task not in _SCENES:
        _SCENES[task] = MocapScene(get_task(task))
    return _SCENES[task]


def _world(task: str) -> AlohaSim:
    """The expert's private joint sim per task and process, without rendering and without a step limit."""
    if task not in _WORLDS:
        _WORLDS[task] = AlohaSim(task, image_size=None, max_episode_steps=2**31)
    return _WORLDS[task]


# -- takeover interface -------------------------------------------------------------------------------------------
@runtime_checkable
class Expert(Protocol):
    """Who drives the robot during a takeover. The runtime calls `start` when it hands over, then `act` once per
    control tick (its actions are the episode's expert frames) until `done`, then hands back to the policy."""

    def start(self, sim: AlohaSim | None = None) -> None: ...

    def act(self, obs: dict[str, Any], state: Any = None) -> np.ndarray: ...

    @property
    def done(self) -> bool: ...


class ScriptedExpert:
    """The sim expert: `start(sim)` re-plans from `sim`'s state, `act` yields the plan one action per tick;
    `done` once the plan is spent or the sim reached success (`act`'s caller steps the same `sim`).

    Raises (from `start`): Unrecoverable, as `replan`.
    """

    def __init__(self, task: str | TaskSpec, max_steps: int = MAX_REPLAN_STEPS):
        self.task, self.max_steps = get_task(task), max_steps
        self.actions: np.ndarray = np.zeros((0, ACTION_DIM), np.float32)
        self.phases: list[str] = []
        self.sim: AlohaSim | None = None
        self.t = 0

    def start(self, sim: AlohaSim | None = None) -> None:
        if sim is None:
            raise BadValue("the scripted expert re-plans from a sim's state: start(sim)")
        self.sim, self.t = sim, 0
        takeover = plan_takeover(self.task, sim, self.max_steps)
        self.actions, self.phases = takeover.actions, takeover.phases

    def act(self, obs: dict[str, Any] | None = None, state: Any = None) -> np.ndarray:
        if self.done:
            raise BadValue("the expert's plan is spent; hand back to the policy (check `done` before `act`)")
        self.t += 1
        return self.actions[self.t - 1]

    @property
    def done(self) -> bool:
        succeeded = self.sim is not None and self.t > 0 and self.sim.reward() == self.task.max_reward
        return self.t >= len(self.actions) or succeeded


class TeleopExpert:
    """A LeRobot `Teleoperator` (leader arm, keyboard, ...) as the expert: each `act` is its `get_action()` as a
    vector in `action_keys` order (the robot's `action_features`, the order the runtime sends). A person decides
    when the takeover ends: `finish()` (the runtime's hand-back trigger) sets `done`.

    Raises (from `act`): BadValue when the teleoperator's action lacks one of `action_keys`.
    """

    def __init__(self, teleop: Any, action_keys: list[str]):
        self.teleop, self.action_keys = teleop, list(action_keys)
        self._done = False

    def start(self, sim: AlohaSim | None = None) -> None:
        self._done = False

    def act(self, obs: dict[str, Any] | None = None, state: Any = None) -> np.ndarray:
        action = self.teleop.get_action()
        missing = [k for k in self.action_keys if k not in action]
        if missing:
            raise BadValue(f"the teleoperator gives no {', '.join(missing)}; the robot takes {len(self.action_keys)}")
        return np.array([action[k] for k in self.action_keys], np.float32)

    def finish(self) -> None:
        self._done = True

    @property
    def done(self) -> bool:
        return self._done


# -- when to take over --------------------------------------------------------------------------------------------
class StallTrigger:
    """Fires once when the episode gained no new reward stage for `k_steps` steps and is not yet successful.

    `update(reward)` after each step says whether it fires now: a reward above the best so far is progress and
    restarts the count; anything else (the same stage, a lost one) is a step without progress; `None` (no reward
    measured: hardware) is neither and never fires. `reset(baseline)` starts over: at a new episode (stage 0), or
    when the expert hands back (its stage then). The scripted demos themselves go up to 162 (TransferCube) and
    212 (Insertion) steps between new stages, so a `k_steps` below that fires on a policy doing what they do.
    """

    def __init__(self, k_steps: int, max_reward: float = 4):
        if k_steps < 1:
            raise BadValue(f"k_steps must be at least 1, got {k_steps}")
        self.k_steps, self.max_reward = k_steps, max_reward
        self.reset()

    def reset(self, baseline: float = 0.0) -> None:
        self.best, self.since = baseline, 0

    def update(self, reward: float | None) -> bool:
        if reward is None:
            return False
        if reward > self.best:
            self.best, self.since = reward, 0
        else:
            self.since += 1
        return self.since == self.k_steps and self.best < self.max_reward


class UserTrigger:
    """A person's takeover request: `request()` (a button, a key, a service call) makes the next `update` fire,
    once. `update` takes the reward to sit beside `StallTrigger` in the runtime's loop; it ignores it."""

    def __init__(self, requested: Callable[[], bool] | None = None):
        self.requested, self._flag = requested, False

    def request(self) -> None:
        self._flag = True

    def reset(self, baseline: float = 0.0) -> None:
        """A new episode or a hand-back: a request made before it is void."""
        self._flag = False

    def update(self, reward: float | None = None) -> bool:
        fired = self._flag or bool(self.requested and self.requested())
        self._flag = False
        return fired
