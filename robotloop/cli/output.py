"""How every command reports: failures (see `robotloop.output`, which `python -m robotloop.train` shares), and
results as text for people or, with --json, JSON for scripts."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console

from ..output import error_console, fail, quiet_encoders, quiet_libraries

console = Console()

JsonOutput = Annotated[bool, typer.Option("--json", help="Print JSON, for scripts, instead of text.")]


def show(result: Any, as_json: bool, text: Callable[[Any], str]) -> None:
    """A command's result: text for people, or with --json the result as JSON for scripts."""
    if as_json:
        print_json(result)
    else:
        console.print(text(result), highlight=False)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=1))  # plain print: no rich wrapping or colour in what scripts parse


__all__ = ["JsonOutput", "error_console", "fail", "print_json", "quiet_encoders", "quiet_libraries", "show"]
