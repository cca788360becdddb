"""robotloop's one error model: every error the library raises on purpose is a `RobotloopError`, filed under one
category that says what the caller can do about it.

    RobotloopError            something robotloop refuses or cannot do; the message says what and what to do
    ├── BadInput              the request itself is wrong: fix it (a bad bucket URL, a malformed manifest)
    │   ├── TooLarge          ... because it is over a size limit
    │   └── Unprocessable     ... because what it says fails its checks (a batch, a manifest, an episode)
    ├── NotFound              what it names does not exist (a bucket, a file, a job, a robot)
    ├── Conflict              it clashes with what exists (a bucket or a release of that name)
    ├── Refused               who asks may not (no or unknown token, no permission, a bad signature or hash)
    └── Unavailable           a server or a dependency cannot serve it now (unreachable, not started)
        └── Busy              ... because a queue or a limit is full: try again later

`BadValue` (a BadInput and a ValueError) and `MissingFile` (a NotFound and a FileNotFoundError) are for the many
places that raised the built-in before.

A library error names its category as its first base; a family base (`BucketError`, `CasError`, ...) comes next,
and a built-in that callers caught before (`ValueError`, `KeyError`, `FileNotFoundError`) stays as a last base so
that nothing that worked breaks:

    ```python
    class BucketNotFound(NotFound, BucketError): ...
    class BadBucketUrl(BadInput, ValueError): ...
    ```

The front ends map categories to what they answer, each in one place: the CLI to exit codes
(`EXIT_CODES` in `robotloop/output.py`), the services to HTTP statuses (`CATEGORY_STATUS` here, which
`services.errors.HTTP_STATUS` extends with the few classes whose status an API fixed before the categories), the
agent's tools to an error result. They catch `RobotloopError` only: anything else is a bug and shows its traceback.
The service clients read a refusal's status back into its category (`category_of_status`), so a 404 from a service
is a `NotFound` on the caller's side too, and an unreachable service is `Unavailable`.

    ```python
    >>> from robotloop.storage import BucketUrl
    >>> try:
    ...     BucketUrl.parse("s3://nope")
    ... except RobotloopError as error:
    ...     print(category(error).__name__)
    BadInput
    ```
"""

from __future__ import annotations

from collections.abc import Mapping


class RobotloopError(Exception):
    """Root of every error robotloop raises on purpose; front ends catch this one, and only this one."""


class BadInput(RobotloopError):
    """The request is wrong in itself (a name, a URL, a file's contents, an option): fixing it is the way out."""


class TooLarge(BadInput):
    """The request is over a size or count limit."""


class Unprocessable(BadInput):
    """The request is well-formed but what it says cannot be accepted: it fails its checks."""


class NotFound(RobotloopError):
    """What the request names does not exist, or the caller cannot see it."""


class Conflict(RobotloopError):
    """The request clashes with something that exists (a name taken, a spec that differs)."""


class Refused(RobotloopError):
    """Who asks may not: no or unknown credentials, no permission, a bad signature, bytes that fail their hash."""


class Unavailable(RobotloopError):
    """A server or a dependency cannot serve the request now: unreachable, not started, missing hardware."""


class Busy(Unavailable):
    """A queue or a limit is full; the same request may succeed later."""


# Two kinds raised where code raised the built-in before: they keep it as a base, so callers (and lerobot) that
# caught ValueError / FileNotFoundError still do.


class BadValue(BadInput, ValueError):
    """An argument or a setting outside what it may be; the message names it and what it may be."""


class MissingFile(NotFound, FileNotFoundError):
    """A local file or folder the request names does not exist."""


CATEGORIES: tuple[type[RobotloopError], ...] = (
    BadInput,
    TooLarge,
    Unprocessable,
    NotFound,
    Conflict,
    Refused,
    Unavailable,
    Busy,
)


# The HTTP status a service answers each category with, and the category a client reads each status back as.
CATEGORY_STATUS: dict[type[RobotloopError], int] = {
    RobotloopError: 500,  # filed under no category: the server failed at something, not the caller
    BadInput: 400,
    TooLarge: 413,
    Unprocessable: 422,
    NotFound: 404,
    Conflict: 409,
    Refused: 403,
    Unavailable: 503,
    Busy: 429,
}

# The statuses services answer besides the categories' (see services/errors.py), read back as the category of the
# errors they answer for; any other 4xx is a BadInput, any other 5xx an Unavailable.
_OTHER_STATUSES: dict[int, type[RobotloopError]] = {
    401: Refused,  # no or unknown token
    410: Unavailable,  # the server's own bytes are damaged
    416: BadInput,  # a range outside the file
    502: Unavailable,  # the service's own storage failed
    504: Unavailable,
}
_STATUS_CATEGORY: dict[int, type[RobotloopError]] = {
    **_OTHER_STATUSES,
    **{status: kind for kind, status in CATEGORY_STATUS.items()},
}


def category_of_status(status: int) -> type[RobotloopError]:
    """The category of a service's refusal with HTTP `status` (>= 400): the inverse of `CATEGORY_STATUS`."""
    return _STATUS_CATEGORY.get(status) or (BadInput if status < 500 else Unavailable)


def category(error: RobotloopError) -> type[RobotloopError]:
    """The most specific category `error` is filed under (RobotloopError itself for an uncategorized one)."""
    return next((kind for kind in type(error).__mro__ if kind in CATEGORIES), RobotloopError)


def lookup[V](error: RobotloopError, table: Mapping[type, V]) -> V:
    """The entry of `table` for the first class of `error`'s MRO it names. Front ends key their tables by category
    (and by a few classes whose answer the wire protocol fixed long ago); the table must name RobotloopError."""
    return next(table[kind] for kind in type(error).__mro__ if kind in table)
