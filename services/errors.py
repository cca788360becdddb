"""How every robotloop service refuses a request: `{"error": message}` with the status, for robotloop's own errors
(`robotloop.errors`), for FastAPI's validation errors and for Starlette's (unknown route, wrong method), so
clients read one shape.

`HTTP_STATUS` is the one place a robotloop error becomes an HTTP status: a category maps to its status
(`robotloop.errors.CATEGORY_STATUS`, which the service clients read back), and the few classes listed after the
categories keep the status their API has answered with since before the categories (the Hub's clients and the
robots read them). An error takes the entry of the first class of its MRO the table names.

Example:
    ```python
    >>> http_status(BucketNotFound("bucket 'lab/x' not found"))
    404
    >>> json_errors(app)  # every FastAPI app of services/, once
    ```
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from robotloop.auth import Unauthorized
from robotloop.deploy.keys import BadSignature
from robotloop.errors import CATEGORY_STATUS, RobotloopError, lookup
from robotloop.storage.client import StorageError
from robotloop.storage.server.cas import DamagedXorb, RangeNotSatisfiable

HTTP_STATUS: dict[type[RobotloopError], int] = {
    **CATEGORY_STATUS,  # the categories' (robotloop/errors.py: the service clients read them back)
    # Classes whose status their API fixed first (robotloop/errors.py reads these statuses back too):
    Unauthorized: 401,  # 401 is what makes a client ask for a token; 403 means the token it has is not enough
    BadSignature: 422,  # an untrusted manifest is content the deploy service cannot accept, not a missing right
    RangeNotSatisfiable: 416,
    # The server's own bytes are bad: never sent, and said so. Not a 5xx: clients retry those for minutes, and the
    # bytes will not come back by waiting; 410 ends the read at once with the message.
    DamagedXorb: 410,
    # A service that stores into a bucket server (capture) reports that server's failure as a bad gateway, whatever
    # the storage error's category: the caller's request was fine.
    StorageError: 502,
}


def http_status(error: RobotloopError) -> int:
    """The status a service answers `error` with."""
    return lookup(error, HTTP_STATUS)


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def json_errors(
    app: FastAPI, validation_status: int = 422, respond: Callable[..., JSONResponse] = error_response
) -> None:
    """Install the handlers: RobotloopError by `HTTP_STATUS`, FastAPI's validation errors as `validation_status`,
    Starlette's HTTPException as its own status. `respond(status, message, headers=...)` builds the answer (the
    bucket server's adds the Hub's X-Error-Message header). Anything else is a bug: a 500, with its traceback in the
    log."""

    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        return respond(err.status_code, str(err.detail), headers=err.headers)

    async def bad_request(request: Request, err: RequestValidationError) -> JSONResponse:
        where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()[:5])
        return respond(validation_status, f"bad request: {where}")

    async def refusal(request: Request, err: RobotloopError) -> JSONResponse:
        return respond(http_status(err), str(err))

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, bad_request)
    app.add_exception_handler(RobotloopError, refusal)
