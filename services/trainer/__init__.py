"""The training service: jobs run `robotloop train` as subprocesses; clients submit, watch and cancel them over HTTP."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from services.options import option
from services.ports import TRAINER_PORT


@dataclasses.dataclass(frozen=True)
class TrainerOptions:
    """Serve until interrupted; jobs use the storage endpoint and token (--endpoint/--token, ROBOTLOOP_STORAGE__*)."""

    section: ClassVar[str | None] = "trainer"  # options left None come from these settings

    host: str | None = option(None, "Listen address. Default: trainer.host (127.0.0.1).")
    port: int | None = option(None, f"Port. Default: trainer.port ({TRAINER_PORT}).", min=0, max=65535)
    tokens: Path | None = option(None, "Caller tokens: '<token> <read|write> <namespace|*>' per line.")
    root: Path | None = option(None, "Job directories (log, progress). Default: trainer.root.")
