"""Recording from LeRobot hardware: a `Robot` follows a `Teleoperator` at the dataset's rate.

Uses LeRobot's own Robot and Teleoperator interfaces (`get_observation`, `get_action`, `send_action`), so any
robot LeRobot supports records the same way. Scalar observation entries (joint positions) form the state
vector, array entries of shape (H, W, 3) are cameras, and the action is what `send_action` actually sent
(after the robot's own safety clipping), as LeRobot's recorder stores it.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import time
from collections.abc import Callable, Iterator

import numpy as np

from ..errors import BadValue
from ..features import ACTION_KEY, STATE_KEY, image_key
from .recorder import CommitReport, DatasetRecorder, DatasetSpec


def robot_spec(robot, fps: int = 30, vcodec: str = "libsvtav1") -> DatasetSpec:
    """The dataset shape a LeRobot `Robot` produces: its cameras, its scalar observations and its actions."""
    obs = robot.observation_features
    cameras = {name: tuple(shape) for name, shape in obs.items() if isinstance(shape, tuple)}
    state = [name for name, kind in obs.items() if not isinstance(kind, tuple)]
    return DatasetSpec(cameras, len(state), len(robot.action_features), fps, robot.name, vcodec, with_reward=False)


def teleop_frames(
    robot,
    teleop,
    seconds: float,
    fps: int,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[dict]:
    """Teleoperate `robot` for `seconds` at `fps`, yielding one lerobot frame per step: the observation before
    the action, and the action `send_action` actually sent."""
    obs_features = robot.observation_features
    state_keys = [k for k, v in obs_features.items() if not isinstance(v, tuple)]
    camera_keys = [k for k, v in obs_features.items() if isinstance(v, tuple)]
    action_keys = list(robot.action_features)
    period, start = 1.0 / fps, clock()
    for step in range(round(seconds * fps)):
        obs = robot.get_observation()
        sent = robot.send_action(teleop.get_action())
        frame = {image_key(k): np.asarray(obs[k], np.uint8) for k in camera_keys}
        frame[STATE_KEY] = np.array([obs[k] for k in state_keys], np.float32)
        frame[ACTION_KEY] = np.array([sent[k] for k in action_keys], np.float32)
        yield frame
        sleep(max(0.0, start + (step + 1) * period - clock()))  # hold the rate without drift


def record_robot(
    recorder: DatasetRecorder,
    robot,
    teleop,
    episodes: int,
    seconds: float,
    task: str,
    reset_s: float = 0.0,
    on_commit: Callable[[CommitReport], None] | None = None,
) -> list[CommitReport]:
    """Record and commit `episodes` teleoperated episodes; `reset_s` of free teleoperation between them.

    Frames are written while the episode runs (streaming encoder), so each commit follows its episode's
    end by only the encoder's tail and the upload.
    """
    reports = []
    for _ in range(episodes):
        live = recorder.begin(task)
        try:
            for frame in teleop_frames(robot, teleop, seconds, recorder.spec.fps):
                live.add_frame(frame)
        except BaseException:
            live.abort()
            raise
        reports.append(live.commit())
        if on_commit:
            on_commit(reports[-1])
        end = time.perf_counter() + reset_s
        while time.perf_counter() < end:  # the operator resets the scene; the robot keeps following
            robot.send_action(teleop.get_action())
            time.sleep(1.0 / recorder.spec.fps)
    return reports


def make_hardware(kind: str, type_name: str, port: str | None, id_: str | None, cameras: str | None = None):
    """A LeRobot robot or teleoperator made from `hardware_config(...)` (not yet connected).

    Raises:
        BadValue: see `hardware_config`, or LeRobot could not make the device (its SDK is not installed, or no
            class implements the type; LeRobot's message says which).
    """
    if kind == "robot":
        from lerobot.robots.utils import make_robot_from_config as make
    else:
        from lerobot.teleoperators.utils import make_teleoperator_from_config as make
    config = hardware_config(kind, type_name, port, id_, cameras)
    try:
        return make(config)
    except (ImportError, ValueError) as error:  # LeRobot's own errors for a device it cannot make
        raise BadValue(f"LeRobot could not make the {kind} {type_name!r}: {error}") from error


def hardware_config(kind: str, type_name: str, port: str | None, id_: str | None, cameras: str | None = None):
    """A LeRobot robot or teleoperator config from its registered type name, e.g. ("robot", "so101_follower"),
    with `cameras` in LeRobot's own spelling of `--robot.cameras`, e.g.
    `"{front: {type: opencv, index_or_path: 0, width: 640, height: 480, fps: 30}}"`.

    Raises:
        ValueError: unknown type name (the message lists the known ones), or cameras LeRobot cannot read.
    """
    if kind == "robot":
        import lerobot.robots as package
        from lerobot.robots import RobotConfig as Config
    else:
        import lerobot.teleoperators as package
        from lerobot.teleoperators import TeleoperatorConfig as Config
    for module in pkgutil.iter_modules(package.__path__):  # each module registers its config types on import
        with contextlib.suppress(ImportError):  # a robot whose optional SDK is not installed cannot be chosen
            importlib.import_module(f"{package.__name__}.{module.name}")
    try:
        config_class = Config.get_choice_class(type_name)
    except KeyError:
        raise BadValue(
            f"unknown {kind} type {type_name!r}; LeRobot knows {sorted(Config.get_known_choices())}"
        ) from None
    kwargs = {k: v for k, v in {"port": port, "id": id_}.items() if v is not None}
    if cameras:
        kwargs["cameras"] = parse_cameras(cameras)
    return config_class(**kwargs)


def parse_cameras(text: str) -> dict:
    """`--robot.cameras` as LeRobot reads it (a YAML mapping of name -> camera config, decoded by draccus into
    LeRobot's registered `CameraConfig` types).

    Raises:
        BadValue (a ValueError): not a mapping, an unknown camera type, or fields the camera type does not have.
    """
    import draccus
    import lerobot.cameras as package
    import yaml
    from lerobot.cameras import CameraConfig

    for module in pkgutil.iter_modules(package.__path__):  # each camera module registers its config type
        with contextlib.suppress(ImportError):
            importlib.import_module(f"{package.__name__}.{module.name}")
    try:
        value = yaml.safe_load(text)
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping of camera name to its config, got {type(value).__name__}")
        return draccus.decode(dict[str, CameraConfig], value)
    except (yaml.YAMLError, ValueError, TypeError, KeyError, draccus.utils.ParsingError) as error:
        known = sorted(CameraConfig.get_known_choices())
        raise BadValue(
            f"--robot.cameras {text!r}: {' '.join(str(error).split())}; e.g. {{front: {{type: opencv, "
            f"index_or_path: 0, width: 640, height: 480, fps: 30}}}} (camera types: {known})"
        ) from None
