"""How every command reports: failures (see `robotloop.output`, which `python -m robotloop.train` shares: one red
line and the exit code of the error's category, `EXIT_CODES`), and results as text for people or, with --json,
JSON for scripts.

The root command group (`ReportErrors`) turns any `RobotloopError` a command lets through into that line, so a
command catches an error only to say more than its message. Any other exception is a bug and shows its
traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from typer.core import TyperGroup

from ..errors import RobotloopError
from ..output import EXIT_CODES, error_console, exit_code, fail, quiet_encoders, quiet_libraries

console = Console()

JsonOutput = Annotated[bool, typer.Option("--json", help="Print JSON, for scripts, instead of text.")]


class ReportErrors(TyperGroup):
    """The root group: a RobotloopError from any command (or the settings callback) ends it with `fail`."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except RobotloopError as error:
            raise fail(error) from None


def show(result: Any, as_json: bool, text: Callable[[Any], str]) -> None:
    """A command's result: text for people, or with --json the result as JSON for scripts."""
    if as_json:
        print_json(result)
    else:
        console.print(text(result), highlight=False)


def progress_bars(out: Console, title: str, eta: bool = False) -> Progress:
    """The progress display of a long command: `title` (a rich column template, "{task.description}" for the
    task's own), a bar, done of total, the time elapsed (or with `eta` the time left), and the task's `note` field."""
    clock = TimeRemainingColumn() if eta else TimeElapsedColumn()
    return Progress(
        TextColumn(title), BarColumn(), MofNCompleteColumn(), clock, TextColumn("{task.fields[note]}"), console=out
    )


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=1))  # plain print: no rich wrapping or colour in what scripts parse


__all__ = [
    "EXIT_CODES",
    "JsonOutput",
    "ReportErrors",
    "error_console",
    "exit_code",
    "fail",
    "print_json",
    "progress_bars",
    "quiet_encoders",
    "quiet_libraries",
    "show",
]
