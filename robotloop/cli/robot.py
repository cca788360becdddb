"""`robotloop robot run`: the robot runtime (sim or LeRobot hardware), following its deploy assignment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from ..config import RobotSettings, load_settings
from ..errors import BadInput
from ..sim.constants import format_image_size
from .output import ActionStepsOption, TemporalEnsembleOption, cli_console, fail, quiet_encoders
from .record import CAMERAS_HELP, _image_size

app = typer.Typer(no_args_is_help=True, help="The robot side: run released policies, hot-swap and roll back.")
console = cli_console()
TOKEN_HELP = "This robot's token. Default: robot.token (ROBOTLOOP_ROBOT__TOKEN)."
KEYS_HELP = "Public key file(s) of trusted release signers. Default: robot.trusted_keys."


@app.command()
def run(
    ctx: typer.Context,
    robot_id: Annotated[
        str | None, typer.Option("--robot-id", help="Registered robot id. Default: robot.robot_id.")
    ] = None,
    deploy_url: Annotated[str | None, typer.Option("--deploy-url", help="Deploy service. Default: deploy.url.")] = None,
    token: Annotated[str | None, typer.Option("--robot-token", help=TOKEN_HELP)] = None,
    trusted_key: Annotated[list[Path] | None, typer.Option("--trusted-key", help=KEYS_HELP)] = None,
    store: Annotated[Path | None, typer.Option(help="Local release store. Default: robot.store_dir.")] = None,
    sim: Annotated[str | None, typer.Option(help="Sim task (transfer_cube, insertion).")] = None,
    image_size: Annotated[
        str | None,
        typer.Option(
            help="Sim camera HxW. Default: the size the release's policy takes (saved beside it, as `robotloop "
            "eval` reads it); the camera then keeps the size of the first release it runs."
        ),
    ] = None,
    episode_steps: Annotated[
        int,
        typer.Option(
            "--max-steps", "--episode-steps", min=1, help="Sim: steps per episode (as record and eval call it)."
        ),
    ] = 400,
    robot_type: Annotated[str | None, typer.Option("--robot.type", help="LeRobot robot type (hardware).")] = None,
    robot_port: Annotated[str | None, typer.Option("--robot.port")] = None,
    robot_hw_id: Annotated[str | None, typer.Option("--robot.id", help="LeRobot calibration id.")] = None,
    robot_cameras: Annotated[str | None, typer.Option("--robot.cameras", help=CAMERAS_HELP)] = None,
    fps: Annotated[float, typer.Option(min=1, help="Hardware: control rate.")] = 30.0,
    episode_time_s: Annotated[float, typer.Option(min=0.1, help="Hardware: seconds per episode.")] = 30.0,
    duration_s: Annotated[
        float | None, typer.Option(min=0.1, help="Stop after this long (default: run until ^C).")
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            help="Where the policy runs: auto (TensorRT/CUDA when present, else the CPU), cpu, cuda, cuda:N, tensorrt. "
            "Default: robot.device (auto)."
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            help="What runs each release: auto (its ONNX export on ONNX Runtime where it has one and onnxruntime is "
            "installed, else torch), onnx, onnx-int8 (its int8 graph, where published) or torch. Default: "
            "robot.backend (auto)."
        ),
    ] = None,
    temporal_ensemble: TemporalEnsembleOption = None,
    action_steps: ActionStepsOption = None,
    record: Annotated[
        str | None,
        typer.Option(help="Record episodes into the fleet dataset: off, failures or all. Default: robot.record."),
    ] = None,
    record_to: Annotated[
        str | None, typer.Option(help="Fleet dataset URL (hf://buckets/.../datasets/<name>). Default: robot.record_to.")
    ] = None,
    record_sample: Annotated[
        float | None, typer.Option(min=0.0, max=1.0, help="Share of episodes recorded. Default: robot.record_sample.")
    ] = None,
    record_via: Annotated[
        str | None,
        typer.Option(
            help="Send recorded episodes to this capture service, which writes the dataset (a slim install records "
            "only this way). Default: robot.record_via."
        ),
    ] = None,
    record_token: Annotated[
        str | None, typer.Option(help="This robot's capture-service token. Default: robot.record_token.")
    ] = None,
) -> None:
    """Run the assigned release at the task's rate (50 Hz for ALOHA); pull, verify and hot-swap new releases."""
    from ..deploy.client import DeployClient
    from ..deploy.fetch import XetFetcher
    from ..deploy.keys import load_public_keys
    from ..deploy.runtime import RobotRuntime
    from ..deploy.store import ReleaseStore
    from ..fleet import fleet_recorder
    from ..storage import BucketClient, ensure_endpoint

    settings = ctx.obj or load_settings()
    cfg = settings.robot
    robot_id = robot_id or cfg.robot_id
    if not robot_id:
        raise typer.BadParameter("give --robot-id (or robot.robot_id)", param_hint="--robot-id")
    if (sim is None) == (robot_type is None):
        raise typer.BadParameter("give exactly one of --sim TASK or --robot.type TYPE")
    trusted = load_public_keys(trusted_key or cfg.trusted_keys)
    deploy = DeployClient(
        deploy_url or settings.deploy.client_url, token or (cfg.token.get_secret_value() if cfg.token else None)
    )
    endpoint, storage_token = ensure_endpoint(settings)
    env = _env(sim, image_size, episode_steps, robot_type, robot_port, robot_hw_id, robot_cameras, fps, episode_time_s)
    given = {"record": record, "record_to": record_to, "record_sample": record_sample, "backend": backend}
    given |= {"record_via": record_via, "record_token": record_token}
    given |= {"temporal_ensemble": temporal_ensemble, "action_steps": action_steps}
    try:  # the settings model checks the recording options as it checks a config file's
        options = RobotSettings.model_validate(
            {**cfg.model_dump(), "robot_id": robot_id, "device": device or cfg.device}
            | {k: v for k, v in given.items() if v is not None}
        )
    except ValidationError as error:
        first = error.errors()[0]  # a field's error names its option; the acting options' check names both
        hint = f"--{str(first['loc'][0]).replace('_', '-')}" if first["loc"] else "--temporal-ensemble/--action-steps"
        raise typer.BadParameter(first["msg"], param_hint=hint) from None
    try:
        recording = fleet_recorder(options, BucketClient(endpoint, storage_token), fps=round(env.rate_hz))
    except BadInput as error:  # recording asked for without its dataset, a bad dataset URL, or without lerobot
        env.close()
        raise typer.BadParameter(str(error), param_hint="--record/--record-to/--record-via") from None
    if recording is not None and not options.record_via:  # via a capture service nothing encodes here (no av)
        quiet_encoders()  # ffmpeg's notes on every episode's video
    runtime = RobotRuntime(
        env,
        deploy,
        ReleaseStore(store or cfg.store_dir),
        trusted,
        options,
        lambda bucket: XetFetcher(endpoint, storage_token, bucket),
        recording=recording,
    )
    console.print(
        f"robot {robot_id}: {sim or robot_type} at {env.rate_hz:g} Hz{_camera(env)}, backend {options.backend} on "
        f"{options.device}, following {deploy.url}"
    )
    try:
        stats = runtime.run(duration_s)
    except KeyboardInterrupt:
        runtime.stop()
        stats = runtime.stats
    finally:
        env.close()
        if recording is not None:
            recording.close()
    pulled = sum(p.bytes_fetched for p in stats.pulls) / 1e6
    why = _why_nothing_ran(runtime)
    console.print(
        f"ran {stats.steps} steps ({_rate(stats.control_hz, env.rate_hz)}){_camera(env)}, {len(stats.episodes)} "
        "whole episodes; "
        f"pulled {pulled:.1f} MB; swaps "
        f"{len(stats.swaps)}, rollbacks {len(stats.rollbacks)}, refused {len(stats.refused)}; running "
        f"{runtime.running or _no_release(runtime, why)}{_backend(runtime)}{_recorded(recording)}"
    )
    if why:  # a robot that could run nothing it was given has failed, whatever stopped it
        raise fail(f"robot {robot_id} ran no release: {why}")


def _env(sim, image_size, episode_steps, robot_type, robot_port, robot_hw_id, robot_cameras, fps, episode_time_s):
    from ..deploy.envs import FROM_POLICY, HardwareControlEnv, SimControlEnv

    if sim:
        try:
            size = _image_size(image_size) if image_size else FROM_POLICY
            return SimControlEnv(sim, size, episode_steps)
        except BadInput as error:
            raise typer.BadParameter(str(error), param_hint="--sim") from None
    from ..capture.robot_record import make_hardware

    try:
        robot = make_hardware("robot", robot_type, robot_port, robot_hw_id, robot_cameras)
    except BadInput as error:
        raise typer.BadParameter(str(error), param_hint="--robot.type") from None
    robot.connect()
    return HardwareControlEnv(robot, fps, episode_time_s)


def _recorded(recording) -> str:
    if recording is None:
        return ""
    r = recording.stats
    return (
        f"; recorded {r.recorded} episodes to {recording.url} ({r.dropped} dropped, {r.not_kept} not kept, "
        f"{r.unfinished} unfinished)"
    )


def _backend(runtime) -> str:
    """What runs the running release: `` on onnx (CPUExecutionProvider)``; nothing when nothing runs."""
    return f" on {runtime.backend}" if runtime.backend else ""


def _rate(reached: float | None, target: float) -> str:
    return f"{reached:.1f} Hz of {target:g}" if reached is not None else f"target {target:g} Hz"


def _camera(env) -> str:
    """The sim's camera for the banner and the summary; nothing for hardware (its cameras are its own)."""
    if not getattr(env, "sized", True):
        return ", camera sized by the first release it runs"
    size = getattr(env, "image_size", None)
    return f", camera {format_image_size(size)}" if size else ""


def _no_release(runtime, why: str | None) -> str:
    if why or runtime.stats.steps:
        return "no release"
    return "no release (one was assigned, not ready yet)" if runtime.stats.assigned_at else "no release (none assigned)"


def _why_nothing_ran(runtime) -> str | None:
    """Why a robot that ran no step could run nothing: what it refused, rolled back or could not fetch; None when it
    ran, or when it was simply never assigned a release (nothing went wrong)."""
    stats = runtime.stats
    if stats.steps:
        return None
    said = [f"{e['release']}: {e['reason']}" for e in [*stats.refused, *stats.rollbacks] if e["release"]]
    said += [f"{r}: could not be fetched ({u['error']})" for r, u in runtime.ledger.unfetchable().items()]
    return "; ".join(said) or None
