"""`robotloop loop --rounds K --fleet N`: round 0, then rounds through a sim fleet whose takeovers and failures
train the next release, promoted only when it beats stable; the same-expert-frames baseline beside it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import ValidationError

from robotloop.capture.recorder import camera_shadow_map
from robotloop.deploy.evaluate import EpisodeResult, EvalReport, Paired, sign_test
from robotloop.errors import BadValue
from robotloop.fleet import Takeovers
from robotloop.loop.pipeline import LoopSettings
from robotloop.rounds import fleet
from robotloop.rounds.fleet import fleet_episodes
from robotloop.rounds.options import RoundsOptions
from robotloop.rounds.report import fleet_losses, rounds_markdown
from robotloop.rounds.run import (
    STALL_MARGIN,
    STALL_STEPS,
    Baseline,
    RoundResult,
    RoundSettings,
    RoundsReport,
    has_new_draws,
    round_recipe,
    round_weights,
    split_branches,
    stall_steps_for,
)
from robotloop.sim.constants import NO_SHADOWS
from robotloop.sim.expert import StallTrigger, UserTrigger
from robotloop.storage import BucketClient, BucketUrl
from robotloop.train.checkpoint import read_lineage
from robotloop.train.layout import checkpoint_url
from tests.conftest import WRITE_TOKEN
from tests.test_loop import assert_loop_report


@pytest.mark.timeout(900)  # the suite's heaviest test: two trainings, a fleet's takeovers, a baseline
def test_a_round_through_a_fleet_records_takeovers_trains_on_them_and_reports_it(bucket_server, tmp_path):
    bucket = "hf://buckets/lab/rounds"
    cmd = [sys.executable, "-m", "robotloop.cli", "--endpoint", bucket_server.endpoint, "--token", WRITE_TOKEN]
    cmd += ["loop", "--rounds", "1", "--fleet", "2", "--fleet-episodes", "1", "--stall-steps", "10", "--baseline"]
    cmd += ["--round-lr-scale", "0.5", "--fleet-check", "--round-data-share", "0.5", "--fleet-rate-hz", "inf"]
    cmd += ["--shadow-map", "0"]  # no shadows: half a CPU frame, and the run's one rendering end to end
    cmd += ["--branches", "1"]  # the middle of the ticks after the last progress: before the stall at tick 10
    cmd += ["--redemo-near", "1"]  # a demo of the fresh scene nearest each one the policy did not win alone
    cmd += ["--episodes", "1", "--steps", "4", "--round-steps", "4", "--batch-size", "2", "--eval-episodes", "1"]
    cmd += ["--eval-max-steps", "30", "--workers", "1", "--bucket", bucket, "--report-dir", "report"]
    env = {**os.environ, "MUJOCO_GL": "egl", "COLUMNS": "60"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # The round's figure is told (and its report written) before its baseline runs: a run cut during it keeps it.
    assert 0 < run.stdout.index("   round 1: ") < run.stdout.index("   round 1 baseline: "), run.stdout[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    assert_loop_report(run, report, tmp_path / "report", client, bucket)  # round 0 is the loop, from nothing
    rounds = report["rounds"]
    assert [r["round"] for r in rounds] == [0, 1]
    assert rounds[0]["expert_frames"] == 400  # round 0's one scripted demo, the task's whole episode
    for r in rounds[1:]:
        # Each robot ran its episode on stable; the policy (4 steps of training) stalls at once: the expert took over.
        assert r["fleet_episodes"] == 2 and r["dropped"] == 0, r
        assert r["takeovers"] >= 2 and r["takeover_frames"] > 0, r
        assert r["stall_steps"] == 10 and 0 <= r["takeovers_at_end"] <= r["takeovers"]  # the K given
        assert r["expert_frames"] == r["takeover_frames"] + r["redemo_frames"] + r["branch_frames"] + r["near_frames"]
        assert r["near_frames"] == 2 * 400, r  # one whole demo near each of the two scenes taken over
        # Where the expert's demos stage went: its dataset opened, then the demos committed, within the stage.
        demos = r["demos"]
        assert demos["scenes"] >= 2 and demos["workers"] == 1 and demos["upload_s"] > 0, demos
        assert 0 < demos["opened_s"] <= demos["first_s"] <= demos["last_s"] <= r["stage_s"]["redemo"], demos
        # The expert drove again from one state each robot's policy passed through before its takeover.
        assert [row["branches"] + row["branches_declined"] for row in r["robots"]] == [1, 1], r["robots"]
        assert r["branches"] == sum(row["branches"] for row in r["robots"]) >= 1 and r["branch_frames"] > 0, r
        assert r["release"].endswith(f"-r{r['round']}-4") and r["eval_episodes"] == 1
        assert set(r["stage_s"]) >= {"fleet", "train", "publish", "evaluate", "baseline"}
        # Scene by scene against the stable it began with, on the same seeds; its baseline too.
        for versus in (r["versus_stable"], r["baseline"]["versus_stable"], r["baseline"]["round_versus"]):
            assert versus["won"] + versus["lost"] <= r["eval_episodes"] and 0 < versus["p_value"] <= 1, r
        # The round against its baseline, on the same seeds: the scenes it won less those it lost are its lead.
        lead = r["eval_episodes"] * (r["success_rate"] - r["baseline"]["success_rate"])
        assert r["baseline"]["round_versus"]["won"] - r["baseline"]["round_versus"]["lost"] == round(lead), r
        split = r["train_split_s"]  # the fine-tune's setup (its start weights' download), steps, ONNX export
        assert split["setup"] > 0 and split["steps"] > 0 and sum(split.values()) <= r["stage_s"]["train"] + 0.2
        # No export at the fine-tune's checkpoint: the publish to canary made it, in a child beside the evaluation.
        assert split["export"] == 0 and r["publish_s"] > r["stage_s"]["publish"], r
        release = BucketUrl.parse(f"{bucket}/releases/{r['release']}/manifest.json")
        signed = json.loads(client.download(release, tmp_path / f"{r['release']}.json").read_text())
        assert {"policy.onnx", "policy.onnx.data"} <= {f["path"] for f in signed["manifest"]["files"]}, signed
        assert [row["robot"] for row in r["robots"]] == ["fleet-1", "fleet-2"]
        assert all(row["episodes"] == 1 and row["error"] is None for row in r["robots"]), r["robots"]
        # Every episode and branch drive is in the bucket: nothing dropped, nothing to explain.
        assert all(row["recorded"] == 1 + row["branches"] for row in r["robots"]), r["robots"]
        assert all(row["unfinished"] == 0 and row["recording_error"] is None for row in r["robots"]), r["robots"]
        assert all(row["backend"].startswith(("torch (cpu)", "onnx (CPU")) for row in r["robots"]), r["robots"]
        for row in r["robots"]:  # where each robot's time went, in the order it happens, within the fleet stage
            marks = ["running", "assigned", "pulled", "loaded", "ready", "swapped_in", "episodes_done", "closed"]
            times = [row["timings"][k] for k in marks]
            assert times[0] > 0 and times == sorted(times) and times[-1] <= r["stage_s"]["fleet"], row["timings"]
        # Stable in lockstep on the fleet's own two scenes, paired with what the robots did alone.
        check = r["fleet_check"]
        assert check["episodes"] == 2 and "fleet_check" in r["stage_s"], r
        assert check["fleet_successes"] - check["fleet_only"] == check["eval_successes"] - check["eval_only"]
        # The baseline spent as many frames on scripted demos (whole episodes: rounded up to the next one).
        assert r["baseline"]["expert_frames"] >= r["expert_frames"] and r["baseline"]["demos"] >= 1
        # The baseline's minutes are its own, not the round's: the round's stages outlast the round without them.
        assert r["baseline"]["minutes"] * 60 == pytest.approx(r["stage_s"]["baseline"], abs=0.2)
        assert r["minutes"] * 60 < sum(r["stage_s"].values())
        # Promoted only when it beat stable (success 0 of 1 does not beat 0 of 1).
        assert r["promoted"] == (
            r["success_rate"] > max(x["success_rate"] for x in rounds[: r["round"]] if x["promoted"])
        )
    # The fleet's episodes are in the bucket, with their facts, each on a fresh scene.
    run_name = report["settings"]["run"]
    datasets = [f"{bucket}/datasets/transfer_cube-{run_name}-fleet-{i}" for i in (1, 2)]
    facts, drives = split_branches(fleet_episodes(client, datasets))
    assert len(facts) == 2 and {f["robot_id"] for f in facts} == {"fleet-1", "fleet-2"}
    assert all(f["kind"] == "takeover" and f["expert_frames"] > 0 for f in facts), facts
    assert len({f["seed"] for f in facts}) == 2 and all(f["seed"] > 100_000 for f in facts)  # fresh, unseen scenes
    # Each branch drive is an episode of expert frames, of the scene it branched from.
    assert len(drives) == rounds[1]["branches"] and {d["seed"] for d in drives} <= {f["seed"] for f in facts}
    assert all(d["expert_frames"] == d["frames"] > 0 for d in drives), drives
    # One rendering for the whole run: the demos, the fleet's episodes and the baseline's demos were filmed with the
    # run's rendering (no shadows), the policies keep it, and every evaluation rendered with it.
    for name in ("", "-fleet-1", "-fleet-2", "-baseline"):
        url = BucketUrl.parse(f"{bucket}/datasets/transfer_cube-{run_name}{name}/meta/info.json")
        info = json.loads(client.download(url, tmp_path / f"info{name}.json").read_text())
        assert camera_shadow_map(info["features"]["observation.images.top"]) == NO_SHADOWS, name
    evaluations = list((tmp_path / "report").rglob("eval_report.json"))
    assert len(evaluations) >= 3 and {json.loads(e.read_text())["shadow_map"] for e in evaluations} == {NO_SHADOWS}

    # A round fine-tunes at a fraction of the recipe's learning rate; each checkpoint's lineage.json says which.
    def lineage_of(model: str) -> dict:
        return read_lineage(client, checkpoint_url(BucketUrl.parse(f"{bucket}/models/{model}"), 4))

    assert lineage_of(f"{run_name}-r1")["act"]["lr"] == pytest.approx(0.5 * lineage_of(run_name)["act"]["lr"])
    # Half of each fine-tune's draws from the expert's gathered frames: the round's takeovers (here more frames than
    # round 0's one demo: their expert weight goes below 2), the baseline's extra demos (a factor on their dataset);
    # round 0's demos keep theirs.
    fine_tune = lineage_of(f"{run_name}-r1")["data"]["weights"]
    assert 0 < fine_tune["expert"] != 2.0 and f"{bucket}/datasets/transfer_cube-{run_name}" not in fine_tune["datasets"]
    assert fine_tune["autonomous_success"] == 0  # a round's default: the policy's own wins are not drawn
    baseline = lineage_of(f"{run_name}-baseline-r1")["data"]["weights"]
    assert set(baseline["datasets"]) == {f"{bucket}/datasets/transfer_cube-{run_name}-baseline"}
    pulled = [[row["bytes_pulled"] for row in r["robots"]] for r in rounds[1:]]
    assert all(b > 0 for b in pulled[0])
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Rounds through the fleet" in text and "baseline" in text and "fleet check: on the same 2 scenes" in text
    assert "Round 1's publish to canary, its ONNX export included, took " in text, text
    took = re.search(r"The rounds took (\d+\.\d) min", text)
    assert report["baseline_minutes"] > 0 and took, text
    assert float(took[1]) == pytest.approx(report["rounds_minutes"], abs=0.051)  # 1 decimal here, 2 in the JSON
    assert "round 1:" in run.stdout
    assert re.search(r"Round 1's training \(\d+ s\): setup \d+ s, steps \d+ s", text), text
    assert re.search(
        r"Round 1's expert demos \(\d+ s\), \d+ scenes on 1 worker: the dataset opened at \d+ s, the first demo "
        r"committed at \d+ s, the last at \d+ s; their uploads \d+ s in all, one at a time\.",
        text,
    ), text
    assert "lost episodes" not in text  # every robot's episodes are in the bucket
    assert re.search(
        r"Round 1 against stable on the same 1 seed: \d scenes? won, \d lost \(sign test p = [\d.]+\); its "
        r"baseline: \d scenes? won",
        text,
    ), text
    verdict = r"The fleet rounds (did \*\*not\*\* beat|beat) the same-expert-frames baseline(, but not beyond noise)?: "
    assert re.search(verdict + r"\d+% against \d+% \(\d scenes? won, \d lost \(sign test p = [\d.]+\)\)\.", text), text
    # Where the fleet stage went, from the robots' own marks, in the order they happen.
    timeline = re.search(r"Round 1's fleet stage \(\d+ s\), its 2 robots: (.+)\.", text)
    assert timeline, text
    marks = [
        "assigned at",
        "pulled and checked at",
        "loaded at",
        "warmed up at",
        "done with their episodes at",
        "closed at",
    ]
    assert [m for m in marks if m in timeline[1]] == marks and timeline[1].index("loaded") > timeline[1].index("pulled")


def _stalling(trigger_k: int, policy_steps: int):
    class Expert:  # a double: a teleoperator-like expert that drives 3 ticks and is done
        def __init__(self):
            self.started, self.ticks = 0, 0

        def start(self, sim=None):
            self.started += 1
            self.ticks = 0

        def act(self, obs, state=None):
            self.ticks += 1
            return np.full(14, 9.0, np.float32)

        @property
        def done(self):
            return self.ticks >= 3

    expert = Expert()
    return expert, Takeovers(expert, StallTrigger(trigger_k), policy_steps=policy_steps)


def test_a_stall_hands_over_to_the_expert_and_back_and_the_policy_share_sets_the_episode_length():
    expert, takeovers = _stalling(trigger_k=2, policy_steps=5)
    takeovers.begin()
    policy = np.zeros(14, np.float32)
    drivers, over = [], False
    while not over:
        action, by_expert = takeovers.choose(policy, {})
        drivers.append(by_expert)
        assert (action == 9.0).all() == by_expert
        over = takeovers.after(0.0)  # never any progress
    # 2 policy ticks, the stall fires, 3 expert ticks, hand-back, 2 more, it fires again: 3 more, then the 5th.
    assert drivers == [False, False, True, True, True, False, False, True, True, True, False]
    assert takeovers.stats.takeovers == 2 and takeovers.stats.expert_frames == 6 and expert.started == 2


def test_a_late_failure_goes_to_the_expert_at_the_end_once_and_a_success_does_not():
    expert, takeovers = _stalling(trigger_k=100, policy_steps=4)  # K never reached within the episode
    takeovers.at_end = True
    policy = np.zeros(14, np.float32)
    for success, want in ((False, [False] * 4 + [True] * 3 + [False]), (True, [False] * 4)):
        takeovers.begin()
        drivers, over = [], False
        while not over:
            drivers.append(takeovers.choose(policy, {})[1])
            over = takeovers.after(1.0, success=success and len(drivers) == 4)
        # The 4 policy ticks spent without success: the expert drives its 3, hands back, and the episode ends.
        assert drivers == want, (success, drivers)
    assert takeovers.stats.takeovers == 1 and expert.started == 1
    assert takeovers.stats.at_end == 1  # counted apart from the trigger's


def test_branch_points_spread_over_the_ticks_after_the_last_progress_of_episodes_the_policy_did_not_finish():
    class Sim:  # a double for the sim robot's AlohaSim: its "physical state" is the tick it is at
        tick = 0

        def physics_state(self):
            return np.array([float(self.tick)])

    sim, scene = Sim(), iter(range(100, 200))
    expert, takeovers = _stalling(trigger_k=100, policy_steps=10)
    takeovers.at_end, takeovers.branch_points, takeovers.sim = True, 2, lambda: sim
    takeovers.scene = lambda: current
    policy = np.zeros(14, np.float32)

    def episode(rewards: dict[int, float], success_at: int | None = None) -> None:
        takeovers.begin()
        sim.tick, over, reward = 0, False, 0.0
        while not over:
            by_expert = takeovers.choose(policy, {})[1]
            sim.tick += 1
            reward = rewards.get(sim.tick, reward)
            over = takeovers.after(reward, success=sim.tick == success_at and not by_expert)
            if success_at is not None and sim.tick == success_at:
                break  # the sim ends an episode at success

    current = next(scene)
    episode({4: 1.0})  # a new stage at tick 4, then nothing: spent without success, the expert takes over at the end
    # Its trail after tick 4 is ticks 5-9 (tick 10 ends it): 2 points spread over them.
    assert [(s, t, float(x[0])) for s, t, x in takeovers.branches] == [(100, 6, 6.0), (100, 8, 8.0)]
    current = next(scene)
    episode({2: 1.0}, success_at=8)  # the policy's own success: its states are no branch points
    assert len(takeovers.branches) == 2
    current = next(scene)
    episode({})  # no progress at all: spread over the whole episode (ticks 1-9)
    assert [t for _, t, _ in takeovers.branches[2:]] == [4, 7]
    takeovers.trigger = StallTrigger(4)  # progress at tick 1, then 4 without: it fires at tick 5
    current = next(scene)
    episode({1: 1.0})  # the trail ends at the takeover: ticks 2-5
    assert [(s, t) for s, t, _ in takeovers.branches[4:]] == [(103, 3), (103, 4)]
    takeovers.trigger = StallTrigger(100)
    current = next(scene)
    episode({9: 2.0})  # progress on the last kept tick: nothing after it, so the last state
    assert [(s, t) for s, t, _ in takeovers.branches[6:]] == [(104, 9)]
    with pytest.raises(BadValue, match=">= 0"):
        Takeovers(expert, StallTrigger(5), branch_points=-1)


def test_the_stall_trigger_k_stays_above_the_slowest_pace_stable_still_succeeded_at():
    def episode(success: bool, stages: tuple[int, ...], steps: int) -> EpisodeResult:
        return EpisodeResult(0, 0, success, float(len(stages)), 0.0, steps, 0.0, None, stages)

    # Stage 2 at step 90, stage 3 at 341 (251 steps without a new stage), success at 345: a stall of 251.
    slow = episode(True, (40, 90, 341, 345), 345)
    assert slow.longest_stall == 251
    stuck = episode(False, (40, 90), 400)  # a failure: the steps from its last stage to its end count too
    assert stuck.longest_stall == 310
    report = EvalReport("p", "insertion", 0, 400, None, 1, [slow, stuck, episode(True, (10, 20, 30, 40), 40)])
    assert report.longest_stall_in_successes == {"p50": 10, "p90": 251, "max": 251}
    assert report.summary["longest_stall_in_successes"]["max"] == 251  # failures do not count
    assert stall_steps_for("insertion", report) == 251 + STALL_MARGIN  # raised above the slowest success
    assert stall_steps_for("insertion", report, given=50) == 50  # the user's K stands
    fast = EvalReport("p", "insertion", 0, 400, None, 1, [episode(True, (10, 20, 30, 40), 40)])
    assert stall_steps_for("insertion", fast) == STALL_STEPS["insertion"]  # never below the task's default
    assert stall_steps_for("insertion", EvalReport("p", "insertion", 0, 400, None, 1, [stuck])) == 230


def test_an_expert_that_declines_leaves_the_policy_driving_and_is_counted():
    from robotloop.sim.expert import Unrecoverable

    class Declines:
        done = True

        def start(self, sim=None):
            raise Unrecoverable("the cube fell off the table")

        def act(self, obs, state=None):  # pragma: no cover - never asked
            raise AssertionError

    takeovers = Takeovers(Declines(), UserTrigger(), policy_steps=3)
    takeovers.begin()
    takeovers.trigger.request()
    policy = np.zeros(14, np.float32)
    assert takeovers.choose(policy, {}) == (policy, False)
    assert not takeovers.after(None)
    assert takeovers.stats.declined == 1 and "fell off" in takeovers.stats.last_declined
    assert takeovers.choose(policy, {})[1] is False


def test_rounds_options_refuse_live_mode_and_take_the_presets_values():
    h200 = RoundsOptions(preset="h200", rounds=2, device="cpu").round_settings()
    assert (h200.fleet, h200.steps) == (10, 3000)  # a round's fine-tune, not round 0's training from scratch
    # The GPU preset aims the expert near the policy's misses (what moved Insertion); the cpu one, or a user's 0, not.
    assert h200.redemo_near == 3 and RoundsOptions(rounds=1).round_settings().redemo_near == 0
    assert RoundsOptions(preset="h200", rounds=1, device="cpu", redemo_near=0).round_settings().redemo_near == 0
    assert h200.lr_scale == 0.1 and RoundsOptions(rounds=1, round_lr_scale=0.5).round_settings().lr_scale == 0.5
    assert RoundsOptions(rounds=1, fleet=3).round_settings().fleet == 3
    # A round draws no autonomous frame unless told (the trainer's own default keeps the successes at 1).
    weights = h200.weights, RoundsOptions(rounds=1, round_success_weight=0.5).round_settings().weights
    assert [(w.demo, w.expert, w.autonomous_success, w.autonomous_failed) for w in weights] == [
        (1.0, 2.0, 0.0, 0.0),
        (1.0, 2.0, 0.5, 0.0),
    ]
    with pytest.raises(BadValue, match="--rounds and --live"):
        RoundsOptions(rounds=1, live=True).round_settings()
    # The baseline beside every round, or beside the first N only (which asks for it); none unless asked.
    every = RoundsOptions(rounds=3, baseline=True).round_settings()
    first = RoundsOptions(rounds=3, baseline_rounds=1).round_settings()
    beside = [[s.baseline_beside(k) for k in (1, 2, 3)] for s in (every, first, h200)]
    assert beside == [[True, True, True], [True, False, False], [False, False, False]]
    with pytest.raises(BadValue, match="needs the baseline"):
        RoundSettings(baseline_rounds=2)
    with pytest.raises(ValidationError, match="baseline_rounds"):
        RoundsOptions(rounds=3, baseline_rounds=0)
    # A round's training: a fine-tune of stable at a tenth of the rate, or round 0's recipe and steps from scratch.
    loop = LoopSettings.preset("h200", task="insertion", device="cpu")
    steps, act = round_recipe(loop, h200)
    assert (steps, act.lr, act.lr_backbone, act.warmup_steps) == (3000, 1e-5, 1e-5, 300)
    scratch = RoundsOptions(preset="h200", rounds=1, round_from_scratch=True, device="cpu").round_settings()
    steps, act = round_recipe(loop, scratch)
    assert (steps, act.lr, act.warmup_steps) == (15000, 1e-4, 500) and act == loop.act()


def test_a_round_with_nothing_new_to_learn_is_not_trained_and_the_dashboard_says_so():
    """A fleet that won alone everywhere gave the round nothing its training would draw (its own successes weigh 0
    by default): the round keeps stable without training it again on the demos alone."""
    from robotloop.ui.runs import rounds_rows

    wins, weights = [{"success": True, "kind": "autonomous"}] * 3, round_weights()
    assert not has_new_draws(wins, weights, expert_frames=0) and not has_new_draws([], weights, 0)
    assert has_new_draws(wins, weights, expert_frames=1)  # a takeover or a re-demonstration
    assert has_new_draws(wins, replace(weights, autonomous_success=0.5), 0)  # --round-success-weight 0.5
    assert not has_new_draws([{"success": False, "kind": "autonomous"}], weights, 0)  # declined, no re-demo
    rows = rounds_rows({"rounds": [{"round": 1, "promoted": False, "trained": False}, {"round": 2, "promoted": False}]})
    assert [row["decision"] for row in rows] == ["not trained: nothing new", "kept stable"]


def test_the_report_names_each_robot_that_lost_episodes_and_why():
    """What a robot ran but its recorder did not commit is training data the round never saw: the report says which
    robot, how many and why (the run of 2026-12-06 16:06 lost 3 of a robot's 6 episodes and said nothing)."""
    row = {"robot": "fleet-1", "episodes": 6, "recorded": 6, "dropped": 0, "unfinished": 0, "recording_error": None}
    lost = {**row, "robot": "fleet-2", "recorded": 2, "dropped": 4, "recording_error": "the writer process died"}
    assert fleet_losses(SimpleNamespace(round=1, robots=[row])) is None
    branched = {**lost, "robot": "fleet-3", "branches": 2, "recorded": 7, "dropped": 1, "recording_error": None}
    assert fleet_losses(SimpleNamespace(round=1, robots=[row, lost, branched])) == (
        "Round 1's fleet lost episodes: fleet-2 ran 6 episodes and recorded 2: 4 dropped, 0 unfinished (the writer "
        "process died); fleet-3 ran 6 episodes and 2 branch drives and recorded 7: 1 dropped, 0 unfinished (no error "
        "given)."
    )


@pytest.mark.parametrize(
    ("fleet", "won", "lost", "verdict"),
    [
        (0.92, 20, 12, "The fleet rounds beat the same-expert-frames baseline, but not beyond noise: 92% against 90%"),
        (0.95, 30, 10, "The fleet rounds beat the same-expert-frames baseline beyond noise: 95% against 90%"),
        (0.89, 8, 12, "The fleet rounds did **not** beat the same-expert-frames baseline: 89% against 90%"),
    ],
)
def test_the_report_says_whether_the_fleet_beat_its_baseline_beyond_noise(fleet, won, lost, verdict):
    """A fleet round a few scenes ahead of its baseline may be chance: the run of 2026-12-07 17:38 was 92% against
    89.5% over 400 paired scenes (21 won, 12 lost, p = 0.16) and its report said "beat". The verdict pairs the
    last round with its baseline, scene by scene, and says whether the lead is beyond noise."""
    assert won - lost == round(400 * (fleet - 0.9))  # the lead, in scenes of the 400
    paired = Paired(won, lost, sign_test(won, lost))
    ci = (0.0, 1.0)
    rounds = [
        RoundResult(0, "r0", True, 0.8, ci, 400),
        RoundResult(
            1, "r1", True, 0.85, ci, 400, baseline=Baseline(60, 24000, 0.8, ci, round_versus=Paired(1, 0, 1.0))
        ),
        RoundResult(2, "r2", True, fleet, ci, 400, baseline=Baseline(67, 26800, 0.9, ci, round_versus=paired)),
    ]
    text = "\n".join(rounds_markdown(RoundsReport(SimpleNamespace(wall_s=60.0), RoundSettings(), rounds, "r2")))
    assert text.endswith(f"{verdict} ({paired.describe()}).")  # the last pair's, not round 1's
    alone = RoundsReport(SimpleNamespace(wall_s=60.0), RoundSettings(), rounds[:1], "r0")
    assert "same-expert-frames" not in "\n".join(rounds_markdown(alone))  # no baseline ran: no verdict


def _environment_probe(results, env: dict[str, str]) -> None:
    """A fleet robot's first steps (`_robot_main`), reporting what it runs with."""
    preloaded = "lerobot.policies.act.modeling_act" in sys.modules  # before anything here imported it
    fleet._as_driver(env)
    import torch

    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")  # the driver's, not the server's hidden ""
    results.put((preloaded, os.environ.get("ROBOTLOOP_PROBE"), torch.get_num_threads(), gpus))


def test_robots_are_spawned_where_a_process_forked_from_the_server_could_not_use_cuda(monkeypatch):
    """The probe's answer is kept for the driver's life: a server whose imports started CUDA (as on an H100 machine)
    would give robots that cannot load a policy onto the GPU, so they are spawned. The server's start hides the GPU
    from its imports and nothing else: the driver's environment is as it was."""
    monkeypatch.setattr(fleet, "_FORKS_USABLE", False)
    assert fleet._robot_context().get_start_method() == "spawn"
    monkeypatch.setattr(fleet, "_FORKS_USABLE", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    assert fleet._robot_context().get_start_method() == "forkserver"  # this machine's server leaves CUDA alone
    assert fleet._FORKS_USABLE is True
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7" and "PYTORCH_NVML_BASED_CUDA_CHECK" not in os.environ


def test_the_fork_server_starts_at_once_and_imports_on_its_own() -> None:
    """`start_fork_server`, which `run_rounds` calls before round 0, returns before the server has made a robot's
    imports (seconds of torch, lerobot and MuJoCo), with the driver's environment as it was; a later call leaves the
    running server alone. A fresh interpreter: this one's server may be running already."""
    code = (
        "import json, os, time, torch\n"
        "from multiprocessing import forkserver\n"
        "from robotloop.rounds import fleet\n"
        "os.environ['CUDA_VISIBLE_DEVICES'] = '3'\n"
        "t0 = time.monotonic(); fleet.start_fork_server(); took = time.monotonic() - t0\n"
        "pid = forkserver._forkserver._forkserver_pid\n"
        "fleet.start_fork_server()\n"
        "print(json.dumps([took, os.environ['CUDA_VISIBLE_DEVICES'], 'PYTORCH_NVML_BASED_CUDA_CHECK' in os.environ,\n"
        "                  pid is not None and forkserver._forkserver._forkserver_pid == pid]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=True)
    took, gpus, nvml_check, same_server = json.loads(out.stdout.splitlines()[-1])
    assert took < 1.5, f"start_fork_server waited {took:.2f} s: for the server's imports?"
    assert (gpus, nvml_check, same_server) == ("3", False, True)


def test_robots_forked_from_the_server_have_its_imports_and_the_drivers_environment_of_their_start(monkeypatch):
    """The fork server imports a robot's libraries once; each robot it forks later runs with the driver's
    environment as it is at that robot's start (here changed after the server started), thread count included."""
    ctx = fleet._robot_context()
    results = ctx.Queue()

    def robot() -> tuple:
        process = ctx.Process(target=_environment_probe, args=(results, dict(os.environ)))
        process.start()
        try:
            return results.get(timeout=180)  # the first starts the server: torch and lerobot imported once
        finally:
            process.join(timeout=30)

    monkeypatch.setenv("ROBOTLOOP_PROBE", "first")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    first = robot()
    monkeypatch.setenv("ROBOTLOOP_PROBE", "second")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert (first, robot()) == ((True, "first", 2, None), (True, "second", 1, "0"))
