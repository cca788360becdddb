"""A robot's side of the capture service: open an episode, send frame batches, close it.

Example:
    ```python
    >>> capture = CaptureClient("http://capture.lab:8760", token="robot-7-token")
    >>> eid = capture.open("hf://buckets/lab/demos/datasets/cube", {"top": (480, 640, 3)}, state_dim=14, action_dim=14)
    >>> capture.send_frames(eid, timestamp=t, state=q, action=a, images={"top": frames})   # any number of times
    >>> capture.close(eid, task="pick up the cube")["episode_index"]
    ```

A fleet dataset (`DatasetSpec(fleet=True)`, what `FleetRecorder` writes in-process): each frame also says whether
the expert drove and what the policy proposed, and the close gives the episode's facts; the service adds what the
frames say (success, max_reward, frames, expert_frames, kind) to its line of `meta/fleet_episodes.jsonl`:

    ```python
    >>> eid = capture.open("hf://buckets/lab/fleet/datasets/cube", {"top": (480, 640, 3)}, 14, 14, fleet=True)
    >>> capture.send_frames(eid, timestamp=t, state=q, action=a, images={"top": frames}, reward=r, success=s,
    ...                     intervention=expert_drove, policy_action=proposed)
    >>> capture.close(eid, "pick up the cube", facts={"robot_id": "r1", "release": "v7", "seed": 12})
    ```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import numpy as np
from numpy.typing import ArrayLike

from ..service_client import ServiceClient, ServiceError
from .sessions import Fact, encode_frames


class CaptureError(ServiceError):
    """The service refused a request, or could not be reached; `status` is the HTTP status (0: no answer), `message`
    the service's own explanation."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(f"capture service answered {status}: {message}" if status else message, status)
        self.message = message


class CaptureClient(ServiceClient):
    """Talks to one capture service with one robot token (robots name both: there is no settings section)."""

    service, error = "capture service", CaptureError
    token_hint = "a robot token from the service's tokens file"

    def __init__(self, url: str, token: str, timeout_s: float = 300.0) -> None:
        """Raises: CaptureError: no token."""
        # The close encodes and uploads the whole episode before it answers: hence the long default timeout.
        super().__init__(url, token, timeout_s)

    @property
    def http(self) -> httpx.Client:
        """The underlying HTTP client (bearer token set)."""
        return self._http

    def open(
        self,
        dataset: str,
        cameras: dict[str, tuple[int, int, int]],
        state_dim: int,
        action_dim: int,
        fps: int = 50,
        robot_type: str | None = None,
        fleet: bool = False,
        shadow_map: int | None = None,
    ) -> str:
        """Open an episode in the dataset at `dataset` (an hf://buckets/... URL); returns its id. `fleet`: a fleet
        dataset (its frames also have `intervention` and `policy_action`; its episodes, facts). `shadow_map`: a
        sim's cameras render with shadow maps of this side (None: gym-aloha's for the frame size).

        Raises:
            CaptureError: refused (bad URL or shapes 400/422, token 401/403, other features 409, a fleet dataset
                opened without `fleet` or the reverse 409, too many open 429).
        """
        body = {
            "dataset": dataset,
            "cameras": {k: list(v) for k, v in cameras.items()},
            "state_dim": state_dim,
            "action_dim": action_dim,
            "fps": fps,
            "robot_type": robot_type,
            "fleet": fleet,
        }
        if shadow_map is not None:  # absent, not null: a service from before the field takes the request as it was
            body["shadow_map"] = shadow_map
        return self._call("POST", "/v1/episodes", json=body)["episode_id"]

    def send_frames(
        self,
        episode_id: str,
        timestamp: ArrayLike,
        state: ArrayLike,
        action: ArrayLike,
        images: dict[str, np.ndarray],
        reward: ArrayLike | None = None,
        success: ArrayLike | None = None,
        intervention: ArrayLike | None = None,
        policy_action: ArrayLike | None = None,
    ) -> int:
        """Send N frames (timestamps in seconds from the episode start); returns the episode's frame count. A fleet
        episode's frames also need `intervention` (N bools: the expert drove) and `policy_action` (N x action_dim:
        what the policy proposed); a demo episode's have neither.

        Raises:
            CaptureError: refused (bad frames 422, a fleet column missing or sent to a demo episode 422, unknown
                episode 404, too large 413); the episode is unchanged.
        """
        body = encode_frames(timestamp, state, action, images, reward, success, intervention, policy_action)
        return self.send_raw(episode_id, body)["frames"]

    def send_raw(self, episode_id: str, body: bytes) -> dict[str, Any]:
        """Send an already encoded frame batch (see `robotloop.capture.sessions` for the format)."""
        headers = {"content-type": "application/octet-stream"}
        return self._call("POST", f"/v1/episodes/{episode_id}/frames", content=body, headers=headers)

    def close(self, episode_id: str, task: str, facts: Mapping[str, Fact] | None = None) -> dict[str, Any]:
        """Commit the episode; returns the commit report (episode_index, frames, bytes_sent, ...). `facts`: a fleet
        episode's (its robot, release, seed...: names to flat JSON values), written with the task and what its
        frames say as its line of `meta/fleet_episodes.jsonl`.

        Raises:
            CaptureError: refused or the commit failed. A bad task or facts (400/422: facts for a demo episode, or
                naming what the service counts), an episode with no frames, or a failed upload leave the episode
                open on the service (close it again, or `abort` it); an episode the recorder refuses (features that
                do not fit the dataset) is dropped.
        """
        body: dict[str, Any] = {"task": task}
        if facts is not None:
            body["facts"] = dict(facts)
        return self._call("POST", f"/v1/episodes/{episode_id}/close", json=body)

    def abort(self, episode_id: str) -> None:
        """Drop an open episode without committing it."""
        self._call("DELETE", f"/v1/episodes/{episode_id}")

    def health(self) -> dict[str, Any]:
        """``{"status": "ok", "open_episodes": n}``.

        Raises:
            CaptureError: the service cannot be reached (status 0), as for every call.
        """
        return self._call("GET", "/v1/health")

    def _refusal_message(self, status: int, message: str) -> str:
        return message  # alone: robots' operators read it as the service wrote it (CaptureError adds the status)

    def __enter__(self) -> CaptureClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()  # not `close`: here that commits an episode
