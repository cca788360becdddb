"""Each service's options, written once: `python -m services.<X>` and `robotloop <X> serve` both parse them.

A service declares its options as a frozen dataclass whose fields say their help (:func:`option`);
:func:`serve_command` turns that class into a Typer command calling ``services.<X>.app.serve(options, settings)``.
The CLI registers that command under ``robotloop <X> serve``; ``services/<X>/__main__.py`` runs it through
:func:`main`. So the two spellings cannot drift apart, and neither imports the other.

Example::

    @dataclasses.dataclass(frozen=True)
    class CaptureOptions:
        section: ClassVar[str | None] = "capture"  # the settings section whose values fill options left None
        host: str | None = option(None, "Listen address.")
        port: int | None = option(None, "Port.", min=0, max=65535)

    main(CaptureOptions, "services.capture.app", "python -m services.capture")
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import typing
from collections.abc import Callable
from typing import Any

import typer


def option(default: Any, help: str, *names: str, **checks: Any) -> Any:
    """A dataclass field that is also a command-line option: its `help`, its flag `names` (default: from the
    field's name, `--max-body-bytes`) and Typer's `checks` (`min=0, max=65535`)."""
    return dataclasses.field(default=default, metadata={"help": help, "names": names, "checks": checks})


def _stderr_exit(error: Exception) -> typer.Exit:
    print(f"error: {error}", file=sys.stderr)
    return typer.Exit(1)


def serve_command(
    options: type, module: str, fail: Callable[[Exception], typer.Exit] = _stderr_exit
) -> Callable[..., None]:
    """A Typer command whose options are the fields of the dataclass `options`; it calls `<module>.serve`.

    ``serve(options, settings)`` when `options.section` names the service's settings section: the settings are the
    `robotloop` callback's (`ctx.obj`: --endpoint, --token) or, run on its own, `load_settings()`; ``serve(options)``
    when it is None (the bucket server reads no settings). `<module>` is imported only when the command runs:
    services pull in FastAPI and uvicorn.
    What the service refuses to start with (a missing or malformed tokens file, a busy port) goes through `fail`:
    one line and exit code 1; usage errors stay Typer's (exit code 2).
    """
    hints = typing.get_type_hints(options)

    def command(ctx: typer.Context, **values: Any) -> None:
        from robotloop.config import load_settings
        from robotloop.errors import RobotloopError

        try:
            serve = importlib.import_module(module).serve
            if options.section is None:
                serve(options(**values))
            else:
                serve(options(**values), ctx.obj or load_settings())
        except RobotloopError as error:  # a missing or malformed tokens file, open mode off loopback, a busy port
            raise fail(error) from None

    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    for field in dataclasses.fields(options):
        meta = field.metadata
        flag = typer.Option(field.default, *meta["names"], help=meta["help"], **meta["checks"])
        params.append(
            inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=flag, annotation=hints[field.name])
        )
    command.__signature__ = inspect.Signature(params)  # what Typer reads the options from
    command.__doc__ = options.__doc__
    return command


def main(options: type, module: str, prog: str) -> None:
    """Parse ``sys.argv`` as `options` and serve: the body of ``services/<X>/__main__.py``."""
    app = typer.Typer(add_completion=False)
    app.command()(serve_command(options, module))
    app(prog_name=prog)
