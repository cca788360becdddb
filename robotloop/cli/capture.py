"""`robotloop capture serve`: the capture service, for robots that do not run the recorder themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ..config import Settings, load_settings
from .output import quiet_encoders

app = typer.Typer(no_args_is_help=True, help="The capture service: robots stream episodes, it commits them to buckets.")
console = Console()


@app.command()
def serve(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Listen address. Default: capture.host (127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(min=0, max=65535, help="Port. Default: capture.port (8760).")] = None,
    tokens: Annotated[Path | None, typer.Option(help="Robot tokens: '<token> write <namespace|*>' per line.")] = None,
) -> None:
    """Serve until interrupted; episodes are written with the storage token (--token / ROBOTLOOP_STORAGE__TOKEN)."""
    from services.capture.app import serve as run  # the service pulls in FastAPI/uvicorn: only when serving

    settings: Settings = ctx.obj or load_settings()  # set by the `robotloop` callback (--endpoint, --token)
    quiet_encoders()
    run(settings, tokens, host, port)
