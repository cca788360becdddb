"""ALOHA simulation constants, identical to gym-aloha's (`gym_aloha/constants.py`).

The 14-d joint vector is `[left arm (6), left gripper (1), right arm (6), right gripper (1)]`; grippers are
normalized finger positions: 0 = closed, 1 = open.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import numpy as np

from ..errors import BadValue, MissingFile

DT = 0.02  # control period, 50 Hz
FPS = 50
STATE_DIM = 14
ACTION_DIM = 14

# qpos[:16] at reset: per arm 6 joints then the two finger slides (left finger +, right finger -)
START_ARM_POSE = np.array(
    [0, -0.96, 1.16, 0, -0.3, 0, 0.02239, -0.02239, 0, -0.96, 1.16, 0, -0.3, 0, 0.02239, -0.02239]
)

PUPPET_GRIPPER_POSITION_OPEN = 0.05800
PUPPET_GRIPPER_POSITION_CLOSE = 0.01844

# Initial mocap poses of the end-effector scenes: gripper_link pose at START_ARM_POSE (as in gym-aloha/ACT)
MOCAP_LEFT_START = np.array([-0.31718881, 0.5, 0.29525084, 1, 0, 0, 0])
MOCAP_RIGHT_START = np.array([0.31718881, 0.49999888, 0.29525084, 1, 0, 0, 0])


def normalize_gripper(x: np.ndarray | float) -> np.ndarray | float:
    """Finger slide position (m) -> normalized gripper (0 closed, 1 open)."""
    return (x - PUPPET_GRIPPER_POSITION_CLOSE) / (PUPPET_GRIPPER_POSITION_OPEN - PUPPET_GRIPPER_POSITION_CLOSE)


def unnormalize_gripper(x: np.ndarray | float) -> np.ndarray | float:
    """Normalized gripper -> finger slide position (m)."""
    return x * (PUPPET_GRIPPER_POSITION_OPEN - PUPPET_GRIPPER_POSITION_CLOSE) + PUPPET_GRIPPER_POSITION_CLOSE


def normalize_gripper_velocity(x: np.ndarray | float) -> np.ndarray | float:
    return x / (PUPPET_GRIPPER_POSITION_OPEN - PUPPET_GRIPPER_POSITION_CLOSE)


def assets_dir() -> Path:
    """The MJCF assets shipped by the gym-aloha package, found without importing it (nor dm_control).

    `ROBOTLOOP_ALOHA_ASSETS` overrides the location (a folder holding gym-aloha's `assets/*.xml`).
    """
    override = os.environ.get("ROBOTLOOP_ALOHA_ASSETS")
    if override:
        path = Path(override)
    else:
        spec = importlib.util.find_spec("gym_aloha")
        if spec is None or not spec.submodule_search_locations:
            # A slim robot install (`robotloop[robot]`) has no gym-aloha: its pip dependencies (dm_control, ~120 MB)
            # are for its own env, which robotloop's sim does not use; the model files are all it needs.
            raise MissingFile(
                "gym-aloha's ALOHA model files are not installed: `pip install --no-deps gym-aloha==0.1.5` (the "
                "files alone; robotloop's sim needs none of its dependencies), or set ROBOTLOOP_ALOHA_ASSETS to its "
                "assets folder"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / "assets"
    if not (path / "scene.xml").is_file():
        raise MissingFile(f"gym-aloha MJCF assets not found in {path}")
    return path


ImageSize = tuple[int, int]  # (height, width)
MIN_IMAGE_SIDE = 8  # the smallest frame the video encoders take; the sim could render less, nothing else could


def parse_image_size(size: ImageSize | str | None) -> ImageSize | None:
    """(H, W), "HxW" or None (no rendering) -> (H, W) or None, validated: robotloop's one image-size parser.

    Example:
        >>> parse_image_size("480x640"), parse_image_size((48, 64)), parse_image_size(None)
        ((480, 640), (48, 64), None)

    Raises:
        BadValue (a ValueError): not two integers, or a side under `MIN_IMAGE_SIDE`.
    """
    if size is None:
        return None
    given = size
    try:
        if isinstance(size, str):
            h, w = size.lower().split("x")
            size = (int(h), int(w))
        h, w = (int(v) for v in size)
    except (TypeError, ValueError):
        raise BadValue(f"image size {given!r}: expected HxW, e.g. 480x640") from None
    if h < MIN_IMAGE_SIDE or w < MIN_IMAGE_SIDE:
        raise BadValue(f"image size {given!r}: images must be at least {MIN_IMAGE_SIDE}x{MIN_IMAGE_SIDE}")
    return h, w


def format_image_size(size: ImageSize | None) -> str:
    """(H, W) as "HxW", the way `parse_image_size` reads it and every message writes it; None: "no images".

    Example:
        >>> format_image_size((48, 64)), format_image_size(None)
        ('48x64', 'no images')
    """
    return "no images" if size is None else f"{size[0]}x{size[1]}"


SHADOW_MAP_SIDES = (256, 512, 1024, 2048, 4096, 8192)
# The side that turns shadows off: about half a CPU (llvmpipe) frame at small sizes (BENCHMARKS.md, "Rendering
# without shadows"), for runs that never meet gym-aloha's images, such as the test suite's. Images then differ
# from gym-aloha's everywhere a shadow falls; it is stored with the data like any other side, so a policy is
# evaluated and deployed without shadows too.
NO_SHADOWS = 0


def check_shadow_map(side: int | None) -> int | None:
    """`side` if it is a shadow-map side the sim takes (a power of two, 256-8192, or `NO_SHADOWS`), None as it is.

    Example:
        >>> check_shadow_map(2048), check_shadow_map(NO_SHADOWS), check_shadow_map(None)
        (2048, 0, None)

    Raises:
        BadValue: any other value.
    """
    if side is not None and side != NO_SHADOWS and side not in SHADOW_MAP_SIDES:
        sides = ", ".join(map(str, SHADOW_MAP_SIDES))
        raise BadValue(f"a shadow map's side is one of {sides}, or {NO_SHADOWS} for no shadows, not {side}")
    return side


def describe_shadow_map(side: int | None) -> str:
    """How frames rendered with shadow maps of `side` (`check_shadow_map`) are described in messages."""
    if side is None:
        return "the default shadow maps for their size"
    return "no shadows" if side == NO_SHADOWS else f"{side}-texel shadow maps"


def rendered_shadow_map(side: int | None, height: int, width: int) -> int:
    """The side a camera of this image size renders with: `side` (`check_shadow_map`), else `shadow_map_size`."""
    return shadow_map_size(height, width) if side is None else side


def shadow_map_size(height: int, width: int) -> int:
    """Side of the shadow maps for an image of this size.

    Each of the scene's three lights renders a shadow map of this side squared every frame; at MuJoCo's 4096 that
    is most of a CPU (llvmpipe) frame for small images. Eight shadow-map texels per image pixel, at least 1024:
    at 48x64 and 96x128 that is 1024, which moves under 0.6% of the pixels by more than 8 levels (shadow edges;
    `benchmarks/render.py`). 480x640, gym-aloha's size, keeps 4096.
    """
    return min(4096, max(1024, 1 << math.ceil(math.log2(8 * max(height, width)))))
