"""How every robotloop service runs: one uvicorn setup for all of them (bucket, capture, trainer, deploy, ui).

Each service's own ``serve(options, settings)`` builds its app and calls :func:`serve_app`, so they share the
port check before the banner, uvicorn's log level and the bound on graceful shutdown.

Example::

    app = create_app(...)
    serve_app(app, "127.0.0.1", 8760, log, "robotloop capture service on http://127.0.0.1:8760")
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from services.ports import require_free_port

# Open requests (robots' long-polls, followed job logs, slow uploads) would otherwise hold shutdown until they end.
GRACEFUL_SHUTDOWN_S = 5


def serve_app(
    app: Any, host: str, port: int, log: logging.Logger, banner: str, on_exit: Callable[[], None] | None = None
) -> None:
    """Serve `app` on `host:port` with uvicorn until interrupted; `banner` is logged once the port is known free.

    `on_exit` runs when the signal to stop arrives, before uvicorn waits for open requests (at most
    `GRACEFUL_SHUTDOWN_S` seconds): the deploy service answers its long-polls there.

    Raises:
        PortInUse: the port cannot be listened on (checked before the banner, so a busy port never looks served).
    """
    import uvicorn  # only when serving: importing a service's options must stay cheap

    from robotloop.output import log_for_service

    require_free_port(host, port)
    log_for_service()
    log.info("%s", banner)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if on_exit is not None:
                on_exit()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S
    )
    Server(config).run()
