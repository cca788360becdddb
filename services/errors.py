"""How every robotloop service refuses a request: `{"error": message}` with the status, for its own errors, for
FastAPI's validation errors and for Starlette's (unknown route, wrong method), so clients read one shape."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def json_errors(
    app: FastAPI,
    statuses: dict[type[Exception], int | None],
    validation_status: int = 422,
    respond: Callable[..., JSONResponse] = error_response,
) -> None:
    """Install the handlers. `statuses` maps the service's exception types to their HTTP status; None takes the
    exception's own `status` attribute (422 when it has none). `respond(status, message, headers=...)` builds
    the answer (the bucket server's adds the Hub's X-Error-Message header)."""

    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        return respond(err.status_code, str(err.detail), headers=err.headers)

    async def bad_request(request: Request, err: RequestValidationError) -> JSONResponse:
        where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()[:5])
        return respond(validation_status, f"bad request: {where}")

    def refusal(status: int | None):
        async def handle(request: Request, err: Exception) -> JSONResponse:
            return respond(status or getattr(err, "status", 422), str(err))

        return handle

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, bad_request)
    for kind, status in statuses.items():
        app.add_exception_handler(kind, refusal(status))
