"""`robotloop train` and `python -m robotloop.train` (under torchrun too): fit LeRobot's ACT streaming straight
from bucket datasets. The train layer's entry point: the CLI registers this command, nothing here imports the CLI."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..output import fail
from ..storage import BadBucketUrl, BucketUrl, StorageError, connect

console = Console()


def train(
    ctx: typer.Context,
    dataset: Annotated[list[str], typer.Option(help="Dataset URL (repeat for several).")],
    output: Annotated[str, typer.Option(help="Run URL: hf://buckets/<ns>/<bucket>/models/<run>")],
    steps: Annotated[int, typer.Option(min=1, help="Optimizer steps (the run's total, counting resumed ones).")] = 1000,
    batch_size: Annotated[int, typer.Option(min=1, help="Samples per step (per GPU under torchrun).")] = 8,
    device: Annotated[
        str, typer.Option(help="auto (cuda when there is a GPU, else cpu), cpu, cuda or cuda:N.")
    ] = "auto",
    resume: Annotated[bool, typer.Option(help="Continue from the run's last checkpoint.")] = False,
    log_every: Annotated[int, typer.Option(min=1, help="Steps between progress lines.")] = 50,
    checkpoint_every: Annotated[
        int, typer.Option(min=1, help="Steps between checkpoints (the last step always writes one).")
    ] = 1000,
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
    decode_workers: Annotated[int, typer.Option(min=1, help="Processes decoding video for the frame buffer.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the weights and the sampler.")] = 0,
    tiny: Annotated[bool, typer.Option(help="A small ACT (dim 64) for smoke tests on CPU.")] = False,
    progress_file: Annotated[
        Path | None, typer.Option(help="Append one JSON line per progress report, and the final report.")
    ] = None,
    fp8: Annotated[
        str,
        typer.Option(
            help="FP8 linear layers (TorchAO): off, auto (only shapes measured faster; bf16 where there is no FP8), "
            "tensorwise, rowwise, rowwise_with_gw_hp."
        ),
    ] = "off",
) -> None:
    """Train ACT; checkpoints (LeRobot format + lineage + loss plot) land under --output every --checkpoint-every steps.

    SIGTERM stops the run after the current step, with a checkpoint (how the training service cancels a job).
    """
    from ..train.data import DataError, DataSettings
    from ..train.device import resolve_device
    from ..train.fp8 import Fp8Error
    from ..train.fp8 import preflight as preflight_fp8
    from ..train.policy import ACTSettings
    from ..train.trainer import TrainSettings
    from ..train.trainer import train as run

    try:
        datasets = [BucketUrl.parse(d) for d in dataset]
        out = BucketUrl.parse(output)
    except BadBucketUrl as error:
        raise typer.BadParameter(str(error)) from None
    try:
        device = resolve_device(device)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--device") from None
    if progress_file is not None and not progress_file.parent.is_dir():  # found at the first report, the run would die
        raise typer.BadParameter(f"{progress_file.parent}: no such folder", param_hint="--progress-file")
    try:  # fail now, not after the data streams in (build_policy checks again, per rank)
        preflight_fp8(fp8, device)
    except Fp8Error as error:
        raise fail(error, f"--fp8 {fp8}: ") from None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--fp8") from None
    use_fast = device.startswith("cuda") if fast is None else fast
    arch = (
        dict(
            dim_model=64,
            dim_feedforward=128,
            n_encoder_layers=1,
            n_vae_encoder_layers=1,
            chunk_size=10,
            n_action_steps=10,
        )
        if tiny
        else {}
    )
    arch |= {"fp8": fp8, "precision": "bf16"} if fp8 != "off" else {}  # FP8 trains the other layers in bf16
    act = (
        ACTSettings.fast(backbone_weights=backbone_weights, **arch)
        if use_fast
        else ACTSettings(backbone_weights=backbone_weights, **arch)
    )
    if backbone_weights is None:
        console.print(
            "[yellow]note:[/yellow] no --backbone-weights: the ResNet18 backbone starts from random weights "
            "(nothing is downloaded)"
        )
    settings = TrainSettings(steps, batch_size, log_every, checkpoint_every, seed, device, resume)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # the trainer polls it each step, then checkpoints
    write_progress = _progress_writer(progress_file)
    failure: Exception | None = None
    with Progress(
        TextColumn("training"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"),
        console=console,
    ) as bars:
        bar = bars.add_task("train", total=steps, note="streaming first episodes")

        def on_progress(p) -> None:
            note = f"loss {p.loss:.3f}  {p.samples_per_s:.0f} samples/s  data wait {100 * p.data_wait_share:.1f}%"
            bars.update(bar, completed=p.step, note=note)
            if not console.is_terminal:  # a log file (the training service, CI): bars would only show at the end
                console.print(f"step {p.step}/{steps}  {note}")
            write_progress({"event": "progress", **asdict(p)})

        try:
            report = run(
                connect(ctx.obj),
                datasets,
                out,
                settings,
                act,
                DataSettings(decode_workers=decode_workers),
                on_progress,
                stop.is_set,
            )
        except (StorageError, DataError, ValueError) as error:
            failure = error  # reported once the progress bar is gone, so that it is the last line on screen
    if failure is not None:
        raise fail(failure) from None
    console.print(
        f"{report.steps} steps in {report.wall_s:.1f} s: {report.samples_per_s:.1f} samples/s, "
        f"data wait {100 * report.data_wait_share:.1f}%, final loss {report.final_loss:.4f}"
    )
    console.print(f"last checkpoint: {report.checkpoints[-1] if report.checkpoints else 'none'}")
    write_progress(
        {"event": "done", **{k: v for k, v in asdict(report).items() if k != "losses"}, "stopped": stop.is_set()}
    )


def _progress_writer(path: Path | None):
    """A function appending one JSON object per line to `path`; a no-op without a path, and on ranks > 0 under
    torchrun (one writer per job). Non-finite floats become null: the file stays strict JSON."""
    if path is None or os.environ.get("RANK", "0") != "0":
        return lambda record: None

    def write(record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(clean) + "\n")

    return write
