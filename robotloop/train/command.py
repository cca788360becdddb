"""`robotloop train` and `python -m robotloop.train` (under torchrun too): fit LeRobot's ACT streaming straight
from bucket datasets. The train layer's entry point: the CLI registers this command, nothing here imports the CLI."""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from ..errors import BadInput, RobotloopError
from ..options import typer_command
from ..output import cli_console, fail, progress_bars
from ..storage import BucketUrl, connect
from .options import TrainOptions, read_train_config
from .progress import Progress as TrainProgress
from .progress import progress_line

console = cli_console()


@typer_command(TrainOptions, config=read_train_config)
def train(
    ctx: typer.Context,
    options: TrainOptions,
    *,
    # Options of this process only, not of a job: local paths and how this machine runs the step.
    fast: Annotated[
        bool | None,
        typer.Option(help="bf16, fused attention, channels_last, compile + CUDA graphs (default: on with cuda)."),
    ] = None,
    backbone_weights: Annotated[
        Path | None,
        typer.Option(
            exists=True, dir_okay=False, help="Local torchvision resnet18 weights; default none: random init."
        ),
    ] = None,
    progress_file: Annotated[
        Path | None, typer.Option(help="Append one JSON line per progress report, and the final report.")
    ] = None,
) -> None:
    """Train ACT; checkpoints (LeRobot format + lineage + loss plot) land under --output every --checkpoint-every steps.

    SIGTERM stops the run after the current step, with a checkpoint (how the training service cancels a job).
    """
    from ..train.device import resolve_device
    from ..train.fp8 import Fp8Error
    from ..train.fp8 import preflight as preflight_fp8
    from ..train.policy import TINY_ACT, ACTSettings
    from ..train.trainer import TrainSettings
    from ..train.trainer import train as run

    o = options  # URLs already checked by TrainOptions
    datasets, out = [BucketUrl.parse(d) for d in o.datasets], BucketUrl.parse(o.output)
    try:
        device = resolve_device(o.device)
    except BadInput as error:
        raise typer.BadParameter(str(error), param_hint="--device") from None
    if progress_file is not None and not progress_file.parent.is_dir():  # found at the first report, the run would die
        raise typer.BadParameter(f"{progress_file.parent}: no such folder", param_hint="--progress-file")
    try:  # fail now, not after the data streams in (build_policy checks again, per rank)
        preflight_fp8(o.fp8, device)
    except Fp8Error as error:
        raise fail(error, f"--fp8 {o.fp8}: ") from None
    except BadInput as error:
        raise typer.BadParameter(str(error), param_hint="--fp8") from None
    use_fast = device.startswith("cuda") if fast is None else fast
    arch = dict(TINY_ACT) if o.tiny else {}
    arch |= {"fp8": o.fp8, "precision": "bf16"} if o.fp8 != "off" else {}  # FP8 trains the other layers in bf16
    arch |= o.policy_overrides()
    if o.chunk_size and not o.n_action_steps:  # a smaller chunk than the default 100 actions run per chunk
        arch["n_action_steps"] = min(arch.get("n_action_steps", ACTSettings.n_action_steps), o.chunk_size)
    make = ACTSettings.fast if use_fast else ACTSettings
    try:
        act = make(backbone_weights=backbone_weights, **arch)
    except BadInput as error:
        raise typer.BadParameter(str(error)) from None
    # Without --backbone-weights the library says once that the backbone starts random (load_backbone_weights).
    settings = TrainSettings(
        steps=o.steps,
        batch_size=o.batch_size,
        log_every=o.log_every,
        checkpoint_every=o.checkpoint_every,
        seed=o.seed,
        device=device,
        resume=o.resume,
        init_from=o.init_from,
        init_stats=o.init_stats,
        onnx=o.onnx,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # the trainer polls it each step, then checkpoints
    write_progress = _progress_writer(progress_file)
    last: list[TrainProgress] = []  # the latest report: the done line's episode count
    failure: Exception | None = None
    with progress_bars(console, "training", eta=True) as bars:
        bar = bars.add_task("train", total=o.steps, note="streaming first episodes")

        def on_progress(p) -> None:
            note = f"loss {p.loss:.3f}  {p.samples_per_s:.0f} samples/s  data wait {100 * p.data_wait_share:.1f}%"
            bars.update(bar, completed=p.step, note=note)
            if not console.is_terminal:  # a log file (the training service, CI): bars would only show at the end
                console.print(f"step {p.step}/{o.steps}  {note}")
            last.append(p)
            write_progress(progress_line("progress", p))

        try:
            report = run(
                connect(ctx.obj),
                datasets,
                out,
                settings,
                act,
                o.data_settings(),
                on_progress,
                stop.is_set,
            )
        except RobotloopError as error:
            failure = error  # reported once the progress bar is gone, so that it is the last line on screen
    if failure is not None:
        raise fail(failure) from None
    console.print(
        f"{report.steps} steps in {report.wall_s:.1f} s: {report.samples_per_s:.1f} samples/s, "
        f"data wait {100 * report.data_wait_share:.1f}%, final loss {report.final_loss:.4f}"
    )
    console.print(f"last checkpoint: {report.checkpoints[-1] if report.checkpoints else 'none'}")
    if report.onnx is not None:  # what publish will reuse, or why it will have to export (and say why again)
        said = report.onnx.get("error") or f"{report.onnx['max_abs_diff']:.1g} max |ONNX - torch|"
        console.print(f"its ONNX export: {said} ({report.onnx['seconds']:.1f} s)")
    final = TrainProgress(
        report.steps,
        report.final_loss,
        report.samples_per_s,
        report.data_wait_share,
        last[-1].episodes if last else None,
        report.wall_s,
        last_checkpoint=report.checkpoints[-1] if report.checkpoints else None,
    )
    # The final progress, plus the run's summary (benchmarks/train_e2e.py reads steps, wall_s, final_loss).
    summary = {k: v for k, v in asdict(report).items() if k not in ("losses", *asdict(final))}
    write_progress(progress_line("done", final, **summary, stopped=stop.is_set()))


def _progress_writer(path: Path | None):
    """A function appending lines (robotloop.train.progress.progress_line) to `path`; a no-op without a path, and
    on ranks > 0 under torchrun (one writer per job)."""
    if path is None or os.environ.get("RANK", "0") != "0":
        return lambda line: None

    def write(line: str) -> None:
        with path.open("a", encoding="utf-8") as f:
            f.write(line)

    return write
