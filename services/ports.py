"""The services' default ports, and a check they make before they print where they serve: is the port free?

The one place the default ports are written: `robotloop.config` (capture.port, trainer.port, deploy.port, ui.port)
and the bucket server's `--port` take them from here, and the options' help texts show them.
"""

from __future__ import annotations

import socket

from robotloop.errors import Conflict

BUCKET_PORT = 8750
CAPTURE_PORT = 8760
TRAINER_PORT = 8770
DEPLOY_PORT = 8780
UI_PORT = 8790


class PortInUse(Conflict, ValueError):
    """The address cannot be listened on (another server holds it, or no such local address)."""


def require_free_port(host: str, port: int) -> None:
    """Bind `host:port` once, as uvicorn will (SO_REUSEADDR), and let it go.

    Without it, a busy port shows the service's banner first and uvicorn's error after it, as if it had started.

    Raises:
        PortInUse: the bind failed; the message says why.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
    except OSError as error:
        raise PortInUse(
            f"cannot listen on {host}:{port}: {error.strerror or error}; another server may be running "
            "there (choose another --port)"
        ) from None
