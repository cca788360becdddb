"""The loop's report: Markdown with PNG plots (loss curve, stage times), plus JSON, under the report directory;
`upload_report` puts it beside the run in the bucket, where the dashboard and the team find it."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from ..deploy.evaluate import REPORT_FILE as EVAL_REPORT
from ..deploy.evaluate import describe_acting, describe_failures
from ..sim.constants import format_image_size
from ..storage import BucketClient, BucketUrl
from .layout import EVAL_FOLDER, run_report_url
from .pipeline import LoopReport, settings_dict


def write_report(report: LoopReport, directory: Path | None = None) -> Path:
    """Write `report.md`, `report.json`, `loss.png` and `stages.png` into `directory` (default: the settings'
    report_dir). Returns the Markdown file's path."""
    directory = directory or report.settings.report_dir
    directory.mkdir(parents=True, exist_ok=True)
    _plot_loss(report, directory / "loss.png")
    _plot_stages(report, directory / "stages.png")
    (directory / "report.json").write_text(json.dumps(summary(report), indent=1))
    path = directory / "report.md"
    path.write_text(markdown(report))
    return path


REPORT_FILES = ("report.md", "report.json", "loss.png", "stages.png")


def report_url(report: LoopReport) -> BucketUrl:
    """Where `upload_report` puts a run's report: `<bucket>/models/<run>/report`."""
    return run_report_url(report.settings.run_url)


def upload_report(client: BucketClient, report: LoopReport, directory: Path | None = None) -> BucketUrl:
    """Upload what `write_report` wrote (and the evaluation: its eval_report.json and rollout videos) to
    `report_url(report)`, in one batch. Only these files: the report directory also holds the deploy key, the
    robot's store and the recording's staging, which stay on this machine. Returns the report's URL."""
    directory = directory or report.settings.report_dir
    url = report_url(report)
    with tempfile.TemporaryDirectory() as tmp:  # one upload of the chosen files: they appear together
        staged = Path(tmp) / "report"
        staged.mkdir()
        for name in REPORT_FILES:
            if (directory / name).is_file():
                shutil.copy2(directory / name, staged / name)  # kilobytes; the videos below a few MB
        evaluation = directory / "eval"
        if (evaluation / EVAL_REPORT).is_file():
            shutil.copytree(evaluation, staged / EVAL_FOLDER)
        client.upload(staged, url)
    return url


def summary(report: LoopReport) -> dict:
    """The figures as plain JSON types."""
    t, e = report.train, report.eval
    low, high = e.success_ci95 if e else (None, None)
    return {
        "settings": settings_dict(report.settings),
        "stage_s": {k: round(v, 1) for k, v in report.stage_s.items()},
        "total_s": round(report.total_s, 1),
        "wall_s": round(report.wall_s, 1),
        "gpu_util": {k: None if v is None else round(v, 1) for k, v in report.gpu_util.items()},
        "episodes": report.episodes,
        "episodes_trained_on": report.episodes_trained_on,
        "bytes_recorded": report.bytes_recorded,
        "recording_s": round(report.recording_s, 1),
        "episodes_per_min": round(60 * report.episodes / report.recording_s, 1) if report.recording_s else None,
        "bytes_uploaded": report.bytes_uploaded,
        "train": None
        if t is None
        else {
            "steps": t.steps,
            "samples_per_s": round(t.samples_per_s, 1),
            "data_wait_share": round(t.data_wait_share, 4),
            "final_loss": t.final_loss,
            "split_s": t.split(),
        },
        "release": report.release,
        "robot_running_after_s": report.robot_running_after_s,
        "bytes_pulled": report.bytes_pulled,
        "eval": None
        if e is None
        else {
            "episodes": len(e.episodes),
            "success_rate": e.success_rate,
            "ci95": [low, high],
            "mean_max_reward": _mean([x.max_reward for x in e.episodes]),
            "failures_by_stage": e.failures_by_stage,
            "seed": e.seed,
            "inference": e.inference,
            "verdict": verdict(e),
        },
        "promotions": report.promotions,
    }


def describe_split(split: dict[str, float]) -> str:
    """A training's seconds in words (`TrainReport.split`), e.g. "setup 8 s, steps 64 s, ONNX export 12 s"."""
    return f"setup {split['setup']:.0f} s, steps {split['steps']:.0f} s" + (
        f", ONNX export {split['export']:.0f} s" if split["export"] else ""
    )


def markdown(report: LoopReport) -> str:
    s, d = report.settings, summary(report)
    lines = [
        f"# robotloop loop: {s.run}",
        "",
        (
            f"{s.task}, {s.episodes} demos at {format_image_size(s.image_size)}, "
            f"{'tiny' if s.tiny_policy else 'default'} ACT{_sees(s)}, {s.steps} steps at batch {s.batch_size} on "
            f"{s.device}."
        ),
        "",
        "| stage | seconds | GPU busy |",
        "|---|---|---|",
    ]
    busy = {k: "-" if v is None else f"{v:.0f}%" for k, v in report.gpu_util.items()}
    lines += [f"| {k} | {v:.1f} | {busy.get(k, '-')} |" for k, v in report.stage_s.items()]
    lines += [f"| **total** | **{report.total_s:.1f}** | |", ""]
    ratio = report.bytes_uploaded / report.bytes_recorded if report.bytes_recorded else float("nan")
    lines.append(
        f"- Episodes recorded: {report.episodes} in {report.recording_s:.1f} s of recording"
        f"{f' ({rate} episodes/min)' if (rate := d['episodes_per_min']) else ''}; "
        f"bytes recorded {report.bytes_recorded / 1e6:.2f} MB, "
        f"uploaded {report.bytes_uploaded / 1e6:.2f} MB ({ratio:.2f}x, Xet dedup and metadata included)."
    )
    if (t := d["train"]) is not None:
        lines.append(
            f"- Training: {t['steps']} steps, {t['samples_per_s']} samples/s, data wait "
            f"{100 * t['data_wait_share']:.1f}%, final loss {t['final_loss']:.4f}; {report.episodes_trained_on} "
            f"episodes in its buffer at the end. Its time: {describe_split(t['split_s'])}."
        )
    if report.release:
        lines.append(
            f"- Release `{report.release}`: the sim robot ran it {report.robot_running_after_s:.1f} s after it "
            f"started (pulled {report.bytes_pulled / 1e6:.1f} MB, signature and hashes checked)."
        )
    if (e := d["eval"]) is not None:
        low, high = e["ci95"]
        acting = describe_acting(e.get("inference"))
        lines.append(
            f"- Evaluation: success {100 * e['success_rate']:.0f}% over {e['episodes']} episodes "
            f"(95% CI {100 * low:.0f}-{100 * high:.0f}%), mean max reward {e['mean_max_reward']:.2f}"
            + (f", {acting}." if acting else ".")
        )
        if failures := describe_failures(e.get("failures_by_stage") or {}):
            lines.append(f"  {failures[0].upper()}{failures[1:]}.")
        lines.append(f"  **{e['verdict']}**")
        if s.tiny_policy:
            lines.append(
                "  This is a short run of a small policy: it is not expected to succeed. "
                "`robotloop loop --preset h200` trains the real one."
            )
    for p in report.promotions:
        verdict = "promoted to stable" if p["promoted"] else "kept on canary"
        lines.append(
            f"- Live: {p['release']} (step {p['step']}, {p['episodes_trained_on']} episodes in training, "
            f"{p['episodes_recorded']} recorded) "
            f"success {100 * p['success_rate']:.0f}%: {verdict}."
        )
    lines += ["", "![loss](loss.png)", "", "![stages](stages.png)", ""]
    return "\n".join(lines)


def _sees(s) -> str:
    size = s.policy.get("image_size")
    return f" seeing {format_image_size(size)}" if size else ""


def verdict(e) -> str:
    """Plainly, whether the policy is any good, from the lower and upper ends of its 95% interval."""
    low, high = e.success_ci95
    if low >= 0.8:
        return f"Good: it succeeds in at least {100 * low:.0f}% of episodes (95% confidence)."
    if high < 0.5:
        return f"Not usable: it fails in most episodes (success at most {100 * high:.0f}%, 95% confidence)."
    return (
        f"Not reliable yet: success is somewhere between {100 * low:.0f}% and {100 * high:.0f}% "
        "(95% confidence); train longer, on more demos, or evaluate on more episodes."
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _plot_loss(report: LoopReport, path: Path) -> None:
    from ..train.checkpoint import plot_losses

    plot_losses(report.train.losses if report.train else [], path)


def _plot_stages(report: LoopReport, path: Path) -> None:
    # not pyplot: no global backend switch, no display needed
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 2.5))
    ax = fig.subplots()
    names = list(report.stage_s)
    ax.barh(names, [report.stage_s[n] for n in names], color="#4c72b0")
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title("time per stage")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
