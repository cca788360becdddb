"""Why a round loses: variants of round 1's training, side by side on one GPU, each evaluated on stable's seeds.

Run after `robotloop loop --rounds 1` (e.g. `benchmarks/h200_flywheel.sh`), in the folder that ran it (its
`loop-report/` and the embedded bucket with the demos, the fleet's datasets and stable's checkpoint):

    python3 benchmarks/round_ablation.py --variants demos,seed1,scratch --out $R/ablation

After a loop without rounds (`--rounds 0`: no fleet data, a shorter GPU call) `demos` and `seed1` still run, with the
rounds' settings of `--preset`.

Variants (each trains as the loop's round does, `robotloop.rounds.run.train_round`, unless it says otherwise):
- `demos`: the round's fine-tune from stable on the demos alone, no fleet data: what the fine-tune itself does.
- `scratch`: round 0's recipe and steps from random init on the demos and the fleet's datasets: what the fleet's data
  does without a fine-tune.
- `seed1`: round 0 again (its recipe, from random init, on the demos alone) with another seed: round 0's own spread.
- `fleet`: the round as the loop ran it, trained again (its evaluation is in the loop's report already).
Whether a round is only too weak a nudge (Insertion's rounds moved stable by +1.5 points, inside the noise):
- `long`: the round's data, three times the fine-tune's steps at 0.3x the recipe's rate (not 0.1x).
- `share50`: the round's data with the expert's frames drawn as half of every batch (`--round-data-share 0.5`).
- `withbase`: the round's data and the baseline's extra demos together (twice the expert frames; needs a loop run
  with `--baseline`).
Whether the recipe, not the data, holds Insertion near 80%:
- `twice0`: round 0 again (from random init, the demos alone) with twice its steps.
- `twicescratch`: `scratch` with twice round 0's steps.

The trainings run at once, each in its own process on the one GPU, where it has 120 GiB or more (an H200; a round's
training took ~50 GB of an H100), else one after the other, each evaluated before the next trains (so a cut run keeps
what it finished, in the order given: put the most telling first); one that fails beside the others is trained
again alone. Each checkpoint is evaluated on the loop's evaluation seeds, and its failed seeds compared with
stable's and the loop's round's. Output: `--out/ablation.json` (rewritten after each variant) and one
`eval-<variant>/eval_report.json` each.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from robotloop.deploy.evaluate import EvalReport, paired
from robotloop.loop.pipeline import LoopSettings
from robotloop.rounds.options import RoundsOptions
from robotloop.rounds.run import (
    RoundSettings,
    baseline_demos_url,
    dataset_exists,
    evaluate_checkpoint,
    fleet_dataset_urls,
    round_recipe,
    train_round,
    written_fleet_datasets,
)
from robotloop.storage import BucketUrl, connect
from robotloop.train.layout import checkpoint_url
from robotloop.train.weights import FrameWeights


@dataclass(frozen=True)
class Variant:
    datasets: str  # "demos"; "all": the demos and the fleet's datasets; "all+baseline": and the baseline's demos
    scratch: bool = False  # round 0's recipe from random init, not a fine-tune of stable
    seed: int | None = None  # None: the loop's
    steps_factor: int = 1  # times the round's fine-tuning steps (from scratch: round 0's)
    lr_scale: float | None = None  # None: the round's
    data_share: float | None = None  # None: the round's


VARIANTS = {
    "demos": Variant("demos"),
    "scratch": Variant("all", scratch=True),
    "seed1": Variant("demos", scratch=True, seed=1),
    "fleet": Variant("all"),
    "long": Variant("all", steps_factor=3, lr_scale=0.3),
    "share50": Variant("all", data_share=0.5),
    "withbase": Variant("all+baseline"),
    "twice0": Variant("demos", scratch=True, steps_factor=2),
    "twicescratch": Variant("all", scratch=True, steps_factor=2),
}


def variant_loop(loop: LoopSettings, v: Variant) -> LoopSettings:
    """The loop's settings as variant `v` trains: round 0's steps times its factor, when it trains from scratch."""
    return replace(loop, steps=loop.steps * v.steps_factor) if v.scratch else loop


def variant_rounds(rounds: RoundSettings, loop: LoopSettings, v: Variant) -> RoundSettings:
    """The rounds' settings as variant `v` trains."""
    return replace(
        rounds,
        from_scratch=v.scratch,
        steps=(rounds.steps or loop.steps) * v.steps_factor,
        lr_scale=rounds.lr_scale if v.lr_scale is None else v.lr_scale,
        data_share=rounds.data_share if v.data_share is None else v.data_share,
    )


def settings_from_report(report: dict, preset: str = "h200") -> tuple[LoopSettings, RoundSettings]:
    """The loop's and the rounds' settings as the loop's report.json saved them; for the report of a loop without
    rounds (`--rounds 0`), the rounds' settings `preset` gives."""
    s = dict(report["settings"])
    s["image_size"] = tuple(s["image_size"])
    s["report_dir"] = Path(s["report_dir"])
    s["policy"] = {k: tuple(v) if isinstance(v, list) else v for k, v in s["policy"].items()}
    if "rounds_settings" not in report:
        return LoopSettings(**s), RoundsOptions(preset=preset, task=s["task"]).round_settings()
    r = dict(report["rounds_settings"])
    r["weights"] = FrameWeights(**r["weights"])
    return LoopSettings(**s), RoundSettings(**r)


def datasets_of(loop: LoopSettings, rounds: RoundSettings, which: str, client) -> list[BucketUrl]:
    """The demos; or the demos and every fleet dataset with episodes in it; or those and the baseline's demos."""
    if which == "demos":
        return [loop.dataset_url]
    fleet = written_fleet_datasets(client, fleet_dataset_urls(loop, rounds.fleet))
    baseline = [baseline_demos_url(loop)] if which == "all+baseline" else []
    if baseline and not dataset_exists(client, baseline[0]):
        raise SystemExit(f"{baseline[0]}: no baseline demos (`withbase` needs a loop run with --baseline)")
    return [loop.dataset_url, *fleet, *baseline]


def variant_url(loop: LoopSettings, variant: str) -> BucketUrl:
    """Where the variant's run trains."""
    return BucketUrl.parse(f"{loop.bucket}/models/{loop.run}-ablation-{variant}")


def train_variant(report: dict, variant: str, preset: str) -> None:
    loop, rounds = settings_from_report(report, preset)
    v = VARIANTS[variant]
    client = connect()
    rounds = variant_rounds(rounds, loop, v)
    stable = str(checkpoint_url(loop.run_url, loop.steps))
    t0 = time.monotonic()
    datasets = datasets_of(loop, rounds, v.datasets, client)
    url = variant_url(loop, variant)
    trained = train_round(client, variant_loop(loop, v), rounds, datasets, url, stable, seed=v.seed)
    done = {"variant": variant, "steps": trained.steps, "train_s": time.monotonic() - t0}
    print(json.dumps(done | {"datasets": [str(u) for u in datasets]}), flush=True)


def train_all(args: argparse.Namespace, variants: list[str]) -> dict[str, int]:
    """Each variant's training in a child process of its own, all at once; their exit codes."""
    children = {}
    for v in variants:
        log = open(args.out / f"train-{v}.log", "a")  # noqa: SIM115 - closed with the child
        cmd = [sys.executable, __file__, "--report", str(args.report), "--preset", args.preset, "--train-one", v]
        children[v] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log)
    codes = {}
    for v, (proc, log) in children.items():
        codes[v] = proc.wait()
        log.close()
    return codes


def _gpu_gib() -> float:
    """The GPU's memory (0 without one): a round's training took ~50 GB of an H100's 80, so several fit an H200."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 0.0


def failed_seeds(path: Path) -> set[int]:
    return {e["seed"] for e in json.loads(path.read_text())["episodes"] if not e["success"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", type=Path, default=Path("loop-report/report.json"))
    ap.add_argument("--variants", default="demos,seed1,scratch")
    ap.add_argument("--out", type=Path, default=Path("ablation"))
    ap.add_argument("--preset", default="h200", help="the rounds' settings of a loop run without rounds (--rounds 0)")
    ap.add_argument("--parallel", type=int, help="trainings at once (default: all on a GPU of 120 GiB or more, else 1)")
    ap.add_argument("--train-one", help=argparse.SUPPRESS)  # a child process: train this variant and exit
    args = ap.parse_args()
    report = json.loads(args.report.read_text())
    if args.train_one:
        return train_variant(report, args.train_one, args.preset)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    loop, rounds = settings_from_report(report, args.preset)
    client = connect()  # the embedded bucket server, started once before the children share it
    at_once = args.parallel or (len(variants) if _gpu_gib() >= 120 else 1)
    stable = EvalReport.load(loop.report_dir / "eval" / "eval_report.json")
    stable_failed = {e.seed for e in stable.episodes if not e.success}
    round_report = loop.report_dir / "eval-r1" / "eval_report.json"  # none after a loop without rounds
    round_failed = failed_seeds(round_report) if round_report.exists() else None
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "run": loop.run, "task": loop.task, "trainings_at_once": at_once}
    out |= {"stable_failed": len(stable_failed), "round_failed": None if round_failed is None else len(round_failed)}
    out["variants"] = {}
    # In batches of `at_once`, each batch evaluated before the next trains: a run cut short keeps what it finished.
    for i in range(0, len(variants), at_once):
        batch, t0 = variants[i : i + at_once], time.monotonic()
        codes = train_all(args, batch)
        again = [v for v in batch if codes[v] != 0] if len(batch) > 1 else []
        for v in again:  # out of memory beside the others: alone
            codes |= train_all(args, [v])
        for v in batch:
            out["variants"][v] = {"train_exit": codes[v], "train_s": time.monotonic() - t0, "alone_again": v in again}
            if codes[v] == 0:
                out["variants"][v] |= evaluate_variant(client, loop, rounds, v, args.out, round_failed, stable)
            (args.out / "ablation.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


def evaluate_variant(
    client, loop, rounds, variant: str, out: Path, round_failed: set | None, stable: EvalReport
) -> dict:
    """The variant's checkpoint on the loop's evaluation seeds; its failed seeds against the round's (None: the loop
    ran no round) and stable's."""
    v = VARIANTS[variant]
    steps = round_recipe(variant_loop(loop, v), variant_rounds(rounds, loop, v))[0]
    e = evaluate_checkpoint(client, loop, checkpoint_url(variant_url(loop, variant), steps), f"ablation-{variant}")
    path = loop.report_dir / f"ablation-{variant}" / "eval_report.json"
    (out / f"eval-{variant}").mkdir(exist_ok=True)
    (out / f"eval-{variant}" / "eval_report.json").write_text(path.read_text())
    failed, (lo, hi) = failed_seeds(path), e.success_ci95
    in_round = None if round_failed is None else len(failed & round_failed)
    also = "no round to compare with" if in_round is None else f"{in_round} also failed in the round"
    versus = paired(e, stable)  # scene by scene on the same seeds
    print(
        f"{variant}: {e.success_rate:.1%} (CI {lo:.1%}-{hi:.1%}), {len(failed)} failed seeds, {also}; against "
        f"stable: {versus.describe()}",
        flush=True,
    )
    return {
        "success": e.success_rate,
        "ci95": [lo, hi],
        "episodes": len(e.episodes),
        "failed_seeds": sorted(failed),
        "failed_also_in_round": in_round,
        "failed_also_in_stable": sum(not x.success for x in stable.episodes if x.seed in failed),
        "versus_stable": asdict(versus),
    }


if __name__ == "__main__":
    main()
