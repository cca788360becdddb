"""`robotloop deploy ...`: deploy keys, signed releases, the deploy service, channels, robots, rollbacks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from services.deploy import DeployOptions
from services.options import serve_command

from ..config import Settings, load_settings
from .output import JsonOutput, cli_console, fail, print_json, show

app = typer.Typer(no_args_is_help=True, help="Ship checkpoints to robots: signed releases, channels, rollbacks.")
console = cli_console()  # a path stays whole on a narrow terminal: it can be copied

DeployUrl = Annotated[str | None, typer.Option("--deploy-url", help="Deploy service. Default: deploy.url.")]
DeployToken = Annotated[
    str | None, typer.Option("--deploy-token", help="Operator token. Default: deploy.token (ROBOTLOOP_DEPLOY__TOKEN).")
]


def _settings(ctx: typer.Context) -> Settings:
    return ctx.obj or load_settings()


def _client(ctx: typer.Context, url: str | None, token: str | None):
    from ..deploy.client import DeployClient

    return DeployClient.from_settings(_settings(ctx), url, token)


@app.command()
def keygen(
    ctx: typer.Context,
    key: Annotated[Path | None, typer.Option(help="Private key file to write. Default: deploy.key_file.")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing key (releases it signed stop verifying).")] = False,
) -> None:
    """Make an ed25519 deploy key: the private key file (0600) and, beside it, the public key with the suffix .pub
    (deploy.key -> deploy.pub): copy that one to robots' trusted keys."""
    from ..deploy.keys import KeyExists, generate_keypair, public_path

    key = key or _settings(ctx).deploy.key_file
    try:
        key_id = generate_keypair(key, overwrite=force)
    except KeyExists as error:  # the CLI's own words for the way out: its flag, not the library's argument
        raise fail(f"{error}: pass --force to replace it (releases it signed stop verifying)") from None
    console.print(
        f"deploy key {key_id}: private {key} (keep it where releases are published from), public "
        f"{public_path(key)} (the deploy service's and every robot's --trusted-key)",
        highlight=False,
    )


@app.command()
def token(
    tokens: Annotated[Path, typer.Option(help="The deploy service's tokens file (`deploy serve --tokens`).")],
    read: Annotated[bool, typer.Option("--read", help="A read token: it may only look.")] = False,
) -> None:
    """Make an operator token: appends '<token> write *' (or read) to the tokens file, made 0600 if new, and prints
    the token, for --deploy-token or ROBOTLOOP_DEPLOY__TOKEN. The service reads the file when it starts."""
    from ..auth import add_token

    print(add_token(tokens, write=not read, prefix="rl_ops_"))  # plain print: the token alone, for $(...)


app.command("serve")(serve_command(DeployOptions, "services.deploy.app", fail))


@app.command()
def publish(
    ctx: typer.Context,
    checkpoint: Annotated[
        str,
        typer.Option(
            help="hf://buckets/.../models/<run>\\[/checkpoints/<step>] (run: latest), or a checkpoint on this "
            "machine (a lerobot-train output folder, its checkpoints/last, ...), uploaded under --to first."
        ),
    ],
    name: Annotated[str, typer.Option(help="Release name, e.g. v7 (immutable).")],
    to: Annotated[
        str | None,
        typer.Option(
            help="For a local checkpoint: the bucket folder it goes to first, as <to>/checkpoints/<step> "
            "(e.g. hf://buckets/lab/demos/models/act_cube)."
        ),
    ] = None,
    channel: Annotated[
        str | None, typer.Option(help="Point this channel (canary, stable, ...) at the release.")
    ] = None,
    key: Annotated[Path | None, typer.Option(help="Private deploy key. Default: deploy.key_file.")] = None,
    register: Annotated[
        bool, typer.Option(help="Register with the deploy service (else only store the manifest).")
    ] = True,
    onnx: Annotated[
        str | None,
        typer.Option(
            help="Export the policy to ONNX into the release: required (a policy that cannot be exported is an "
            "error naming the layer, nothing is published), optional (released without ONNX then) or off. "
            "Default: deploy.onnx (required)."
        ),
    ] = None,
    no_onnx: Annotated[bool, typer.Option("--no-onnx", help="No ONNX export: --onnx off.")] = False,
    onnx_int8: Annotated[
        bool | None,
        typer.Option(
            "--onnx-int8/--no-onnx-int8",
            help="Also the export's int8 graph (MatMul and Gemm weights in int8; the convolutions too, calibrated "
            "on 50 frames of the training data where the checkpoint's lineage names it), for robot CPUs too slow "
            "for fp32: robots run it with --backend onnx-int8. Evaluate it first (robotloop eval --backend onnx-int8). "
            "Default: deploy.onnx_int8 (off).",
        ),
    ] = None,
    deploy_url: DeployUrl = None,
    deploy_token: DeployToken = None,
    as_json: JsonOutput = False,
) -> None:
    """Sign a release manifest of a checkpoint, with its policy exported to ONNX for robots without torch, store it
    in the bucket and register it with the deploy service. A checkpoint on this machine (lerobot-train's, say) is
    uploaded to --to first: robots fetch from buckets."""
    from ..deploy.errors import OnnxExportError
    from ..deploy.keys import load_private_key
    from ..deploy.publish import ONNX_MODES, manifest_url
    from ..deploy.publish import publish as run
    from ..storage import BadBucketUrl, BucketUrl, connect

    settings = _settings(ctx)
    if no_onnx and onnx not in (None, "off"):
        raise typer.BadParameter(f"--no-onnx is --onnx off, not {onnx}", param_hint="--no-onnx")
    mode = "off" if no_onnx else onnx or settings.deploy.onnx
    if mode not in ONNX_MODES:
        raise typer.BadParameter(f"{mode!r}: use {', '.join(ONNX_MODES)}", param_hint="--onnx")
    try:
        dest = BucketUrl.parse(to) if to else None
    except BadBucketUrl as error:
        raise typer.BadParameter(str(error), param_hint="--to") from None
    signer = load_private_key(key or settings.deploy.key_file)
    deploy = _client(ctx, deploy_url, deploy_token) if register else None
    try:
        int8 = settings.deploy.onnx_int8 if onnx_int8 is None else onnx_int8
        signed = run(connect(settings), checkpoint, name, signer, deploy, channel, dest, onnx=mode, int8=int8)
    except OnnxExportError as error:  # the way out in the CLI's words: its flags
        raise fail(f"{error}. To release it for torch robots only: --onnx optional (or --no-onnx)") from None
    m = signed.manifest
    export = signed.onnx
    result = {
        "release": m.name,
        "checkpoint": m.checkpoint,
        "files": len(m.files),
        "bytes": m.total_bytes,
        "key_id": signed.key_id,
        "manifest": str(manifest_url(m.bucket, m.name)),
        "channel": channel,
        # The export's cost and check; null when none ran (--no-onnx, or the release existed and was kept).
        "onnx": None
        if export is None
        else {
            "files": list(export.files),
            "seconds": round(export.seconds, 2),
            "max_abs_diff": export.max_abs_diff,
            "bytes_new": export.bytes_new,
            "error": export.error,
            # The trainer's export of this checkpoint went in as it is; else why the one found was not taken.
            "reused": export.reused,
            "redone": export.redone,
            "int8_max_abs_diff": export.int8_max_abs_diff,
            "int8_calibration_frames": export.int8_calibration_frames,
            "int8_convolutions": export.int8_convolutions,
        },
    }
    show(result, as_json, _published_text)


def _published_text(r: dict) -> str:
    onnx = r["onnx"]
    if onnx is None:
        exported = ""
    elif onnx["error"]:
        exported = f", without ONNX ({onnx['error']}; {onnx['seconds']:.1f} s)"
    elif onnx["reused"]:
        exported = (
            f", the checkpoint's ONNX export checked in {onnx['seconds']:.1f} s and released as it is "
            f"(max |ONNX - torch| {onnx['max_abs_diff']:.1g})"
        )
    else:
        exported = (
            f", ONNX exported in {onnx['seconds']:.1f} s (max |ONNX - torch| {onnx['max_abs_diff']:.1g}, "
            f"{onnx['bytes_new'] / 1e6:.1f} MB new in the bucket)"
        )
    if onnx is not None and onnx.get("int8_max_abs_diff") is not None:
        exported += f", its int8 graph too (max |int8 - fp32| {onnx['int8_max_abs_diff']:.1g})"
    return (
        f"release {r['release']} of {r['checkpoint']}: {r['files']} files, {r['bytes'] / 1e6:.1f} MB{exported}, "
        f"signed by {r['key_id']}, manifest {r['manifest']}" + (f", channel {r['channel']}" if r["channel"] else "")
    )


@app.command()
def promote(
    ctx: typer.Context,
    release: Annotated[str, typer.Argument(help="Release name.")],
    channel: Annotated[str, typer.Option(help="Channel to point at it.")] = "stable",
    reason: Annotated[str, typer.Option(help="Recorded in the history.")] = "",
    deploy_url: DeployUrl = None,
    deploy_token: DeployToken = None,
    as_json: JsonOutput = False,
) -> None:
    """Point a channel at a release; robots on that channel pick it up within one long-poll."""
    result = _client(ctx, deploy_url, deploy_token).promote(channel, release, reason)
    show(result, as_json, lambda r: f"channel {r['channel']} -> {r['release']} (was {r['previous'] or '-'})")


@app.command()
def rollback(
    ctx: typer.Context,
    channel: Annotated[str | None, typer.Option(help="Roll this channel back to its previous release.")] = None,
    robot: Annotated[str | None, typer.Option(help="Pin this robot to the release it ran before.")] = None,
    reason: Annotated[str, typer.Option(help="Recorded in the history.")] = "",
    deploy_url: DeployUrl = None,
    deploy_token: DeployToken = None,
    as_json: JsonOutput = False,
) -> None:
    """Roll a channel (or one robot) back to the release before the current one."""
    if (channel is None) == (robot is None):
        raise typer.BadParameter("give exactly one of --channel or --robot")
    client = _client(ctx, deploy_url, deploy_token)
    if channel:
        result = client.rollback_channel(channel, reason)
        show(result, as_json, lambda r: f"channel {r['channel']} -> {r['release']} (was {r['previous'] or '-'})")
    else:
        show(_assignment(client.rollback_robot(robot, reason)), as_json, _assignment_text)


@app.command()
def register(
    ctx: typer.Context,
    robot: Annotated[str, typer.Argument(help="Robot id.")],
    channel: Annotated[str, typer.Option(help="Channel it follows.")] = "stable",
    rotate: Annotated[bool, typer.Option(help="Issue a new token to a registered robot (the old one stops).")] = False,
    deploy_url: DeployUrl = None,
    deploy_token: DeployToken = None,
    as_json: JsonOutput = False,
) -> None:
    """Register a robot; prints its token once (give it to the robot as ROBOTLOOP_ROBOT__TOKEN)."""
    token = _client(ctx, deploy_url, deploy_token).register_robot(robot, channel, rotate)
    show(
        {"robot": robot, "channel": channel, "token": token},
        as_json,
        lambda r: (
            f"robot {r['robot']} follows {r['channel']}. Its token, shown once (give it to the robot as "
            f"ROBOTLOOP_ROBOT__TOKEN):\n{r['token']}"
        ),
    )


@app.command()
def assign(
    ctx: typer.Context,
    robot: Annotated[str, typer.Argument(help="Robot id.")],
    channel: Annotated[str | None, typer.Option(help="Channel to follow.")] = None,
    release: Annotated[str | None, typer.Option(help="Pin to this release.")] = None,
    unpin: Annotated[bool, typer.Option(help="Follow the channel again.")] = False,
    deploy_url: DeployUrl = None,
    deploy_token: DeployToken = None,
    as_json: JsonOutput = False,
) -> None:
    """Move a robot to a channel, or pin it to a release."""
    result = _client(ctx, deploy_url, deploy_token).assign(robot, channel, release, unpin)
    show(_assignment(result), as_json, _assignment_text)


@app.command()
def status(
    ctx: typer.Context, deploy_url: DeployUrl = None, deploy_token: DeployToken = None, as_json: JsonOutput = False
) -> None:
    """Channels and robots: what each is assigned, what it runs, its control rate and health."""
    client = _client(ctx, deploy_url, deploy_token)
    state = client.status()
    if as_json:
        return print_json(state)
    console.print("channels: " + ", ".join(f"{k} -> {v or '-'}" for k, v in state["channels"].items()))
    table = Table("robot", "channel", "assigned", "running", "backend", "Hz", "health", "last seen")
    for r in state["robots"]:
        s = r["status"] or {}
        table.add_row(
            r["id"],
            r["channel"],
            r["assigned"] or "-",
            r["running"] or "-",
            f"{s['backend']} ({s.get('runs_on')})" if s.get("backend") else "-",
            str(s.get("control_hz", "-")),
            _health(s.get("health")),
            f"{time.time() - r['last_seen']:.0f} s ago" if r["last_seen"] else "never",
        )
    console.print(table)


@app.command()
def history(
    ctx: typer.Context,
    robot: Annotated[str | None, typer.Option(help="Only this robot.")] = None,
    channel: Annotated[str | None, typer.Option(help="Only this channel.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    deploy_url: DeployUrl = None,
    deploy_token: DeployToken = None,
    as_json: JsonOutput = False,
) -> None:
    """Publishes, promotions, swaps, rollbacks (with reasons), newest first."""
    client = _client(ctx, deploy_url, deploy_token)
    events = client.history(robot, channel, limit)
    if as_json:
        return print_json(events)
    for e in events:
        who = e["robot"] or e["channel"] or ""
        console.print(
            f"{_when(e['at'])} {e['kind']:<16} {who:<10} {e['release'] or '-'} (was {e['previous'] or '-'}) "
            f"{e['detail'] or ''}"
        )


def _when(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_s))


def _health(health: dict | None) -> str:
    return (
        ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in health.items()) if health else "-"
    )


def _assignment(a: dict) -> dict:
    """An assignment without its signed manifest (thousands of lines; `robotloop deploy` shows releases by name)."""
    return {k: v for k, v in a.items() if k != "manifest"}


def _assignment_text(a: dict) -> str:
    pinned = f"pinned to {a['release']}" if a.get("pinned") else f"runs its release {a.get('release') or '-'}"
    return f"robot {a['robot']} follows {a['channel']}, {pinned}"
