"""`robotloop loop`: record, train, publish, a sim robot runs the release, evaluate, report; and its live mode.
Real bucket server, real deploy service, real MuJoCo, tiny sizes."""

import re
import subprocess

import pytest

from robotloop.capture.info import dataset_info
from robotloop.loop import LoopSettings, run_loop
from robotloop.loop.report import markdown
from robotloop.sim.constants import NO_SHADOWS
from robotloop.storage import BucketClient, BucketUrl, Entry

from .conftest import WRITE_TOKEN

# No shadows: half of each CPU frame, in runs whose images no test compares with gym-aloha's.
TINY = dict(
    episodes=1,
    steps=4,
    batch_size=2,
    eval_episodes=1,
    eval_workers=1,
    record_workers=1,
    eval_max_steps=10,
    videos=1,
    shadow_map=NO_SHADOWS,
)


# The loop command itself, from nothing to a report, over a CLI subprocess: round 0 of
# tests/test_rounds.py's two rounds (the suite's one run of it), with `assert_loop_report` below; `make demo` runs
# the plain command in CI.


def assert_loop_report(run: subprocess.CompletedProcess, report: dict, report_dir, client: BucketClient, bucket: str):
    """What a `robotloop loop` run with one demo, 4 training steps and one evaluation episode left (round 0's)."""
    # One style for everything a person sees: the stages, progress lines, `warning: ...` lines (each once), no
    # logging format, no library prints, no Python values; piped, nothing wraps mid-sentence.
    seen = run.stdout + run.stderr
    assert re.search(r"^\s*demos 1/1 in the bucket", run.stdout, re.M), run.stdout
    assert seen.count("warning: ACT backbone: no local ResNet weights given") == 1, seen
    for bad in (r"^(WARNING|INFO|ERROR|DEBUG):", r"^\d{4}-\d\d-\d\d \d\d:\d\d", r"Loading weights", r"\(\d+, \d+\)"):
        assert not re.search(bad, seen, re.M), (bad, seen)
    assert any(len(line) > 100 for line in run.stdout.splitlines())  # the report's sentences stay whole
    # Each stage says when it began, in order: a run cut before its report still tells from its log where its time went.
    began = [float(t) for t in re.findall(r"^\d+\. \w+: .+ \(at (\d+\.\d) min\)$", run.stdout, re.M)]
    assert len(began) >= 5 and began == sorted(began), run.stdout
    assert report["episodes"] == 1 and report["bytes_uploaded"] > 0
    assert report["train"]["steps"] == 4 and report["release"].endswith("-4")
    split = report["train"]["split_s"]  # where the train stage's time went: the parts fit inside it
    assert split["setup"] > 0 and split["steps"] > 0 and sum(split.values()) <= report["stage_s"]["train"] + 0.2
    assert re.search(r"Its time: setup \d+ s, steps \d+ s", (report_dir / "report.md").read_text())
    assert report["robot_running_after_s"] < 60 and report["bytes_pulled"] > 0
    assert report["eval"]["episodes"] == 1 and 0 <= report["eval"]["success_rate"] <= 1
    assert set(report["stage_s"]) == {"record", "train", "publish", "robot", "evaluate"}
    assert report["gpu_util"] == dict.fromkeys(report["stage_s"])  # no GPU here: not measured, not 0%
    assert report["wall_s"] >= max(report["stage_s"].values())
    assert report["eval"]["verdict"].startswith(("Not usable", "Not reliable", "Good"))
    # The report beside the run in the bucket, for the team and the dashboard; nothing else of the report folder.
    run_url = BucketUrl.parse(f"{bucket}/models/{report['settings']['run']}/report")
    names = {
        e.url.path.removeprefix(run_url.path + "/") for e in client.ls(run_url, recursive=True) if isinstance(e, Entry)
    }
    assert {"report.md", "report.json", "loss.png", "stages.png", "eval/eval_report.json"} <= names
    assert not any(n.startswith(("keys", "robot-store", "staging", "deploy")) for n in names), names
    for name in ("report.md", "loss.png", "stages.png"):
        assert (report_dir / name).stat().st_size > 0
    assert "not expected to succeed" in (report_dir / "report.md").read_text()
    assert "acting in whole chunks of 10 actions" in (report_dir / "report.md").read_text()  # the tiny ACT's way
    if report["eval"]["success_rate"] < 1:  # where the failures stopped, named
        assert sum(report["eval"]["failures_by_stage"].values()) == 1
        assert "Failed episodes got as far as: " in (report_dir / "report.md").read_text()


def test_live_mode_folds_in_new_episodes_and_promotes_only_improvements(bucket_server, tmp_path):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    settings = LoopSettings(
        **TINY, live=True, live_rounds=2, bucket="hf://buckets/lab/loop-live", report_dir=tmp_path / "report"
    )
    report = run_loop(settings, client)
    assert [p["step"] for p in report.promotions] == [4, 8]
    assert report.promotions[0]["promoted"]  # the first checkpoint has nothing to beat
    assert report.episodes >= 2  # recording went on while training ran
    assert 1 <= report.promotions[0]["episodes_trained_on"] <= report.promotions[-1]["episodes_recorded"]
    assert "episodes in training" in markdown(report)
    promoted = [p["release"] for p in report.promotions if p["promoted"]]
    assert report.release == promoted[-1]
    # each later checkpoint is promoted only if it beat stable: with success 0 both times, the second is not
    if report.promotions[1]["success_rate"] <= report.promotions[0]["success_rate"]:
        assert not report.promotions[1]["promoted"]


def test_training_starts_once_the_first_demos_land_and_folds_in_the_rest(bucket_server, tmp_path):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    settings = LoopSettings(
        **{**TINY, "episodes": 3, "steps": 2},
        train_after=1,
        bucket="hf://buckets/lab/loop-overlap",
        report_dir=tmp_path / "report",
    )
    at_train_start: list[int] = []

    def on_stage(stage: str, what: str) -> None:
        if stage == "train":
            at_train_start.append(dataset_info(client, settings.dataset_url).episodes)

    report = run_loop(settings, client, on_stage)
    assert at_train_start and 1 <= at_train_start[0] < 3  # training began before recording ended
    assert report.episodes == 3 and dataset_info(client, settings.dataset_url).episodes == 3
    assert report.train.steps == 2 and report.episodes_trained_on >= 1
    # The recording's own time runs on beside training: longer than its stage, within the loop's wall time.
    assert report.stage_s["record"] < report.recording_s <= report.wall_s
    assert report.eval is not None and report.release.endswith("-2")
    with pytest.raises(ValueError, match="train_after"):
        LoopSettings(episodes=2, train_after=0)
    with pytest.raises(ValueError, match="device 'gpu'"):  # before the recording stage, not after it
        LoopSettings(device="gpu")


def test_a_later_recording_never_reuses_a_seed(monkeypatch, tmp_path):
    # Failed demos are dropped: seeds 0-4 tried, 2 committed. The next recording must start at 5, not at 2.
    from robotloop.capture.sim_record import RecordReport
    from robotloop.loop import pipeline

    starts: list[int] = []

    def fake_record_sim(
        recorder, task, episodes, workers, image_size, seed_start, max_attempts, on_event, should_stop, ray
    ):
        assert max_attempts == 2 * episodes  # what the loop checked against the evaluation's seeds
        starts.append(seed_start)
        return RecordReport(task, next_seed=seed_start + 5)

    class Recorder:
        def committed_episodes(self) -> int:
            return 2 * len(starts)

    monkeypatch.setattr(pipeline, "record_sim", fake_record_sim)  # a stand-in: the real one takes minutes here
    settings = LoopSettings(**TINY, report_dir=tmp_path)
    report = pipeline.LoopReport(settings)
    pipeline._record(Recorder(), settings, 2, report)
    pipeline._record(Recorder(), settings, 2, report)
    assert starts == [0, 5]


def test_the_h200_preset_is_checked_up_front_and_says_plainly_how_good_the_policy_is():
    from robotloop.deploy.evaluate import EpisodeResult, EvalReport
    from robotloop.loop.report import verdict

    with pytest.raises(ValueError, match="unknown policy setting"):
        LoopSettings(policy={"learning_rate": 1e-4})
    with pytest.raises(
        ValueError, match="n_action_steps=1"
    ):  # ensembling with chunked actions: refused before recording
        LoopSettings(policy={"temporal_ensemble_coeff": 0.01})
    act = LoopSettings.preset("h200", device="cpu").act()  # the recipe on top of lerobot's default-size ACT
    assert act.image_size == (120, 160) and act.backbone_norm == "batch" and act.temporal_ensemble_coeff == 0.01
    assert act.dim_model == 512 and act.lr == 1e-4 and act.lr_schedule == "cosine"
    insertion = LoopSettings.preset("h200", device="cpu", task="insertion")  # the preset's per-task values
    assert (insertion.episodes, insertion.steps, insertion.act().image_size) == (100, 15000, (240, 320))
    assert (insertion.act().n_action_steps, insertion.act().temporal_ensemble_coeff) == (100, None)  # whole chunks
    assert (insertion.policy["compile"], insertion.policy["cuda_graphs"]) == (True, True)  # on a GPU, compiled
    assert (insertion.act().compile, insertion.act().cuda_graphs) == (False, False)  # on a CPU it would not pay
    assert LoopSettings.preset("h200", device="cpu", task="insertion", steps=10).steps == 10  # the user's value wins

    def report(successes: int, n: int) -> EvalReport:
        episodes = [EpisodeResult(i, i, i < successes, 4.0, 1.0, 10, 0.1) for i in range(n)]
        return EvalReport("p", "transfer_cube", 1000, 400, (48, 64), 1, episodes)

    assert verdict(report(48, 50)).startswith("Good: it succeeds in at least 87%")
    assert verdict(report(4, 50)).startswith("Not usable")
    assert verdict(report(3, 5)).startswith("Not reliable yet")


def test_loop_flags_come_from_loop_options_and_bad_values_name_their_flag(tmp_path):
    """`robotloop loop`'s flags are LoopOptions' fields: a value left out keeps the preset's, a value given wins,
    and a bad one is a usage error naming its flag before anything runs."""
    from typer.main import get_command
    from typer.testing import CliRunner

    from robotloop.cli import app
    from robotloop.loop.options import LoopOptions
    from robotloop.options import flag

    command = get_command(app).commands["loop"]
    flags = {o for p in command.params for o in p.opts}
    assert {flag(n, f) for n, f in LoopOptions.model_fields.items()} <= flags and "--task" in flags  # LeRobot's
    insertion = LoopOptions(preset="h200", task="insertion", device="cpu", workers=3).settings()
    assert (insertion.episodes, insertion.steps, insertion.record_workers, insertion.eval_workers) == (100, 15000, 3, 3)
    assert LoopOptions(preset="h200", device="cpu", steps=10, image_size="96x128").settings().image_size == (96, 128)
    assert LoopOptions().settings().steps == LoopSettings().steps  # cpu: the dataclass's own defaults
    assert LoopOptions(ray="10.0.0.5:6379").settings().ray == "10.0.0.5:6379" and LoopSettings().ray is None

    weights = tmp_path / "none.pt"
    runner = CliRunner()
    for args, hint in [
        (["--preset", "gpu"], "--preset"),
        (["--image-size", "4x4"], "--image-size"),
        (["--steps", "0"], "--steps"),
        (["--backbone-weights", str(weights)], "--backbone-weights"),
        (["--bucket", "s3://x"], "--bucket"),
        (["--ray", "no where"], "--ray"),
    ]:
        result = runner.invoke(app, ["loop", *args, "--report-dir", str(tmp_path / "r")], env={"COLUMNS": "200"})
        assert result.exit_code == 2 and hint in result.output, (args, result.output)
    result = runner.invoke(app, ["loop", "--sim", "stacking", "--report-dir", str(tmp_path / "r")])
    assert result.exit_code == 2 and "unknown sim task 'stacking'" in " ".join(result.output.split())
    assert not (tmp_path / "r").exists()  # refused before anything ran
