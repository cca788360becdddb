"""The dashboard (`robotloop ui`): web pages over the deploy, training and bucket services (see app.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from services.options import option
from services.ports import UI_PORT


@dataclasses.dataclass(frozen=True)
class UiOptions:
    """Serve the dashboard until interrupted. It reads the services with robotloop's settings: deploy.url and
    deploy.token (ROBOTLOOP_DEPLOY__TOKEN), trainer.url and trainer.token (ROBOTLOOP_TRAINER__TOKEN), and the
    storage endpoint and token (--endpoint/--token, ROBOTLOOP_STORAGE__*)."""

    section: ClassVar[str | None] = "ui"  # options left None come from these settings

    host: str | None = option(None, "Listen address. Default: ui.host (127.0.0.1).")
    port: int | None = option(None, f"Port. Default: ui.port ({UI_PORT}).", min=0, max=65535)
    tokens: Path | None = option(
        None, "Viewer tokens: '<token> <read|write> *' per line; write tokens may promote and roll back."
    )
    reports: list[Path] | None = option(
        None,
        "Folder searched for loop reports and evaluations (repeat it), beside those in the runs' buckets. "
        "Default: ui.reports.",
        "--reports",
    )
    namespaces: list[str] | None = option(
        None,
        "Bucket namespace whose buckets the datasets page lists (repeat it). Default: ui.namespaces.",
        "--namespace",
    )
