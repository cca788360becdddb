"""The capture service: robots stream episodes over HTTP; the service commits them to bucket datasets."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from services.options import option
from services.ports import CAPTURE_PORT


@dataclasses.dataclass(frozen=True)
class CaptureOptions:
    """Serve until interrupted; episodes are written with the storage token (--token / ROBOTLOOP_STORAGE__TOKEN)."""

    section: ClassVar[str | None] = "capture"  # options left None come from these settings

    host: str | None = option(None, "Listen address. Default: capture.host (127.0.0.1).")
    port: int | None = option(None, f"Port. Default: capture.port ({CAPTURE_PORT}).", min=0, max=65535)
    tokens: Path | None = option(None, "Robot tokens: '<token> write <namespace|*>' per line.")
    idle_timeout_s: float | None = option(
        None,
        "Seconds an open episode may go without a request before it is dropped, never committed (its robot "
        "vanished): its encoder, frames and staging files are freed, the log says so and /v1/stats counts it in "
        "episodes_abandoned; a request body that stops arriving this long is answered 408. "
        "Default: capture.idle_timeout_s (300).",
        min=1,
    )
