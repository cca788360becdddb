"""`robotloop loop`: the main job. From nothing to a sim robot running a policy it learned, with a report."""

from __future__ import annotations

import time

import typer

from ..errors import BadInput
from ..options import typer_command
from ..rounds.options import RoundsOptions
from ..storage import connect
from .output import cli_console, quiet_encoders

console = cli_console()


@typer_command(RoundsOptions)
def loop(ctx: typer.Context, options: RoundsOptions) -> None:
    """Record demos, train ACT streaming from the bucket, publish a signed release, let a sim robot pull and run
    it, evaluate it, and write a report. With --rounds K, K rounds through a sim fleet follow: each records what
    the robots do, the expert takes over their stalls and re-demonstrates their failures, and the next release is
    promoted only if it beats stable. With nothing configured, all of it goes through the embedded bucket server
    on localhost."""
    from ..loop.pipeline import run_loop
    from ..loop.report import upload_report, write_report

    quiet_encoders()
    try:
        settings = options.settings()
        rounds = options.round_settings() if options.rounds else None
    except BadInput as error:  # an unknown task, a missing GPU, a bad recipe, rounds with --live
        raise typer.BadParameter(str(error)) from None
    step = {"n": 0, "of": settings.steps}  # "of": the steps of the training under way (a round's fine-tune: fewer)
    start = time.monotonic()

    def on_stage(stage: str, what: str) -> None:
        # Each stage says when it began: a run cut before its report (a lease ended, a crash) still tells from its
        # log where its minutes went.
        step["n"] += 1
        console.print(f"[bold]{step['n']}. {stage}[/bold]: {what} (at {(time.monotonic() - start) / 60:.1f} min)")

    def on_train(p) -> None:
        console.print(
            f"   step {p.step}/{step['of']}  loss {p.loss:.3f}  {p.samples_per_s:.0f} samples/s  "
            f"data wait {100 * p.data_wait_share:.1f}%"
        )

    def on_demo(kind: str, report) -> None:
        of = "" if settings.live else f"/{settings.episodes}"
        failed = f", {report.demos_failed} failed and dropped" if report.demos_failed else ""
        console.print(f"   demos {report.episodes}{of} in the bucket{failed}  {report.recording_s:.0f} s")

    client = connect(ctx.obj)
    if rounds is None:
        report = run_loop(settings, client, on_stage, on_train, on_demo)
        path = write_report(report)
    else:
        from ..rounds.report import write_rounds_report
        from ..rounds.run import run_rounds

        def on_round(so_far) -> None:
            r = so_far.rounds[-1]
            console.print(_round_line(r) if r.baseline is None else _baseline_line(r))
            write_rounds_report(so_far)  # as it goes: a run cut short (a lease, a crash) keeps every figure known
            step["of"] = rounds.steps or settings.steps

        rounds_report = run_rounds(settings, rounds, client, on_stage, on_train, on_demo, on_round)
        report = rounds_report.loop
        path = write_rounds_report(rounds_report)
    console.print(path.read_text().split("![loss]")[0])
    console.print(f"report: {path} (and {upload_report(client, report)})")


def _round_line(r) -> str:
    fleet = f", {r.fleet_episodes} fleet episodes, {r.takeovers} takeovers" if r.round else ""
    verdict = "" if not r.round else " (promoted)" if r.promoted else " (stable kept)"
    low, high = r.ci95
    stages = ", ".join(f"{name} {s:.0f} s" for name, s in r.stage_s.items())
    return (
        f"   round {r.round}: {r.release} success {100 * r.success_rate:.1f}% of {r.eval_episodes} "
        f"(CI {100 * low:.1f}-{100 * high:.1f}%){verdict}, {r.expert_frames} expert frames{fleet}, "
        f"{r.minutes:.1f} min ({stages})"
    )


def _baseline_line(r) -> str:
    b, (low, high) = r.baseline, r.baseline.ci95
    return (
        f"   round {r.round} baseline: {b.demos} more scripted demos ({b.expert_frames} frames) "
        f"success {100 * b.success_rate:.1f}% (CI {100 * low:.1f}-{100 * high:.1f}%), {b.minutes:.1f} min"
    )
