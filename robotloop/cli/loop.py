"""`robotloop loop`: the main job. From nothing to a sim robot running a policy it learned, with a report."""

from __future__ import annotations

import typer

from ..errors import BadInput
from ..loop.options import LoopOptions
from ..options import typer_command
from ..storage import connect
from .output import cli_console, quiet_encoders

console = cli_console()


@typer_command(LoopOptions)
def loop(ctx: typer.Context, options: LoopOptions) -> None:
    """Record demos, train ACT streaming from the bucket, publish a signed release, let a sim robot pull and run
    it, evaluate it, and write a report. With nothing configured, all of it goes through the embedded bucket
    server on localhost."""
    from ..loop.pipeline import run_loop
    from ..loop.report import upload_report, write_report

    quiet_encoders()
    try:
        settings = options.settings()
    except BadInput as error:  # an unknown task, a missing GPU, a bad recipe
        raise typer.BadParameter(str(error)) from None
    step = {"n": 0}

    def on_stage(stage: str, what: str) -> None:
        step["n"] += 1
        console.print(f"[bold]{step['n']}. {stage}[/bold]: {what}")

    def on_train(p) -> None:
        console.print(
            f"   step {p.step}/{settings.steps}  loss {p.loss:.3f}  {p.samples_per_s:.0f} samples/s  "
            f"data wait {100 * p.data_wait_share:.1f}%"
        )

    def on_demo(kind: str, report) -> None:
        of = "" if settings.live else f"/{settings.episodes}"
        failed = f", {report.demos_failed} failed and dropped" if report.demos_failed else ""
        console.print(f"   demos {report.episodes}{of} in the bucket{failed}  {report.recording_s:.0f} s")

    client = connect(ctx.obj)
    report = run_loop(settings, client, on_stage, on_train, on_demo)
    path = write_report(report)
    console.print(path.read_text().split("![loss]")[0])
    console.print(f"report: {path} (and {upload_report(client, report)})")
