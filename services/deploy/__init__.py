"""The robotloop deploy service (see app.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from services.options import option
from services.ports import DEPLOY_PORT

TRUSTED_HELP = (
    "Accept only releases signed by these public keys (robots check regardless). Default: deploy.trusted_keys."
)


@dataclasses.dataclass(frozen=True)
class DeployOptions:
    """Serve the deploy service until interrupted."""

    section: ClassVar[str | None] = "deploy"  # options left None come from these settings

    host: str | None = option(None, "Listen address. Default: deploy.host (127.0.0.1).")
    port: int | None = option(None, f"Port. Default: deploy.port ({DEPLOY_PORT}).", min=0, max=65535)
    tokens: Path | None = option(None, "Operator tokens: '<token> <read|write> *' per line.")
    db: Path | None = option(None, "SQLite state. Default: deploy.db.")
    database: str | None = option(
        None,
        "The state in PostgreSQL instead, shared by every replica given the same URL: "
        "postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME. Default: deploy.database (none: SQLite, --db).",
    )
    trusted_keys: list[Path] | None = option(None, TRUSTED_HELP, "--trusted-key")
    allow_any_signer: bool | None = option(
        None,
        "Without --trusted-key: register releases signed by any key (robots still verify). "
        "Default: refuse to start without trusted keys.",
        "--allow-any-signer",
    )
