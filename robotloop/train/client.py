"""HTTP client of the training service (services/trainer): submit jobs, read their state, wait, cancel. JSON only.

Used by `robotloop trainer watch`, the agent's training tools and the dashboard (`robotloop ui`).

Example:
    ```python
    >>> trainer = TrainerClient("http://127.0.0.1:8770", token="trainer-write-token")
    >>> job = trainer.submit({"datasets": ["hf://buckets/lab/demos/datasets/cube"],
    ...                       "output": "hf://buckets/lab/demos/models/run1", "steps": 500})
    >>> trainer.wait(job["id"], timeout_s=60)["status"]
    'running'
    ```
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..service_client import ServiceClient, ServiceError
from .jobs import FINISHED


class TrainerError(ServiceError):
    """The training service refused a request or could not be reached; `status` is the HTTP code (0: no answer)."""


class TrainerClient(ServiceClient):
    """Callers of the training service: `TrainerClient.from_settings(settings)` (trainer.url, trainer.token)."""

    service, section, error = "training service", "trainer", TrainerError
    # Every caller reads trainer.token: the dashboard and the agent have no flag for it, the commands add one.
    token_hint = "ROBOTLOOP_TRAINER__TOKEN or trainer.token in robotloop.toml; commands also take --trainer-token"

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Submit a job (a `robotloop.train.jobs.JobSpec` as JSON); answers its state, with its "id".

        Raises:
            TrainerError: a bad spec (422), a token that may not write the output's namespace (403), ...
        """
        return self._call("POST", "/v1/jobs", json=spec)

    def job(self, job_id: str) -> dict[str, Any]:
        """The job's state: status, step, loss, samples_per_s, data_wait_share, last_checkpoint, message, spec."""
        return self._call("GET", f"/v1/jobs/{job_id}")

    def jobs(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/jobs")["jobs"]

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Stop a job; a running one writes a checkpoint first."""
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def log(self, job_id: str, offset: int = 0) -> tuple[str, int]:
        """The job's log from byte `offset` (64 KiB at most) and the offset to continue from."""
        page = self._call("GET", f"/v1/jobs/{job_id}/log", params={"offset": offset})
        return page["text"], page["next_offset"]

    def progress(self, job_id: str, after_step: int = -1) -> list[dict[str, Any]]:
        """The job's progress reports past `after_step` (step, loss, samples_per_s, data_wait_share, ...), oldest
        first, a page (5000) at a time: ask again after the last step answered for the next page."""
        return self._call("GET", f"/v1/jobs/{job_id}/progress", params={"after": after_step})["points"]

    def wait(
        self,
        job_id: str,
        timeout_s: float | None = None,
        every_s: float = 1.0,
        on_state: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll the job until it has finished or `timeout_s` passed (None: no limit); answers the last state.

        `on_state` sees every state polled (progress bars).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            state = self.job(job_id)
            if on_state is not None:
                on_state(state)
            if state["status"] in FINISHED or (deadline is not None and time.monotonic() + every_s > deadline):
                return state
            time.sleep(every_s)
