"""`robotloop loop`: the main job. From nothing to a sim robot running a policy it learned, with a report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ..errors import BadInput
from ..storage import connect
from .output import quiet_encoders
from .record import _image_size

console = Console()


def loop(
    ctx: typer.Context,
    preset: Annotated[
        str,
        typer.Option(
            help="cpu (minutes on 2 cores) or h200 (the real result on one H200); "
            "the options below default to the preset's values."
        ),
    ] = "cpu",
    task: Annotated[str | None, typer.Option("--sim", "--task", help="Sim task: transfer_cube or insertion.")] = None,
    episodes: Annotated[int | None, typer.Option(min=1, help="Scripted demos to record.")] = None,
    image_size: Annotated[str | None, typer.Option(help="Camera HxW, e.g. 48x64 or 480x640.")] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="Training steps.")] = None,
    batch_size: Annotated[int | None, typer.Option(min=1, help="Training samples per step.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda or cuda:N (default: the preset's).")] = None,
    eval_episodes: Annotated[
        int | None, typer.Option(min=1, help="Evaluation episodes of the released policy.")
    ] = None,
    eval_max_steps: Annotated[
        int | None, typer.Option(min=1, help="Steps per evaluation episode (default 400).")
    ] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="Sim workers for recording and evaluation.")] = None,
    train_after: Annotated[
        int | None, typer.Option(min=1, help="Start training once this many demos are in; record the rest beside it.")
    ] = None,
    live: Annotated[
        bool, typer.Option(help="Keep recording while training; promote checkpoints that beat stable.")
    ] = False,
    bucket: Annotated[
        str, typer.Option(help="Bucket for the dataset, checkpoints and releases.")
    ] = "hf://buckets/local/loop",
    report_dir: Annotated[
        Path, typer.Option(file_okay=False, help="Where the report (Markdown, PNG, JSON) goes.")
    ] = Path("loop-report"),
    backbone_weights: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="Local torchvision resnet18 weights (default: random init)."),
    ] = None,
) -> None:
    """Record demos, train ACT streaming from the bucket, publish a signed release, let a sim robot pull and run
    it, evaluate it, and write a report. With nothing configured, all of it goes through the embedded bucket
    server on localhost."""
    from ..loop import LoopSettings, run_loop, write_report

    quiet_encoders()

    overrides = {
        k: v
        for k, v in dict(
            task=task,
            episodes=episodes,
            steps=steps,
            batch_size=batch_size,
            device=device,
            eval_episodes=eval_episodes,
            eval_max_steps=eval_max_steps,
            train_after=train_after,
        ).items()
        if v is not None
    }
    if image_size:
        overrides["image_size"] = _image_size(image_size)
    if workers:
        overrides["record_workers"] = overrides["eval_workers"] = workers
    try:
        settings = LoopSettings.preset(
            preset, live=live, bucket=bucket, report_dir=report_dir, backbone_weights=backbone_weights, **overrides
        )
    except BadInput as error:  # unknown preset or task, a bad bucket URL
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

    report = run_loop(settings, connect(ctx.obj), on_stage, on_train)
    path = write_report(report)
    console.print(path.read_text().split("![loss]")[0])
    console.print(f"report: {path}")
