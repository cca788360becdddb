"""`robotloop`: the command line. Each command is a thin call into the library."""

from __future__ import annotations

import faulthandler
import sys
from typing import Annotated

from .output import ReportErrors, fail, log_to_console, quiet_libraries

quiet_libraries()  # first: tqdm reads its settings when it is imported, and the commands below import it
log_to_console("--debug" in sys.argv)  # before lerobot's first logging call; sim workers import this module too

import typer

from services.options import serve_command
from services.ui import UiOptions

from ..config import load_settings
from ..train.command import train as train_command
from . import bucket, capture, demo, record, trainer_service
from . import deploy as deploy_cli
from . import robot as robot_cli
from .agent import agent as agent_command
from .eval import eval_policy
from .loop import loop

app = typer.Typer(
    cls=ReportErrors,
    no_args_is_help=True,
    add_completion=False,
    help="Close the robot-learning data loop.\n\nSettings come from robotloop.toml (or the file in ROBOTLOOP_CONFIG), "
    "then ROBOTLOOP_* variables (ROBOTLOOP_STORAGE__ENDPOINT, ...), then options.",
)
app.add_typer(bucket.app, name="bucket")
app.add_typer(capture.app, name="capture")
app.add_typer(trainer_service.app, name="trainer")
app.add_typer(deploy_cli.app, name="deploy")
app.add_typer(robot_cli.app, name="robot")
app.command("demo")(demo.demo)
app.command("record")(record.record)
app.command("train")(train_command)
app.command("eval")(eval_policy)
app.command("agent")(agent_command)
app.command("loop")(loop)
app.command("ui")(serve_command(UiOptions, "services.ui.app", fail))


@app.callback()
def main(
    ctx: typer.Context,
    endpoint: Annotated[
        str | None, typer.Option(help="Bucket endpoint (Hub or robotloop server). Default: embedded server.")
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            help="Access token. Default: ROBOTLOOP_STORAGE__TOKEN, HF_TOKEN, or the embedded server's.", envvar=None
        ),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show every log record and the traceback of a failure.")
    ] = False,
) -> None:
    """Settings come from robotloop.toml, then ROBOTLOOP_* env vars, then these flags."""
    if debug:
        log_to_console(debug=True)
    ctx.obj = load_settings({"storage": {"endpoint": endpoint, "token": token}})  # SettingsError: ReportErrors


TRAINER_COMMANDS = ("serve", "submit", "status", "list", "watch")


def run(argv: list[str] | None = None) -> None:
    """The `robotloop` entry point. `robotloop train serve|submit|status|list|watch` mean `robotloop trainer ...`,
    so every service starts as `robotloop <X> serve`: `train` is a command with required options, which Typer
    cannot also make a group."""
    # A crash in native code (MuJoCo, EGL, a codec, CUDA) then prints every thread's Python stack instead of a
    # bare exit 139: one H200 loop run died so, with nothing in its log to say where.
    if not faulthandler.is_enabled():
        faulthandler.enable()
    args = list(sys.argv[1:] if argv is None else argv)
    i = 0
    while i < len(args) and args[i].startswith("-"):  # global options come first: --endpoint URL --token T
        i += 1 if "=" in args[i] else 2
    if args[i : i + 1] == ["train"] and len(args) > i + 1 and args[i + 1] in TRAINER_COMMANDS:
        args[i] = "trainer"
    app(args, prog_name="robotloop")


if __name__ == "__main__":
    run()
