"""`robotloop record`: scripted sim demonstrations into a bucket, one committed episode at a time."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated

import typer

from ..capture import DatasetRecorder, DatasetSpec
from ..capture.sim_record import TASK_TEXT, record_sim
from ..cluster import RAY_HELP, check_address
from ..errors import BadInput
from ..sim.constants import parse_image_size
from ..storage import BadBucketUrl, BucketUrl, connect
from .output import ShadowMapOption, cli_console, fail, progress_bars, quiet_encoders

console = cli_console()
CAMERAS_HELP = (
    "LeRobot's --robot.cameras, e.g. '{front: {type: opencv, index_or_path: 0, width: 640, height: 480, fps: 30}}'."
)


@dataclass(frozen=True)
class HardwareSession:
    """What `record --robot.type` needs beyond the dataset: LeRobot's robot and teleoperator, and the timing."""

    robot_type: str
    robot_port: str | None
    robot_id: str | None
    robot_cameras: str | None
    teleop_type: str | None
    teleop_port: str | None
    teleop_id: str | None
    episode_time_s: float
    reset_time_s: float
    fps: int
    task: str

    @classmethod
    def from_params(cls, params: dict) -> HardwareSession:
        """From the command's parsed options (`ctx.params`, keyed by parameter name)."""
        return cls(**{f.name: params[f.name] for f in fields(cls)})


def _image_size(text: str) -> tuple[int, int]:
    """--image-size through the sim's parser (the one rule for image sizes), as a CLI error."""
    try:
        return parse_image_size(text)
    except BadInput as error:
        raise typer.BadParameter(str(error), param_hint="--image-size") from None


def record(
    ctx: typer.Context,
    to: Annotated[str, typer.Option("--to", help="Dataset URL: hf://buckets/<ns>/<bucket>/datasets/<name>")],
    sim: Annotated[str, typer.Option(help=f"Sim task: {', '.join(TASK_TEXT)}")] = "transfer_cube",
    episodes: Annotated[int, typer.Option(min=1, help="Successful episodes to commit.")] = 50,
    workers: Annotated[int, typer.Option(min=1, help="Sim worker processes.")] = 1,
    image_size: Annotated[str, typer.Option(help="Camera image HxW.")] = "480x640",
    max_steps: Annotated[int | None, typer.Option(min=1, help="Steps per episode (default: the task's, 400).")] = None,
    codec: Annotated[
        str, typer.Option(help="Video codec (lerobot's default libsvtav1; h264 is faster on CPU).")
    ] = "libsvtav1",
    seed: Annotated[int | None, typer.Option(help="First seed (default: the number of committed episodes).")] = None,
    keep_failed: Annotated[bool, typer.Option(help="Commit failed demos too, marked by next.success=false.")] = False,
    robot_type: Annotated[
        str | None, typer.Option("--robot.type", help="LeRobot robot type (hardware instead of sim).")
    ] = None,
    robot_port: Annotated[str | None, typer.Option("--robot.port")] = None,
    robot_id: Annotated[str | None, typer.Option("--robot.id")] = None,
    robot_cameras: Annotated[str | None, typer.Option("--robot.cameras", help=CAMERAS_HELP)] = None,
    teleop_type: Annotated[str | None, typer.Option("--teleop.type", help="LeRobot teleoperator type.")] = None,
    teleop_port: Annotated[str | None, typer.Option("--teleop.port")] = None,
    teleop_id: Annotated[str | None, typer.Option("--teleop.id")] = None,
    episode_time_s: Annotated[float, typer.Option(min=0.1, help="Hardware: seconds per episode.")] = 30.0,
    reset_time_s: Annotated[float, typer.Option(min=0, help="Hardware: teleoperated reset between episodes.")] = 10.0,
    fps: Annotated[int, typer.Option(min=1, help="Hardware: recording rate.")] = 30,
    task: Annotated[str, typer.Option(help="Hardware: the task instruction stored with each frame.")] = "",
    ray: Annotated[str | None, typer.Option("--ray", help=RAY_HELP + " Each worker commits its own episodes.")] = None,
    shadow_map: ShadowMapOption = None,
) -> None:
    """Record episodes (scripted sim, or LeRobot hardware with --robot.type); each is committed when it ends.

    A crash loses at most the episode in flight; a rerun continues the numbering.
    """
    quiet_encoders()
    if robot_type:
        return _record_hardware(ctx, to, episodes, codec, HardwareSession.from_params(ctx.params))
    if sim not in TASK_TEXT:
        raise typer.BadParameter(f"unknown sim task {sim!r}; choose one of {', '.join(TASK_TEXT)}", param_hint="--sim")
    try:
        url = BucketUrl.parse(to)
    except BadBucketUrl as error:
        raise typer.BadParameter(str(error), param_hint="--to") from None
    size = _image_size(image_size)
    if ray is not None:
        try:
            check_address(ray)
        except BadInput as error:
            raise typer.BadParameter(str(error), param_hint="--ray") from None
    recorder = DatasetRecorder(connect(ctx.obj), url, DatasetSpec.aloha(size, codec, shadow_map))
    first = recorder.committed_episodes()
    with progress_bars(console, "{task.description}") as bars:
        bar = bars.add_task(f"recording {sim}", total=episodes, note="")

        def on_event(kind: str, seed_: int, commit) -> None:
            if kind == "committed":
                bars.update(
                    bar,
                    advance=1,
                    note=f"episode {commit.episode_index} committed ({commit.upload_s:.2f} s upload)",
                )
            else:
                bars.update(bar, note=f"seed {seed_} failed" + ("" if keep_failed else ", dropped"))

        report = record_sim(
            recorder,
            sim,
            episodes,
            workers,
            size,
            max_steps,
            first if seed is None else seed,
            keep_failed=keep_failed,
            on_event=on_event,
            ray=ray,
        )
    sent = sum(c.bytes_sent for c in report.committed)
    own = sum(c.episode_bytes for c in report.committed)
    console.print(
        f"committed {len(report.committed)} episodes to {url} ({first} were there); scripted success "
        f"{report.success_rate:.0%}, failed seeds ({'kept, marked' if keep_failed else 'dropped'}): "
        f"{report.failed_seeds or 'none'}; "
        f"{report.episodes_per_minute:.1f} episodes/min; {sent:,} bytes sent for {own:,} episode bytes"
    )
    if len(report.committed) < episodes:  # a script or CI must not take a short dataset for a finished one
        short = f" (--max-steps {max_steps} may end episodes before the task is done)" if max_steps else ""
        raise fail(
            f"committed {len(report.committed)} of {episodes} episodes: the scripted expert failed on seeds "
            f"{report.failed_seeds}{short}. Run again to add more, or pass --keep-failed"
        )


def _record_hardware(ctx, to: str, episodes: int, codec: str, hw: HardwareSession) -> None:
    from ..capture.robot_record import make_hardware, record_robot, robot_spec

    if not hw.teleop_type or not hw.task:
        raise typer.BadParameter("hardware recording needs --teleop.type and --task")
    try:
        url = BucketUrl.parse(to)
        robot = make_hardware("robot", hw.robot_type, hw.robot_port, hw.robot_id, hw.robot_cameras)
        teleop = make_hardware("teleop", hw.teleop_type, hw.teleop_port, hw.teleop_id)
    except BadInput as error:
        raise typer.BadParameter(str(error)) from None
    if not robot_spec(robot, hw.fps, codec).cameras:
        console.print(
            "[yellow]note:[/yellow] no cameras: the dataset will hold joint states only, which ACT cannot train on "
            "(add --robot.cameras)"
        )
    robot.connect()
    teleop.connect()
    try:
        recorder = DatasetRecorder(connect(ctx.obj), url, robot_spec(robot, hw.fps, codec))
        reports = record_robot(
            recorder,
            robot,
            teleop,
            episodes,
            hw.episode_time_s,
            hw.task,
            hw.reset_time_s,
            on_commit=lambda r: console.print(f"episode {r.episode_index} committed"),
        )
    finally:
        robot.disconnect()
        teleop.disconnect()
    console.print(f"committed {len(reports)} episodes to {url}")
