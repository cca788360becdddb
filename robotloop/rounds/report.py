"""The rounds' report: round 0's loop report (`robotloop.loop.report`), with a `rounds` list in report.json and a
table of rounds in report.md, where the dashboard's run view finds them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..loop.report import describe_split, write_report
from . import NOT_TRAINED
from .run import RoundResult, RoundsReport

NOISE_P = 0.05  # a paired lead whose two-sided sign test's p is at least this could be chance: the report says so


def write_rounds_report(report: RoundsReport, directory: Path | None = None) -> Path:
    """Round 0's report, then the rounds added to its report.json and report.md. Returns the Markdown file."""
    path = write_report(report.loop, directory)
    summary = json.loads((path.parent / "report.json").read_text())
    summary["rounds"] = [round_row(r) for r in report.rounds]
    summary["stable"] = report.stable
    summary["rounds_minutes"] = round(report.wall_s / 60, 2)  # round 0 and the fleet rounds, the baselines apart
    summary["baseline_minutes"] = round(report.baseline_s / 60, 2)
    summary["rounds_settings"] = {k: v for k, v in vars(report.settings).items() if k != "weights"}
    summary["rounds_settings"]["weights"] = vars(report.settings.weights)
    (path.parent / "report.json").write_text(json.dumps(summary, indent=1, default=str))
    head, _, plots = path.read_text().partition("![loss]")
    path.write_text(head + "\n".join(rounds_markdown(report)) + "\n\n![loss]" + plots)
    return path


def round_row(r: RoundResult) -> dict[str, Any]:
    """One round as plain JSON types (the dashboard's `rounds` rows)."""
    row = r.as_dict()
    row["ci95"] = list(r.ci95)
    row["minutes"] = round(r.minutes, 2)
    row["stage_s"] = {k: round(v, 1) for k, v in r.stage_s.items()}
    if r.baseline is not None:
        row["baseline"]["ci95"] = list(r.baseline.ci95)
    return row


def rounds_markdown(report: RoundsReport) -> list[str]:
    lines = [
        "## Rounds through the fleet",
        "",
        "| round | release | success (95% CI) | expert frames | fleet episodes (failed; policy alone) | "
        "takeovers (at the end; stall K) | minutes | "
        "gain per 1,000 expert frames | baseline: same frames as demos |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.rounds:
        gain = "-" if r.gain_per_1000_expert_frames is None else f"{100 * r.gain_per_1000_expert_frames:+.2f} pts"
        base = "-"
        if r.baseline is not None:
            b = r.baseline
            base = f"{_pct(b.success_rate, b.ci95)} ({b.demos} demos)"
        kept = "promoted" if r.promoted else "kept stable" if r.trained else NOT_TRAINED
        fleet = f"{r.fleet_episodes} ({r.fleet_failures}; {r.autonomous_successes})" if r.round else "-"
        takeovers = f"{r.takeovers} ({r.takeovers_at_end}; K {r.stall_steps})" if r.round else "-"
        if r.branches:
            takeovers += f", {r.branches} branch drives ({r.branch_frames} frames)"
        expert = f"{r.expert_frames}"
        if r.round and (r.redemo_frames or r.near_frames):
            expert += f" ({r.redemo_frames} re-demonstrated, {r.near_frames} near the policy's misses)"
        lines.append(
            f"| {r.round} | `{r.release}` ({kept if r.round else 'stable'}) | {_pct(r.success_rate, r.ci95)} | "
            f"{expert} | {fleet} | {takeovers} | {r.minutes:.1f} | {gain} | {base} |"
        )
    lines.append("")
    for r in report.rounds:
        if against := versus_stable(r):
            lines += [against, ""]
        if timeline := fleet_timeline(r):
            lines += [timeline, ""]
        if losses := fleet_losses(r):
            lines += [losses, ""]
        if r.demos is not None:
            lines += [r.demos.describe(r.round, r.stage_s.get("redemo", 0.0)), ""]
        if r.train_split_s:
            lines += [
                f"Round {r.round}'s training ({r.stage_s['train']:.0f} s): {describe_split(r.train_split_s)}.",
                "",
            ]
        if r.publish_s is not None:
            lines += [
                f"Round {r.round}'s publish to canary, its ONNX export included, took {r.publish_s:.0f} s beside its "
                f"evaluation ({r.stage_s['evaluate']:.0f} s) and {r.stage_s['publish']:.0f} s past it.",
                "",
            ]
        if (c := r.fleet_check) is not None:
            lines.append(
                f"Round {r.round}'s fleet check: on the same {c.episodes} scenes the robots won {c.fleet_successes} "
                f"alone and stable's evaluation {c.eval_successes} ({c.fleet_only} won only by the robots, "
                f"{c.eval_only} only in the evaluation)."
            )
            lines.append("")
    took = f" The rounds took {report.wall_s / 60:.1f} min"
    took += f" (the baselines {report.baseline_s / 60:.1f} min more)." if report.baseline_s else "."
    lines.append(f"Stable runs `{report.stable}`.{took}{_versus_baseline(report)}")
    return lines


# The robots' marks, in the order they happen (`robotloop.rounds.fleet`), as the report words them.
TIMELINE = (
    ("assigned", "assigned"),
    ("pulled", "pulled and checked"),
    ("loaded", "loaded"),
    ("ready", "warmed up"),
    ("episodes_done", "done with their episodes"),
    ("branches_done", "done with the branch drives"),
    ("closed", "closed"),
)


def fleet_timeline(r: RoundResult) -> str | None:
    """Where a round's fleet stage went, from its robots' timings: each mark's range over the robots, in seconds
    since the stage began, e.g. "Round 1's fleet stage (133 s), its 10 robots: assigned at 2 s, ..., warmed up at
    27-33 s, done with their episodes at 107-130 s, ...". None for a round without robots' timings (round 0)."""
    timings = [row["timings"] for row in r.robots if row.get("timings")]
    marks = []
    for key, words in TIMELINE:
        seen = [t[key] for t in timings if t.get(key) is not None]
        if seen:
            low, high = min(seen), max(seen)
            marks.append(
                f"{words} at {low:.0f}-{high:.0f} s" if round(high) > round(low) else f"{words} at {low:.0f} s"
            )
    if not marks:
        return None
    return f"Round {r.round}'s fleet stage ({r.stage_s.get('fleet', 0):.0f} s), its {len(timings)} robots: " + (
        ", ".join(marks) + "."
    )


def versus_stable(r: RoundResult) -> str | None:
    """The round (and its baseline) against the stable it began with, scene by scene on the same seeds, e.g. "Round
    1 against stable on the same 200 seeds: 4 scenes won, 6 lost (sign test p = 0.75); its baseline: 5 scenes won, 3
    lost (sign test p = 0.73)." None for a round not trained (round 0, nothing new to learn)."""
    if r.versus_stable is None:
        return None
    seeds = f"{r.eval_episodes} seed{'s' if r.eval_episodes != 1 else ''}"
    line = f"Round {r.round} against stable on the same {seeds}: {r.versus_stable.describe()}"
    if r.baseline is not None and r.baseline.versus_stable is not None:
        line += f"; its baseline: {r.baseline.versus_stable.describe()}"
    return line + "."


def fleet_losses(r: RoundResult) -> str | None:
    """The robots that ran episodes their recorders did not commit, and why, e.g. "Round 1's fleet lost episodes:
    fleet-2 ran 6 episodes and recorded 2: 4 dropped, 0 unfinished (the recording writer process died (exit code
    -11): ...).". None when every robot's episodes are in the bucket."""
    lost = []
    for row in r.robots:
        if row.get("dropped") or row.get("unfinished"):
            ran = f"{row['episodes']} episodes" + (
                f" and {row['branches']} branch drives" if row.get("branches") else ""
            )
            lost.append(
                f"{row['robot']} ran {ran} and recorded {row['recorded']}: {row['dropped']} dropped, "
                f"{row.get('unfinished', 0)} unfinished ({row.get('recording_error') or 'no error given'})"
            )
    return f"Round {r.round}'s fleet lost episodes: " + "; ".join(lost) + "." if lost else None


def _versus_baseline(report: RoundsReport) -> str:
    """The last round that ran a baseline against it, on the same seeds, e.g. " The fleet rounds beat the
    same-expert-frames baseline, but not beyond noise: 92% against 90% (21 scenes won, 12 lost (sign test p =
    0.16))." The baselines chain as the rounds do (each trains on to the next), so the last pair spent the same
    expert frames in all."""
    last = next((r for r in reversed(report.rounds) if r.baseline is not None), None)
    if last is None:
        return ""
    base = last.baseline
    figures = f"{last.success_rate:.0%} against {base.success_rate:.0%}"
    if base.round_versus is not None:
        figures += f" ({base.round_versus.describe()})"
    if last.success_rate <= base.success_rate:
        return f" The fleet rounds did **not** beat the same-expert-frames baseline: {figures}."
    if base.round_versus is not None and base.round_versus.p_value < NOISE_P:
        return f" The fleet rounds beat the same-expert-frames baseline beyond noise: {figures}."
    return f" The fleet rounds beat the same-expert-frames baseline, but not beyond noise: {figures}."


def _pct(rate: float, ci95: tuple[float, float]) -> str:
    return f"{100 * rate:.0f}% ({100 * ci95[0]:.0f}-{100 * ci95[1]:.0f}%)"
