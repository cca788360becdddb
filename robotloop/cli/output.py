"""How every command reports a failure: one red line, escaped (messages hold URLs like `hf://[<TYPE>/]...` that
rich would read as markup), and the exit code of the error's category (`EXIT_CODES`). Exit code 2 stays typer's,
for usage errors.

The root command group (`ReportErrors`) turns any `RobotloopError` a command lets through into that line, so a
command catches an error only to say more than its message. Any other exception is a bug and shows its
traceback."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from ..errors import (
    BadInput,
    Busy,
    Conflict,
    NotFound,
    Refused,
    RobotloopError,
    TooLarge,
    Unavailable,
    Unprocessable,
    lookup,
)

error_console = Console()

# One code for every category today: scripts (and the suite) read 1 as "robotloop said no; the line says why", and
# 2 is typer's usage error, caught before the command ran. A category that needs its own code gets it here.
EXIT_CODES: dict[type[RobotloopError], int] = {
    RobotloopError: 1,
    BadInput: 1,
    TooLarge: 1,
    Unprocessable: 1,
    NotFound: 1,
    Conflict: 1,
    Refused: 1,
    Unavailable: 1,
    Busy: 1,
}


def exit_code(error: RobotloopError) -> int:
    """The exit code a command ends with when `error` stops it."""
    return lookup(error, EXIT_CODES)


def fail(error: Exception | str, prefix: str = "") -> typer.Exit:
    """Print `error` and return the Exit to raise: `raise fail(error) from None`."""
    error_console.print(f"[red]error:[/red] {escape(prefix + str(error))}")
    return typer.Exit(exit_code(error) if isinstance(error, RobotloopError) else 1)


class ReportErrors(TyperGroup):
    """The root group: a RobotloopError from any command (or the settings callback) ends it with `fail`."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except RobotloopError as error:
            raise fail(error) from None


def quiet_encoders() -> None:
    """Keep what video encoding prints about itself out of a command's output: SVT-AV1's banner and notes (about
    25 lines per episode; errors still show) and the tqdm bars lerobot's writer draws for every episode (`Map`,
    `Validate all meta data`). Variables the user set win. For commands that record; process-wide, so the CLI's
    choice, not the library's (the commands draw their own progress with rich)."""
    import os

    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's log level, read when an encoder starts: 1 = errors
    os.environ.setdefault("TQDM_DISABLE", "1")  # read by every tqdm bar as it is made
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # `datasets` bars ignore TQDM_DISABLE
