"""`robotloop eval`: success rate (95% Wilson interval), rewards, videos and a JSON report for a policy in sim."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from ..cluster import RAY_HELP, check_address
from ..config import acting_overrides
from ..errors import BadInput
from .output import (
    ActionStepsOption,
    JsonOutput,
    ShadowMapOption,
    TemporalEnsembleOption,
    cli_console,
    json_result,
    progress_bars,
)

if TYPE_CHECKING:
    from ..deploy.evaluate import EvalReport

console = cli_console()


@json_result  # --json: the report on stdout, what the command shows on the way on stderr
def eval_policy(
    ctx: typer.Context,
    policy: Annotated[
        str,
        typer.Option(
            help="hf://buckets/<ns>/<b>/models/<run> (or .../checkpoints/<step>), a local "
            "pretrained_model, checkpoint or run directory, or a release name (pulled through the deploy service "
            "and verified as robots do)."
        ),
    ],
    sim: Annotated[str, typer.Option(help="Sim task: transfer_cube or insertion.")] = "transfer_cube",
    episodes: Annotated[int, typer.Option(min=1, help="Episodes, seeded SEED, SEED+1, ...")] = 50,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Sim worker processes (the policy runs once per step, on every episode at once); with --ray, Ray "
            "actors, each with a policy of its own.",
        ),
    ] = 1,
    batch: Annotated[
        int | None,
        typer.Option(min=1, help="Episodes run at once (default: all, or the fewest even waves of at most 256)."),
    ] = None,
    image_size: Annotated[str | None, typer.Option(help="Camera HxW; must be the policy's (the default).")] = None,
    seed: Annotated[
        int,
        typer.Option(help="Episode i uses seed SEED+i (lerobot-eval's default start, 1000)."),
    ] = 1000,
    max_steps: Annotated[
        int | None,
        typer.Option(min=1, help="Steps per episode (default: the task's, 400)."),
    ] = None,
    videos: Annotated[int, typer.Option(min=0, help="Record the first N episodes as mp4.")] = 3,
    output_dir: Annotated[
        Path | None,
        typer.Option(file_okay=False, help="Videos and eval_report.json (default: outputs/eval/<time>_<task>)."),
    ] = None,
    device: Annotated[str, typer.Option(help="auto (cuda when there is a GPU, else cpu), cpu or cuda.")] = "auto",
    backend: Annotated[
        str,
        typer.Option(
            help="torch (the checkpoint), onnx (a release's ONNX export on ONNX Runtime, as a robot without torch "
            "runs it), onnx-int8 (the export's int8 graph: deploy publish --onnx-int8) or auto (ONNX where the policy "
            "has an export)."
        ),
    ] = "torch",
    ray: Annotated[str | None, typer.Option("--ray", help=RAY_HELP + " Each worker runs whole waves.")] = None,
    shadow_map: ShadowMapOption = None,
    temporal_ensemble: TemporalEnsembleOption = None,
    action_steps: ActionStepsOption = None,
    against: Annotated[
        Path | None,
        typer.Option(
            dir_okay=False,
            help="An earlier evaluation's eval_report.json of the same task: compare scene by scene on the seeds both "
            "ran (the scenes each won that the other lost, and an exact sign test).",
        ),
    ] = None,
    as_json: JsonOutput = False,
) -> dict:
    """Evaluate a trained policy in the ALOHA sim: episodes run in lockstep, seeded, with rollout videos."""
    from ..deploy.evaluate import (
        REPORT_FILE,
        default_output_dir,
        describe_acting,
        describe_failures,
        locate_and_evaluate,
        paired,
    )
    from ..sim.constants import parse_image_size
    from ..sim.tasks import get_task
    from ..train.device import resolve_device

    try:
        get_task(sim)  # before any worker starts
    except BadInput as error:
        raise typer.BadParameter(str(error), param_hint="--sim") from None
    try:
        size = parse_image_size(image_size)
    except BadInput:
        raise typer.BadParameter(f"{image_size!r}: expected HxW, e.g. 480x640", param_hint="--image-size") from None
    try:
        inference = acting_overrides(temporal_ensemble, action_steps)
    except BadInput as error:
        raise typer.BadParameter(str(error), param_hint="--temporal-ensemble/--action-steps") from None
    if ray is not None:
        try:
            check_address(ray)
        except BadInput as error:
            raise typer.BadParameter(str(error), param_hint="--ray") from None
    earlier = _earlier_evaluation(against, sim, range(seed, seed + episodes)) if against else None
    out = output_dir or default_output_dir(sim)
    with progress_bars(console, "evaluating") as bars:
        bar = bars.add_task("eval", total=episodes, note="locating the policy")
        done: list[bool] = []

        def on_located(found) -> None:
            console.print(f"policy: {found.checkpoint}")  # the step a run's "latest" is at now
            bars.update(bar, note="starting workers")

        def on_episode(result) -> None:
            done.append(result.success)
            bars.update(bar, advance=1, note=f"{sum(done)}/{len(done)} solved")

        report = locate_and_evaluate(
            ctx.obj,
            policy,
            sim,
            episodes,
            workers,
            output_dir=out,
            on_located=on_located,
            seed=seed,
            max_steps=max_steps,
            image_size=size,
            videos=videos,
            device=resolve_device(device),
            on_episode=on_episode,
            batch=batch,
            backend=backend,
            ray=ray,
            shadow_map=shadow_map,
            inference=inference,
        )
    console.print(_episode_table(report))
    lo, hi = report.success_ci95
    acting = describe_acting(report.inference)
    console.print(
        f"success {report.successes}/{len(report.episodes)} = {100 * report.success_rate:.1f}% "
        f"(95% CI {100 * lo:.1f}-{100 * hi:.1f}%), mean max reward {report.mean_max_reward:.2f}, "
        f"mean sum reward {report.mean_sum_reward:.1f}, {report.wall_s:.1f} s" + (f", {acting}" if acting else "")
    )
    if failures := describe_failures(report.failures_by_stage):
        console.print(failures)
    if report.lockstep and report.lockstep.workers_busy_s:
        split = report.lockstep
        busy, rendering = statistics.mean(split.workers_busy_s), statistics.mean(split.workers_render_s)
        console.print(
            f"time: {split.policy_s:.1f} s in the policy's forward passes, {split.sims_s:.1f} s stepping and "
            f"rendering the sims ({split.steps} lockstep steps); each sim worker busy {busy:.1f} s on average, "
            f"{rendering:.1f} s of it rendering ({sum(split.workers_frames):,} frames rendered in all)"
        )
    for video in report.videos:
        console.print(f"video: {video}")
    versus = None
    if earlier is not None:
        versus = paired(report, earlier)
        console.print(f"against {earlier.checkpoint or earlier.policy} on the seeds both ran: {versus.describe()}")
    console.print(f"report: {out / REPORT_FILE}")
    return {
        **report.to_dict(),
        "report_file": str(out / REPORT_FILE),
        **({"against": str(against), "versus": asdict(versus)} if versus else {}),
    }


def _earlier_evaluation(path: Path, sim: str, seeds: range) -> EvalReport:
    """`--against`'s report, checked before any episode runs: readable, of `sim`, sharing seeds with this one."""
    from ..deploy.evaluate import EvalReport

    try:
        earlier = EvalReport.load(path)
    except BadInput as error:
        raise typer.BadParameter(str(error), param_hint="--against") from None
    if earlier.task != sim:
        raise typer.BadParameter(f"{path} evaluated {earlier.task}, not {sim}", param_hint="--against")
    ran = sorted({e.seed for e in earlier.episodes})
    if not set(ran) & set(seeds):
        what = f"seeds {ran[0]}-{ran[-1]}" if ran else "no episode"
        raise typer.BadParameter(
            f"{path} ran {what}; this evaluation runs seeds {seeds.start}-{seeds.stop - 1}: none in common "
            "(give --seed and --episodes to match)",
            param_hint="--against",
        )
    return earlier


def _episode_table(report) -> Table:
    table = Table(
        "episode",
        "seed",
        "success",
        "max reward",
        "sum reward",
        "steps",
        title=f"{report.task}: {report.source or report.policy}",
    )
    for e in report.episodes:
        table.add_row(
            str(e.index),
            str(e.seed),
            "yes" if e.success else "no",
            f"{e.max_reward:g}",
            f"{e.sum_reward:g}",
            str(e.steps),
        )
    return table
