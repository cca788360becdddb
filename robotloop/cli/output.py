"""How every command reports a failure: one red line, escaped (messages hold URLs like `hf://[<TYPE>/]...` that
rich would read as markup), and exit code 1. Exit code 2 stays typer's, for usage errors."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from ..quiet import quiet_encoders

__all__ = ["fail", "quiet_encoders"]

error_console = Console()


def fail(error: Exception | str, prefix: str = "") -> typer.Exit:
    """Print `error` and return the Exit to raise: `raise fail(error) from None`."""
    error_console.print(f"[red]error:[/red] {escape(prefix + str(error))}")
    return typer.Exit(1)
