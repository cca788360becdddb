"""Request-size limit shared by the services: a body over the limit is refused before any handler (or token
check) reads it, so an unauthenticated caller cannot make a service buffer and parse gigabytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.responses import Response

from services.errors import error_response


class BodyLimit:
    """ASGI middleware: refuse request bodies over ``max_bytes`` with 413 (declared or streamed).

    ``respond(status, message)`` builds the refusal (default: ``{"error": message}``).
    """

    def __init__(self, app: Any, max_bytes: int, respond: Callable[[int, str], Response] = error_response) -> None:
        self.app, self.max_bytes, self.respond = app, max_bytes, respond

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(scope, receive, send)
        seen = 0

        async def limited_receive() -> dict:
            nonlocal seen
            message = await receive()
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
