"""How every entry point (the `robotloop` commands, `python -m robotloop.train`) reports a failure: one red line,
escaped (messages hold URLs like `hf://[<TYPE>/]...` that rich would read as markup), and the exit code of the
error's category (`EXIT_CODES`, the one place they are mapped; the CLI's output module re-exports it beside the
root group that reports them). Exit code 2 stays typer's, for usage errors. And the progress display every long
command draws (`progress_bars`), with quieter libraries beside it."""

from __future__ import annotations

import os
import warnings

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .errors import (
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

PROGRESS_BARS_WARNING = "Cannot enable progress bars"  # `datasets`, each time lerobot asks for bars it turned off


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
    # soft_wrap: one line whatever the width (rich wraps at 80 columns where stdout is no terminal: logs, pipes).
    error_console.print(f"[red]error:[/red] {escape(prefix + str(error))}", soft_wrap=True)
    return typer.Exit(exit_code(error) if isinstance(error, RobotloopError) else 1)


def quiet_libraries() -> None:
    """The entry points draw their own progress with rich: keep the libraries' own bars and notes out of their
    output (the tqdm bars lerobot's writer draws for every episode, `Map`, `Validate all meta data`; SVT-AV1's
    banner, about 25 lines per episode, errors still show). Environment defaults, so sim worker processes inherit
    them; variables the user set win. Call it before anything imports tqdm, which reads TQDM_* when imported."""
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's log level, read when an encoder starts: 1 = errors
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # `datasets` bars ignore TQDM_DISABLE
    # ... and with it set, `datasets` warns whenever lerobot re-enables its bars (six lines per recording).
    os.environ.setdefault("PYTHONWARNINGS", f"ignore:{PROGRESS_BARS_WARNING}:UserWarning")  # worker processes
    warnings.filterwarnings("ignore", message=PROGRESS_BARS_WARNING, category=UserWarning)


def quiet_encoders() -> None:
    """For entry points that encode video (the recording commands, the capture service): ffmpeg's own notes too
    ("moving the moov atom to the beginning of the file" each time lerobot concatenates an episode's video onto
    the dataset's), on top of `quiet_libraries`."""
    import av

    quiet_libraries()
    av.logging.set_libav_level(av.logging.ERROR)  # ffmpeg's own level: lerobot hands logging back to ffmpeg


def progress_bars(out: Console, title: str, eta: bool = False) -> Progress:
    """The progress display of a long command: `title` (a rich column template, "{task.description}" for the
    task's own), a bar, done of total, the time elapsed (or with `eta` the time left), and the task's `note` field."""
    clock = TimeRemainingColumn() if eta else TimeElapsedColumn()
    return Progress(
        TextColumn(title), BarColumn(), MofNCompleteColumn(), clock, TextColumn("{task.fields[note]}"), console=out
    )
