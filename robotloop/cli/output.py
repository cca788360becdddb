"""How every command reports: failures (see `robotloop.output`, which `python -m robotloop.train` shares: one red
line and the exit code of the error's category, `EXIT_CODES`), and results as text for people or, with --json,
JSON for scripts.

The root command group (`ReportErrors`) turns any `RobotloopError` a command lets through into that line, so a
command catches an error only to say more than its message. Any other exception is a bug and shows its
traceback."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from typing import Annotated, Any

import typer
import typer.rich_utils
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from typer.core import TyperGroup

from ..errors import RobotloopError
from ..output import (
    EXIT_CODES,
    cli_console,
    error_console,
    exit_code,
    fail,
    log_to_console,
    note_console,
    progress_bars,
    quiet_encoders,
    quiet_libraries,
)

console = cli_console()

# click's UsageError, whichever click typer runs on: its own copy since typer 0.29, click itself before (the GPU
# image has 0.27); both raise it for a bad option or an unknown command, and BadParameter derives from it.
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")

JsonOutput = Annotated[bool, typer.Option("--json", help="Print JSON, for scripts, instead of text.")]
QuietOutput = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]


def _shadow_map_side(value: int | None) -> int | None:
    from ..errors import BadInput
    from ..sim.constants import check_shadow_map

    try:
        return check_shadow_map(value)
    except BadInput as error:
        raise typer.BadParameter(str(error)) from None


ShadowMapOption = Annotated[
    int | None,
    typer.Option(
        "--shadow-map",
        callback=_shadow_map_side,
        help="Side of the sim lights' shadow maps, 256-8192 (default: gym-aloha's, 4096 at 480x640; a policy is "
        "evaluated with those its data was recorded with). 2048 rendered 2.6x faster at 240x320 on an H200 and moves "
        "a few pixels at shadow edges. 0: no shadows, about 2x faster on a CPU, where images differ from gym-aloha's.",
    ),
]


# How a policy acts, over what its checkpoint saved (`robotloop.config.acting_overrides`): `eval` and `robot run`.
TemporalEnsembleOption = Annotated[
    str | None,
    typer.Option(
        help="ACT's temporal ensembling: off, or its coefficient, e.g. 0.01 (a model pass every step; below 0 the "
        "newer predictions weigh more). Default: as the checkpoint saved it (robot run: robot.temporal_ensemble). "
        "lerobot's --policy.temporal_ensemble_coeff."
    ),
]
ActionStepsOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Actions executed from each predicted chunk; above 1 turns ensembling off. Default: as saved (robot run: "
        "robot.action_steps). lerobot's --policy.n_action_steps.",
    ),
]


class ReportErrors(TyperGroup):
    """The root group: a RobotloopError from any command (or the settings callback) ends it with `fail`, and a
    usage error (a bad or missing option, an unknown command) is one line too, with exit code 2, instead of
    typer's boxed panel."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except RobotloopError as error:
            raise fail(error) from None
        except UsageError as error:
            where = error.ctx.command_path if error.ctx else ctx.command_path
            error_console.print(f"[red]error:[/red] {escape(error.format_message())} (see '{where} --help')")
            raise typer.Exit(2) from None

    def main(self, *args, **kwargs):
        # Piped help (`robotloop train --help | less`) at rich's 80 columns would cut option names and URLs; a
        # width someone gave (COLUMNS, a test runner's terminal_width) is kept.
        if sys.stdout.isatty() or "terminal_width" in kwargs or os.environ.get("COLUMNS"):
            return super().main(*args, **kwargs)
        before, typer.rich_utils.MAX_WIDTH = typer.rich_utils.MAX_WIDTH, 160
        try:
            return super().main(*args, **kwargs)
        finally:
            typer.rich_utils.MAX_WIDTH = before


def show(result: Any, as_json: bool, text: Callable[[Any], str]) -> None:
    """A command's result: text for people, or with --json the result as JSON for scripts."""
    if as_json:
        print_json(result)
    else:
        console.print(text(result), highlight=False, soft_wrap=True)  # one line stays one, in a pipe too


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=1))  # plain print: no rich wrapping or colour in what scripts parse


def json_result(command: Callable[..., Any]) -> Callable[..., Any]:
    """For a command that prints for people while it runs (progress bars, tables) and returns its result: with
    `--json` (its `as_json` parameter) what it prints goes to stderr, and stdout holds its result as JSON, alone."""

    @functools.wraps(command)  # typer reads the wrapped command's signature
    def run(*args: Any, **kwargs: Any) -> None:
        if not kwargs.get("as_json"):
            command(*args, **kwargs)
            return
        with redirect_stdout(sys.stderr):  # rich consoles write to whatever sys.stdout is at the time
            result = command(*args, **kwargs)
        print_json(result)

    return run


class _TransferBar:
    """A `robotloop.storage.TransferProgress` drawn as one rich task: bytes, speed, time left."""

    def __init__(self, bars: Progress, task: TaskID) -> None:
        self.bars, self.task = bars, task

    def start(self, total_bytes: int) -> None:
        self.bars.update(self.task, total=total_bytes)

    def advance(self, nbytes: int) -> None:
        self.bars.advance(self.task, nbytes)


@contextmanager
def transfer_progress(label: str, off: bool) -> Iterator[_TransferBar | None]:
    """A progress bar on stderr for an upload or download (hf_xet's reports, through `TransferProgress`), or
    None: when `off` (--quiet, --json) or where stderr is no terminal (rich's test: TTY_INTERACTIVE=1 forces it
    on, 0 off), so logs and pipes get only the result line."""
    stderr = note_console
    if off or not stderr.is_interactive:
        yield None
        return
    columns = (TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=stderr) as bars:
        yield _TransferBar(bars, bars.add_task(label, total=None))


__all__ = [
    "EXIT_CODES",
    "JsonOutput",
    "QuietOutput",
    "ReportErrors",
    "cli_console",
    "error_console",
    "exit_code",
    "fail",
    "json_result",
    "log_to_console",
    "note_console",
    "print_json",
    "progress_bars",
    "quiet_encoders",
    "quiet_libraries",
    "show",
    "transfer_progress",
]
