"""The shared HTTP side of robotloop's service clients (deploy, training, capture): bearer token, JSON in and out, and
the service's own `{"error": ...}` message raised as the client's error type.

Example:
    ```python
    >>> class TrainerClient(ServiceClient):
    ...     service, section, error = "training service", "trainer", TrainerError
    >>> TrainerClient.from_settings(load_settings())._call("GET", "/v1/jobs")
    ```
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

import httpx

from .config import Settings
from .errors import RobotloopError


class ServiceError(RobotloopError, RuntimeError):
    """A service refused a request or could not be reached; `status` is the HTTP code (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class ServiceClient:
    """A JSON client of one service. Subclasses name the service (for messages), their settings section (with
    `url` and `token`), their error type and the hint given when no token is set."""

    service: ClassVar[str] = "service"
    section: ClassVar[str] = ""
    error: ClassVar[type[ServiceError]] = ServiceError
    token_hint: ClassVar[str] = ""

    def __init__(self, url: str, token: str | None, timeout_s: float = 30.0) -> None:
        """Raises: the subclass's error: no token (every route but health needs one)."""
        if not token:
            raise self.error(f"the {self.service} needs a token ({self.token_hint})")
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {token}"}, timeout=timeout_s)

    @classmethod
    def from_settings(cls, settings: Settings, url: str | None = None, token: str | None = None) -> Self:
        """The client of the service's settings section (its `url` and `token`); `url` / `token` given here win.

        Raises:
            the subclass's error: no token anywhere.
        """
        cfg = getattr(settings, cls.section)
        return cls(url or cfg.client_url, token or (cfg.token.get_secret_value() if cfg.token else None))

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, timeout_s: float | None = None, **kwargs: Any) -> dict[str, Any]:
        """One request; the JSON answer.

        Raises:
            the subclass's error, with the service's own message and the HTTP status (0: no answer).
        """
        try:
            extra = {"timeout": timeout_s} if timeout_s is not None else {}
            response = self._http.request(method, path, **kwargs, **extra)
        except httpx.HTTPError as error:
            raise self.error(f"cannot reach the {self.service} at {self.url}: {error}") from None
        if response.status_code >= 400:
            try:
                message = response.json().get("error", response.text)
            except ValueError:
                message = response.text
            raise self._refused(response.status_code, message)
        return response.json()

    def _refused(self, status: int, message: str) -> ServiceError:
        """The error for a refusal: the service's own `message` and the HTTP `status`."""
        return self.error(f"{self.service}: {message} (HTTP {status})", status)
