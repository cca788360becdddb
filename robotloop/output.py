"""How every entry point (the `robotloop` commands, `python -m robotloop.train`) reports a failure: one red line,
escaped (messages hold URLs like `hf://[<TYPE>/]...` that rich would read as markup), and exit code 1. Exit code 2
stays typer's, for usage errors. And quieter video encoding, for the entry points that record."""

from __future__ import annotations

import os

import typer
from rich.console import Console
from rich.markup import escape

error_console = Console()


def fail(error: Exception | str, prefix: str = "") -> typer.Exit:
    """Print `error` and return the Exit to raise: `raise fail(error) from None`."""
    error_console.print(f"[red]error:[/red] {escape(prefix + str(error))}")
    return typer.Exit(1)


def quiet_encoders() -> None:
    """Keep what video encoding prints about itself out of a command's output: SVT-AV1's banner and notes (about
    25 lines per episode; errors still show) and the tqdm bars lerobot's writer draws for every episode (`Map`,
    `Validate all meta data`). Variables the user set win. For entry points that record (the recording commands,
    the capture service); process-wide, so the entry point's choice, not the library's (the commands draw their own
    progress with rich)."""
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's log level, read when an encoder starts: 1 = errors
    os.environ.setdefault("TQDM_DISABLE", "1")  # read by every tqdm bar as it is made
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # `datasets` bars ignore TQDM_DISABLE
