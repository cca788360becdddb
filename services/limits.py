"""Request-size limit shared by the services: a body over the limit is refused before any handler (or token
check) reads it, so an unauthenticated caller cannot make a service buffer and parse gigabytes. A body may also be
given a stall limit: a client that stops sending mid-body (gone without closing its connection) is answered 408
instead of holding the request, and what it sent, for as long as the connection lives."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi.responses import Response
from starlette.exceptions import HTTPException

from services.errors import error_response


class BodyLimit:
    """ASGI middleware: refuse request bodies over ``max_bytes`` with 413 (declared or streamed), and, with
    ``stall_s``, bodies of which no byte arrived for ``stall_s`` seconds with 408 (the connection is closed then).

    ``respond(status, message)`` builds the 413 (default: ``{"error": message}``); the 408 is the app's to answer
    (`BodyStalled` is an HTTPException).
    """

    def __init__(
        self,
        app: Any,
        max_bytes: int,
        respond: Callable[[int, str], Response] = error_response,
        stall_s: float | None = None,
    ) -> None:
        self.app, self.max_bytes, self.respond, self.stall_s = app, max_bytes, respond, stall_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(scope, receive, send)
        seen, body_done = 0, False

        async def limited_receive() -> dict:
            nonlocal seen, body_done
            if body_done or self.stall_s is None:  # after the body, receive() waits for the disconnect: no limit
                message = await receive()
            else:
                try:
                    message = await asyncio.wait_for(receive(), self.stall_s)
                except TimeoutError:
                    raise BodyStalled(self.stall_s) from None
            body_done = body_done or not message.get("more_body", False)
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # chunked upload without Content-Length
                raise _BodyTooLarge
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _BodyTooLarge:
            await self._too_large(scope, receive, send)

    async def _too_large(self, scope: dict, receive: Any, send: Any) -> None:
        response = self.respond(413, f"request body over the server limit of {self.max_bytes} bytes")
        await response(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


class BodyStalled(HTTPException):
    """No byte of a request body arrived for the stall limit: answered 408 by the app's HTTPException handler (so
    also where FastAPI reads a JSON body, which turns other errors into a 400), and the connection closed."""

    def __init__(self, stall_s: float) -> None:
        message = f"no byte of the request body arrived for {stall_s:g} s; send a request's body without pausing"
        super().__init__(408, message, headers={"connection": "close"})  # the rest of the body is never read
