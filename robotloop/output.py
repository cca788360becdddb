"""How every entry point (the `robotloop` commands, `python -m robotloop.train`) reports a failure: one red line,
escaped (messages hold URLs like `hf://[<TYPE>/]...` that rich would read as markup), and exit code 1. Exit code 2
stays typer's, for usage errors. And quieter libraries, for the entry points that draw their own progress."""

from __future__ import annotations

import os
import warnings

import typer
from rich.console import Console
from rich.markup import escape

error_console = Console()

PROGRESS_BARS_WARNING = "Cannot enable progress bars"  # `datasets`, each time lerobot asks for bars it turned off


def fail(error: Exception | str, prefix: str = "") -> typer.Exit:
    """Print `error` and return the Exit to raise: `raise fail(error) from None`."""
    error_console.print(f"[red]error:[/red] {escape(prefix + str(error))}")
    return typer.Exit(1)


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
