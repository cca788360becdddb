"""The names of a LeRobot frame's features, in one place for every layer.

They are lerobot's own (`lerobot.utils.constants`: OBS_STATE, OBS_IMAGES, ACTION, REWARD, SUCCESS), written out
here because the robot's torch-free install (`robotloop[robot]`, the ONNX runner) has no lerobot to import them from;
`tests/test_features.py` checks that they still agree. The last two are a fleet dataset's own (the fleet schema:
who drove each frame, and what the policy would have done).

Example:
    ```python
    >>> image_key("top")
    'observation.images.top'
    >>> camera_of("observation.images.top"), camera_of("observation.state")
    ('top', None)
    ```
"""

from __future__ import annotations

STATE_KEY = "observation.state"
IMAGE_PREFIX = "observation.images."
ACTION_KEY = "action"
REWARD_KEY = "next.reward"
SUCCESS_KEY = "next.success"
INTERVENTION_KEY = "intervention"  # bool per frame: the expert drove it (a takeover, a re-demonstration)
POLICY_ACTION_KEY = "policy_action"  # what the policy chose at the frame, whoever drove


def image_key(camera: str) -> str:
    """The feature that holds camera `camera`'s frames."""
    return IMAGE_PREFIX + camera


def camera_of(key: str) -> str | None:
    """The camera a feature holds, or None for a feature that is not a camera's."""
    return key.removeprefix(IMAGE_PREFIX) if key.startswith(IMAGE_PREFIX) else None
