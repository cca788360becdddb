"""How every entry point (the `robotloop` commands, `python -m robotloop.train`) reports a failure: one red line,
escaped (messages hold URLs like `hf://[<TYPE>/]...` that rich would read as markup), and the exit code of the
error's category (`EXIT_CODES`, the one place they are mapped; the CLI's output module re-exports it beside the
root group that reports them). Exit code 2 stays typer's, for usage errors. Log records and Python warnings, ours
and the libraries', are shown in the same style (`log_to_console`: `warning: ...`, one line each; `--debug` shows
all of them, with tracebacks). The consoles every command prints through (`cli_console`: never wrapped or cut when
piped), and the progress display every long command draws (`progress_bars`), with quieter libraries beside it."""

from __future__ import annotations

import logging
import os
import traceback
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


def cli_console(stderr: bool = False) -> Console:
    """A console for a command's output: a line printed stays one line (a narrow terminal folds it, the text has no
    break), and piped or redirected, tables are not squeezed into rich's default 80 columns either."""
    console = Console(stderr=stderr, soft_wrap=True)
    if not console.is_terminal:
        console.width = 400  # what a table may take before it wraps a cell (never cuts: columns fold instead)
    return console


error_console = cli_console()
# What a person sees besides the command's result: warnings, progress. Errors go with the output (`fail`).
note_console = cli_console(stderr=True)

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
    """Print `error` and return the Exit to raise: `raise fail(error) from None`. With `--debug`, its traceback too."""
    if _debug and isinstance(error, BaseException) and error.__traceback__ is not None:
        note_console.print(escape("".join(traceback.format_exception(error))), end="")
    # soft_wrap: one line whatever the width; a terminal folds it, the text keeps no break.
    error_console.print(f"[red]error:[/red] {escape(prefix + str(error))}", soft_wrap=True)
    return typer.Exit(exit_code(error) if isinstance(error, RobotloopError) else 1)


_debug = False


class ConsoleLog(logging.Handler):
    """Log records as the commands' own lines on stderr: `warning: ...` in yellow, `error: ...` in red, the first line
    of the message only and each distinct line once per process (a library that warns in every worker or every
    call says it once). With `debug`, every record in full, its level and logger named, with its traceback."""

    STYLES = {"WARNING": "yellow", "ERROR": "red", "CRITICAL": "red"}

    def __init__(self, debug: bool = False, level: int = logging.WARNING) -> None:
        super().__init__(logging.DEBUG if debug else level)
        self.debug = debug
        self._seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            level = record.levelname.lower()
            if self.debug:
                line = f"{level} [{record.name}]: {message}"
                if record.exc_info:
                    line += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
            else:
                line = f"{level}: {message.strip().splitlines()[0] if message.strip() else ''}"
                if line in self._seen:
                    return
                self._seen.add(line)
            style = self.STYLES.get(record.levelname)
            note_console.print(f"[{style}]{escape(line)}[/{style}]" if style else escape(line), highlight=False)
        except Exception:  # noqa: BLE001 - logging's own contract: a handler never raises into the caller
            self.handleError(record)


def log_to_console(debug: bool = False, level: int = logging.WARNING) -> None:
    """Every log record and Python warning of this process as `ConsoleLog` lines: from `level` (warnings and
    errors), or with `debug` everything from DEBUG up. Call it before lerobot is imported: its first
    `logging.debug` call would otherwise give the root logger Python's `WARNING:name:message` handler
    (logging.basicConfig), which any root handler prevents. Other handlers (a test's log capture) stay."""
    global _debug
    _debug = debug
    if debug:
        os.environ["ROBOTLOOP_DEBUG"] = "1"  # robotloop.workers.DEBUG_ENV: worker processes log as this one
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, ConsoleLog) or _is_basic_config(h)]:
        root.removeHandler(old)
    root.addHandler(ConsoleLog(debug, level))
    root.setLevel(logging.DEBUG if debug else level)
    if not debug:
        for noisy in ("httpx", "httpcore", "urllib3", "filelock", "fsspec", "PIL", "matplotlib"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        # lerobot's "torchcodec cannot be loaded, falling back to pyav", in every process that imports its dataset
        # code, with torchcodec's 20-line loading traceback: the trainer says it once itself, in one line
        # (robotloop.train.data.resolve_video_backend), and nothing else decodes video.
        logging.getLogger("lerobot.utils.import_utils").setLevel(logging.ERROR)
    logging.captureWarnings(False)
    warnings.showwarning = _show_warning


def _is_basic_config(handler: logging.Handler) -> bool:
    """The handler `logging.basicConfig()` installs (lerobot's first `logging.debug` call does, in a process that
    imported it before `log_to_console`): stderr, Python's `LEVEL:name:message` format."""
    fmt = getattr(handler.formatter, "_fmt", None)
    return type(handler) is logging.StreamHandler and fmt == logging.BASIC_FORMAT


def log_for_service() -> None:
    """A long-running service's log (`robotloop X serve`): one line per record on stderr with its time, level and
    logger, robotloop's and the services' own records from INFO (episodes opened and committed, releases published),
    the libraries' from WARNING."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.WARNING)
    for ours in ("robotloop", "services"):
        logging.getLogger(ours).setLevel(logging.INFO)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ARG001 - its signature
    """A Python warning as a log record of its category, so it reads as every other note (`warning: ...`)."""
    logging.getLogger("py.warnings").warning("%s", message)


QUIET_ENV = {  # `quiet_libraries`' environment defaults, which worker processes inherit (Ray's get them passed)
    "SVT_LOG": "1",  # SVT-AV1's log level, read when an encoder starts: 1 = errors
    "TQDM_DISABLE": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",  # `datasets` bars ignore TQDM_DISABLE
    # ... and with it set, `datasets` warns whenever lerobot re-enables its bars (six lines per recording). A
    # SyntaxWarning is about a library's own source (torchao's, once per worker that compiles it): nothing the user
    # can act on.
    "PYTHONWARNINGS": f"ignore:{PROGRESS_BARS_WARNING}:UserWarning,ignore::SyntaxWarning",
}


def quiet_libraries() -> None:
    """The entry points draw their own progress with rich: keep the libraries' own bars and notes out of their
    output (the tqdm bars lerobot's writer draws for every episode, `Map`, `Validate all meta data`; SVT-AV1's
    banner, about 25 lines per episode, errors still show). Environment defaults, so sim worker processes inherit
    them; variables the user set win. Call it before anything imports tqdm, which reads TQDM_* when imported."""
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    warnings.filterwarnings("ignore", message=PROGRESS_BARS_WARNING, category=UserWarning)
    warnings.filterwarnings("ignore", category=SyntaxWarning)


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
