"""`robotloop trainer serve`: the training service (jobs are `robotloop train` subprocesses, driven over HTTP);
`submit` a job, see one (`status JOB`) or all (`list`), `watch JOB`: its progress bar, from the service."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from services.options import serve_command
from services.trainer import TrainerOptions

from ..config import Settings, load_settings
from ..errors import RobotloopError
from ..options import typer_command
from ..train.jobs import JobSpec
from .output import JsonOutput, cli_console, fail, print_json, progress_bars, show

app = typer.Typer(
    no_args_is_help=True,
    help="The training service: `serve` takes jobs over HTTP (POST /v1/jobs, cancel, logs), `submit` sends one, "
    "`status` and `list` show them, `watch` follows one. Also spelled `robotloop train serve|submit|...`.",
)
console = cli_console()


app.command("serve")(serve_command(TrainerOptions, "services.trainer.app", fail))

TOKEN_HELP = "A write token of the service. Default: trainer.token (ROBOTLOOP_TRAINER__TOKEN), else asked."
READ_TOKEN_HELP = "A read or write token of the service. Default: trainer.token (ROBOTLOOP_TRAINER__TOKEN), else asked."
URL_HELP = "The training service. Default: trainer.url, else http://trainer.host:trainer.port."
ReadToken = Annotated[str | None, typer.Option("--trainer-token", "--service-token", help=READ_TOKEN_HELP)]
ServiceUrl = Annotated[str | None, typer.Option("--trainer-url", "--url", help=URL_HELP)]
JobId = Annotated[str, typer.Argument(help="The job's id (submit answered it).")]


@app.command()
@typer_command(JobSpec, param="spec")
def submit(
    ctx: typer.Context,
    spec: JobSpec,
    *,
    service_token: Annotated[str | None, typer.Option("--trainer-token", "--service-token", help=TOKEN_HELP)] = None,
    url: Annotated[str | None, typer.Option("--trainer-url", "--url", help=URL_HELP)] = None,
    watch_it: Annotated[bool, typer.Option("--watch", help="Then show its progress until it ends.")] = False,
    as_json: JsonOutput = False,
) -> None:
    """Submit a training job to the training service (the options are `robotloop train`'s, the job spec's own):
    prints the job's id; `robotloop trainer watch ID` follows it. With --watch --json: only its final state."""
    client = _client(ctx, url, service_token)
    state = client.submit(spec.model_dump(mode="json", exclude_none=True) | _secret(spec))
    if not (watch_it and as_json):  # one JSON document on stdout, the job's last state
        show(state, as_json, _submitted_text)
    if watch_it:
        _watch(client, state["id"], 1.0, as_json)


def _submitted_text(s: dict) -> str:
    return f"job {s['id']} {s['status']}: {s['spec']['steps']} steps to {s['spec']['output']}"


@app.command()
def status(
    ctx: typer.Context,
    job_id: JobId,
    service_token: ReadToken = None,
    url: ServiceUrl = None,
    as_json: JsonOutput = False,
) -> None:
    """A job's state: status, step, loss, speed, last checkpoint, message (--json: GET /v1/jobs/<id> as it is)."""
    show(_client(ctx, url, service_token).job(job_id), as_json, _state_text)


@app.command("list")
def list_jobs(
    ctx: typer.Context, service_token: ReadToken = None, url: ServiceUrl = None, as_json: JsonOutput = False
) -> None:
    """The jobs this token may see (their outputs' namespaces), oldest first."""
    jobs = _client(ctx, url, service_token).jobs()
    if as_json:
        return print_json(jobs)
    table = Table("job", "status", "step", "loss", "output", "last checkpoint", box=None)
    for j in jobs:
        table.add_row(j["id"], j["status"], _steps(j), _loss(j), j["spec"]["output"], j["last_checkpoint"] or "")
    console.print(table if jobs else "no jobs")


def _steps(state: dict) -> str:
    return f"{state['step'] or 0}/{state['spec']['steps']}"


def _loss(state: dict) -> str:
    return "" if state["loss"] is None else f"{state['loss']:.4f}"


def _state_text(s: dict) -> str:
    speed = "" if s["samples_per_s"] is None else f", {s['samples_per_s']:.0f} samples/s"
    loss = f", loss {_loss(s)}" if s["loss"] is not None else ""
    return (
        f"job {s['id']} {s['status']}: step {_steps(s)}{loss}{speed}, last checkpoint "
        f"{s['last_checkpoint'] or 'none'}" + (f"; {s['message']}" if s["message"] else "")
    )


@app.command()
def watch(
    ctx: typer.Context,
    job_id: JobId,
    service_token: ReadToken = None,
    url: ServiceUrl = None,
    every_s: Annotated[float, typer.Option(min=0.1, help="Seconds between polls.")] = 1.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="No bar: the job's final state as JSON, for scripts.")
    ] = False,
) -> None:
    """Show a job's progress bar until it ends; exit 0 only if it succeeded."""
    _watch(_client(ctx, url, service_token), job_id, every_s, as_json)


def _client(ctx: typer.Context, url: str | None, service_token: str | None):
    from ..train.client import TrainerClient

    settings: Settings = ctx.obj or load_settings()
    if not (service_token or settings.trainer.token):
        service_token = typer.prompt("Service token", hide_input=True)
    return TrainerClient.from_settings(settings, url, service_token)


def _secret(spec: JobSpec) -> dict:
    """The storage token, which model_dump masks, when the submitter gave one."""
    return {"storage_token": spec.storage_token.get_secret_value()} if spec.storage_token else {}


def _watch(client, job_id: str, every_s: float, as_json: bool = False) -> None:
    if as_json:
        state = client.wait(job_id, every_s=every_s)
        print_json(state)
        if state["status"] != "succeeded":
            raise typer.Exit(1)
        return
    with progress_bars(console, "{task.fields[status]}", eta=True) as bars:
        bar = bars.add_task("job", total=None, status="…", note="")

        def show(state: dict) -> None:
            note = (
                ""
                if state["step"] is None
                else (
                    f"loss {state['loss']:.3f}  {state['samples_per_s']:.0f} samples/s  "
                    f"data wait {100 * state['data_wait_share']:.1f}%"
                )
            )
            bars.update(
                bar, total=state["spec"]["steps"], completed=state["step"] or 0, status=state["status"], note=note
            )

        try:
            state = client.wait(job_id, every_s=every_s, on_state=show)
        except RobotloopError as error:
            bars.stop()
            raise fail(error) from None
    console.print(f"{state['status']}: {state['message']}; last checkpoint: {state['last_checkpoint'] or 'none'}")
    if state["status"] != "succeeded":
        raise typer.Exit(1)
