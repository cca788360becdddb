"""The shared HTTP side of robotloop's service clients (deploy, training, capture): bearer token, JSON in and out, and
the service's own `{"error": ...}` message raised as the client's error type, filed under the category of the
answer's status (`robotloop.errors.category_of_status`): a 404 is a `NotFound`, a 409 a `Conflict`, a service that
cannot be reached (refused, timed out) `Unavailable`. So the CLI prints one line with the category's exit code, and
callers catch either the client's family (`DeployError`) or a category (`NotFound`).

Example:
    ```python
    >>> class TrainerClient(ServiceClient):
    ...     service, section, error = "training service", "trainer", TrainerError
    >>> TrainerClient.from_settings(load_settings())._call("GET", "/v1/jobs/nope")
    TrainerNotFound: training service: no job 'nope' (HTTP 404)
    >>> isinstance(_, TrainerError) and isinstance(_, NotFound)
    True
    ```
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Self

import httpx

from .config import Settings
from .errors import BadInput, RobotloopError, Unavailable, category, category_of_status


class ServiceError(RobotloopError, RuntimeError):
    """A service refused a request or could not be reached; `status` is the HTTP code (0: no answer).

    A family base: what a client raises is `<family>.filed(<category>)`, a subclass that is also the category."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status

    @classmethod
    def filed(cls, kind: type[RobotloopError]) -> type[Self]:
        """`cls` filed under category `kind`: `DeployError.filed(NotFound)` is a NotFound and a DeployError (one
        class per pair, made once)."""
        return _filed(cls, kind)

    def __reduce__(self) -> tuple:
        # The filed classes are made at run time, so pickle (a worker process's error) names family and category.
        family = next(c for c in type(self).__mro__ if issubclass(c, ServiceError) and "_filed_as" not in vars(c))
        return _unpickle, (family, category(self), self.args, self.__dict__)


@functools.cache
def _filed(family: type[ServiceError], kind: type[RobotloopError]) -> type[ServiceError]:
    if issubclass(family, kind):
        return family
    name = family.__name__.removesuffix("Error") + kind.__name__  # DeployNotFound
    doc = f"A {family.__name__} filed under {kind.__name__}."
    return type(name, (kind, family), {"__module__": family.__module__, "__doc__": doc, "_filed_as": kind})


def _unpickle(family: type[ServiceError], kind: type[RobotloopError], args: tuple, state: dict) -> ServiceError:
    error = ServiceError.__new__(family.filed(kind), *args)
    error.args, error.__dict__ = args, state
    return error


class ServiceClient:
    """A JSON client of one service. Subclasses name the service (for messages), their settings section (with
    `url` and `token`), their error type and the hint given when no token is set."""

    service: ClassVar[str] = "service"
    section: ClassVar[str] = ""
    error: ClassVar[type[ServiceError]] = ServiceError
    token_hint: ClassVar[str] = ""

    def __init__(self, url: str, token: str | None, timeout_s: float = 30.0) -> None:
        """Raises: the subclass's error, a BadInput: no token (every route but health needs one)."""
        if not token:
            raise self.error.filed(BadInput)(f"the {self.service} needs a token ({self.token_hint})")
        self.url = url.rstrip("/")
        self.token = token  # a child process given this client's url and token calls as it does
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
            the subclass's error, filed under the category of the answer's status, with the service's own message
            and the HTTP status; Unavailable with status 0 when no answer came (refused, timed out, cut off).
        """
        try:
            extra = {"timeout": timeout_s} if timeout_s is not None else {}
            response = self._http.request(method, path, **kwargs, **extra)
        except httpx.HTTPError as error:
            message = f"cannot reach the {self.service} at {self.url}: {str(error) or type(error).__name__}"
            raise self.error.filed(Unavailable)(message) from None
        if response.status_code >= 400:
            try:
                message = response.json().get("error", response.text)
            except ValueError:
                message = response.text
            raise self._refused(response.status_code, message)
        return response.json()

    def _refused(self, status: int, message: str) -> ServiceError:
        """The error for a refusal: the service's own `message` and the HTTP `status`, filed by the status."""
        return self.error.filed(category_of_status(status))(self._refusal_message(status, message), status)

    def _refusal_message(self, status: int, message: str) -> str:
        return f"{self.service}: {message} (HTTP {status})"
