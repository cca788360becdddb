"""How every robotloop service runs: one uvicorn setup for all of them (bucket, capture, trainer, deploy, ui).

Each service's own ``serve(options, settings)`` builds its app and calls :func:`serve_app`, so they share the
port check before the banner, uvicorn's log level, the bounds on graceful shutdown, idle and open connections.

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
# How long an idle connection stays open: longer than clients keep theirs (httpx drops an idle connection after 5 s).
# Were it uvicorn's default 5 s too, a server closing a connection as a client reuses it resets that request, the
# likelier the busier its loop (an operator's promote was reset with 1,000 robots on one deploy service).
KEEP_ALIVE_S = 30
# File descriptors kept back from connections: the database, the log, the files and sockets a request opens.
RESERVED_FILES = 128


def raise_open_files_limit() -> int | None:
    """Raise this process's soft limit on open files to its hard limit; the soft limit now (None: no such limit).

    Each robot holds a connection or two (its long-poll, its heartbeat), and a soft limit of 1,024, many systems'
    default, is what a deploy service with 1,000 robots ran out of: asyncio's accept then fails with "Too many open
    files", logs a traceback each time, and new connections wait in the listen queue (BENCHMARKS.md, issue 31).
    """
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # e.g. macOS caps the soft limit below a large hard one: keep what we have
            pass
    return None if soft == resource.RLIM_INFINITY else soft


def connection_limit(open_files: int | None) -> int | None:
    """Connections served at once under this many open files (None: no limit); past it uvicorn answers 503 and
    closes, a status robots retry after, instead of running out of descriptors."""
    return None if open_files is None else max(16, open_files - RESERVED_FILES)


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
    open_files = raise_open_files_limit()
    limit = connection_limit(open_files)
    log.info("open files limit %s: at most %s connections at once, 503 past them", open_files, limit)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if on_exit is not None:
                on_exit()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        timeout_keep_alive=KEEP_ALIVE_S,
        limit_concurrency=limit,
    )
    Server(config).run()
