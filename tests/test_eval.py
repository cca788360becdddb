"""robotloop.deploy.evaluate and `robotloop eval`: seeded parallel sim episodes, Wilson interval, videos, report.

A tiny random-weight ACT on 48x64 images, episodes cut to a few steps: it never solves the task, which is
fine here; what is checked is the machinery around it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from robotloop.config import Settings, acting_overrides
from robotloop.deploy.evaluate import (
    MAX_BATCH,
    EpisodeResult,
    EvalReport,
    LockstepTime,
    _run_lockstep,
    describe_failures,
    evaluate,
    locate_and_evaluate,
    paired,
    resolve_policy,
    sign_test,
    wave_size,
    wilson_interval,
)
from robotloop.deploy.lockstep import SimBatch, Slot, write_video
from robotloop.deploy.runner import PolicyLoadError, PolicyRunner, make_tiny_checkpoint
from robotloop.errors import BadInput, BadValue
from robotloop.sim import AlohaSim
from robotloop.sim.constants import shadow_map_size
from robotloop.sim.scripted import record_demo
from robotloop.storage import BucketClient, BucketUrl

from .conftest import WRITE_TOKEN

SIZE = (48, 64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("policy") / "pretrained_model", SIZE)


def _decode(path: str) -> list:
    import av

    with av.open(path) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def test_wilson_interval() -> None:
    lo, hi = wilson_interval(8, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(1, 50)
    assert lo < 0.02 < hi < 0.11


def test_two_evaluations_of_the_same_seeds_are_compared_scene_by_scene(tmp_path: Path) -> None:
    """The rounds' report pairs each round with stable: the scenes one won and the other lost, and the exact sign
    test on them (the figures BENCHMARKS.md worked out by hand: 4 against 6 is noise, 14 against 1 is not)."""
    assert sign_test(4, 6) == pytest.approx(0.7539, abs=1e-4) and sign_test(6, 4) == sign_test(4, 6)
    assert sign_test(14, 1) == pytest.approx(0.00098, abs=1e-5) and sign_test(0, 0) == 1.0 and sign_test(1, 0) == 1.0

    def evaluation(successes: list[bool], first_seed: int = 1000) -> EvalReport:
        episodes = [EpisodeResult(i, first_seed + i, ok, 4 * ok, 1, 400, 1.0) for i, ok in enumerate(successes)]
        return EvalReport("p", "insertion", first_seed, 400, SIZE, 1, episodes=episodes)

    stable = evaluation([True, True, False, False, True])
    one_more = evaluation([True, True, True, False, False, False])  # seed 1005: stable never ran it, left out
    assert paired(one_more, stable).describe() == "1 scene won, 1 lost (sign test p = 1)"
    assert (paired(stable, stable).won, paired(stable, stable).lost) == (0, 0)
    with pytest.raises(BadValue, match="no common seed"):
        paired(evaluation([True], first_seed=5000), stable)
    assert paired(one_more, EvalReport.load(stable.save(tmp_path / "stable.json"))) == paired(one_more, stable)


def test_failures_are_counted_by_the_furthest_stage_they_reached_named_furthest_first() -> None:
    report = EvalReport("p", "insertion", 0, 400, SIZE, 1)
    rewards = [(4, True), (2, False), (3, False), (2, False), (0, False), (4, True)]
    report.episodes = [EpisodeResult(i, i, ok, r, r, 400, 1.0) for i, (r, ok) in enumerate(rewards)]
    assert list(report.failures_by_stage.items()) == [("peg on the socket", 1), ("both lifted", 2), ("no stage", 1)]
    assert report.summary["failures_by_stage"] == report.failures_by_stage
    assert describe_failures(report.failures_by_stage) == (
        "failed episodes got as far as: peg on the socket 1, both lifted 2, no stage 1"
    )
    cube = EvalReport("p", "transfer_cube", 0, 400, SIZE, 1, episodes=[EpisodeResult(0, 0, False, 2, 2, 400, 1.0)])
    assert cube.failures_by_stage == {"cube lifted": 1}
    assert describe_failures(EvalReport("p", "insertion", 0, 400, SIZE, 1).failures_by_stage) is None


@given(st.integers(1, 20 * MAX_BATCH))
def test_episodes_past_one_batch_run_in_the_fewest_even_waves(episodes: int) -> None:
    # A short last wave would idle the workers past its rows (400 episodes as 256 + 144 left 6 of 15 idle in the
    # second wave on the H100): the waves are as many as MAX_BATCH needs, the last short of the others by fewer
    # episodes than there are waves.
    size = wave_size(episodes)
    waves = -(-episodes // size)
    assert size <= MAX_BATCH and waves == -(-episodes // MAX_BATCH)
    assert episodes - (waves - 1) * size >= size - waves  # the last wave is nearly full
    assert (wave_size(400), wave_size(257), wave_size(MAX_BATCH)) == (200, 129, MAX_BATCH)
    assert wave_size(episodes, batch=64) == min(episodes, 64)  # a batch given is kept


def test_parallel_eval_gives_a_sane_report(tiny: Path, tmp_path: Path) -> None:
    seen = []
    report = evaluate(  # two waves: episodes 0-1 in lockstep, then 2 alone
        tiny,
        "transfer_cube",
        episodes=3,
        workers=2,
        batch=2,
        max_steps=12,
        videos=1,
        seed=7,
        output_dir=tmp_path / "out",
        on_episode=seen.append,
    )
    assert sorted(e.index for e in seen) == [0, 1, 2]
    assert [(e.index, e.seed) for e in report.episodes] == [(0, 7), (1, 8), (2, 9)]
    assert report.image_size == SIZE and report.workers == 2 and report.max_steps == 12
    assert 0.0 <= report.success_rate <= 1.0
    lo, hi = report.success_ci95
    assert lo <= report.success_rate <= hi
    for e in report.episodes:
        assert 1 <= e.steps <= 12 and 0 <= e.max_reward <= 4 and 0 <= e.sum_reward <= 4 * e.steps
        assert e.success == (e.max_reward == 4)
        # Each stage reached is stamped with the step it was first reached at, in order, within the episode.
        assert len(e.stage_steps) == int(e.max_reward) and list(e.stage_steps) == sorted(e.stage_steps)
        assert all(1 <= step <= e.steps for step in e.stage_steps)
    assert len(report.videos) == 1 and report.episodes[0].video == report.videos[0]
    frames = _decode(report.videos[0])
    assert len(frames) == report.episodes[0].steps + 1 and frames[0].shape == (*SIZE, 3)
    saved = json.loads((tmp_path / "out" / "eval_report.json").read_text())
    assert saved["summary"]["n_episodes"] == 3 and saved["summary"]["success_ci95"] == [
        lo,
        hi,
    ]
    assert [e["seed"] for e in saved["episodes"]] == [7, 8, 9]
    # Where the time went: 12 lockstep steps in each of the two waves at most, split between the policy's forward
    # passes and the sims', both inside the evaluation's wall time.
    split = report.lockstep
    assert 2 <= split.steps <= 24 and split.policy_s > 0 and split.sims_s > 0
    assert split.policy_s + split.sims_s < report.wall_s and saved["lockstep"]["steps"] == split.steps
    # Each of the two workers stepped its sims for part of that wait, rendering for part of its own.
    pairs = list(zip(split.workers_busy_s, split.workers_render_s, strict=True))
    assert len(pairs) == 2 and all(0 < rendering < busy for busy, rendering in pairs)
    assert max(split.workers_busy_s) < split.sims_s


def test_sims_in_lockstep_step_as_one_sim_does() -> None:
    """Each sim of a batch, in whichever worker process holds it, renders and steps as a lone AlohaSim of its seed
    does (the sims of one process share one renderer); an inactive sim holds still; a sim's error reaches the
    caller, and the batch still closes."""
    seeds, steps = [3, 4, 5], 12
    demos = [record_demo("transfer_cube", seed, SIZE, max_steps=steps) for seed in seeds]
    with SimBatch("transfer_cube", size=3, workers=2, image_size=SIZE, max_steps=steps) as sims:
        assert sims.rows == [(0, 2), (2, 3)]  # sims 0-1 in one process, sim 2 in the other
        images, states = sims.reset([Slot(i, seed) for i, seed in enumerate(seeds)])
        for j, demo in enumerate(demos):
            np.testing.assert_array_equal(images[j], demo.frames[0])
            np.testing.assert_array_equal(states[j], demo.states[0])
        active = np.array([True, True, False])  # sim 2 holds still from the first step
        held = images[2].copy()
        for t in range(steps - 1):
            actions = np.stack([d.actions[t] for d in demos])
            images, states, rewards, successes = sims.step(actions, active)
            for j in (0, 1):  # two sims filmed in turn by their process's one renderer
                np.testing.assert_array_equal(images[j], demos[j].frames[t + 1])
                # 1e-9 apart: the demo's sim is one cached across seeds (its solver's warm start carries over)
                np.testing.assert_allclose(states[j], demos[j].states[t + 1], atol=1e-6)
                assert rewards[j] == demos[j].rewards[t]
            np.testing.assert_array_equal(images[2], held)
            assert rewards[2] == 0 and not successes[2]
        bad = np.stack([d.actions[0] for d in demos])
        bad[2, 0] = np.nan
        with pytest.raises(ValueError, match="non-finite"):
            sims.step(bad, np.ones(3, bool))


class _Logged:
    """A runner whose actions are logged; `every_frame` makes it say that it reads every frame, so that the sims
    render every step, as they did before they rendered only the frames a policy reads."""

    def __init__(self, runner, every_frame: bool) -> None:
        self.runner, self.every_frame, self.actions = runner, every_frame, []

    def __getattr__(self, name: str):
        return getattr(self.runner, name)

    @property
    def at_chunk_boundary(self) -> bool:
        return self.every_frame or self.runner.at_chunk_boundary

    def act_batch(self, images, states):
        self.actions.append(self.runner.act_batch(images, states))
        return self.actions[-1]


def test_the_sims_render_only_the_frames_the_policy_reads_and_the_episodes_stay_the_same(
    tiny: Path, tmp_path: Path
) -> None:
    """The tiny ACT acts in whole chunks of 10: it reads one frame in ten. The sims render those (and every frame of
    a filmed episode), and each episode steps, scores and ends exactly as it does when every frame is rendered."""
    runner = PolicyRunner.load(tiny)
    slots = [Slot(0, 11, record=True), Slot(1, 12), Slot(2, 13)]
    steps = 25
    runs = {}
    for name, policy in (("read", _Logged(runner, False)), ("every", _Logged(runner, True))):
        split = LockstepTime()
        films = tmp_path / name
        with SimBatch("transfer_cube", 3, 1, SIZE, steps, video_dir=str(films)) as sims:
            results = list(_run_lockstep(policy, sims, slots, steps, split))
            split.add_workers(sims.busy())
        episodes = sorted((r.index, r.success, r.max_reward, r.sum_reward, r.steps) for r in results)
        runs[name] = (episodes, split, np.stack(policy.actions))
    assert runs["read"][0] == runs["every"][0]
    np.testing.assert_array_equal(runs["read"][2], runs["every"][2])  # the same frames seen, the same actions
    # The filmed episode's film is every frame, the same either way.
    (film,) = (tmp_path / "read").iterdir()
    assert _decode(str(film)) and len(_decode(str(film))) == steps + 1
    assert film.read_bytes() == (tmp_path / "every" / film.name).read_bytes()
    assert all(r[4] == steps for r in runs["read"][0])  # no episode ends early: every step is compared
    # Every run renders the 3 first frames. Rendering every frame: 25 steps more each. Reading: the filmed
    # episode's 25, and the others' frames before the model's passes at steps 10 and 20.
    assert runs["every"][1].workers_frames == [3 + 3 * steps]
    assert runs["read"][1].workers_frames == [3 + steps + 2 * 2]
    assert runs["read"][1].steps == runs["every"][1].steps == steps


def test_a_film_is_the_same_bytes_whatever_the_heap_held_before(tmp_path: Path) -> None:
    """The same frames make the same mp4, however full of old bytes the process's heap is. With x264's macroblock
    tree (now off) this film came out 9 ways in these 25 encodes, and a Ray actor's film of an episode, now and
    then, did not match the local one's."""
    import ctypes
    import hashlib

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    rng = np.random.default_rng(0)

    def dirty_the_heap() -> None:  # blocks of old bytes for the next allocations to find, as a busy process leaves
        sizes = rng.integers(1_000, 120_000, 200)
        blocks = [libc.malloc(int(size)) for size in sizes]
        for block, size in zip(blocks, sizes, strict=True):
            ctypes.memset(block, int(rng.integers(0, 256)), int(size))
            libc.free(block)

    frames = record_demo("transfer_cube", 13, SIZE, max_steps=16).frames
    codings = set()
    for i in range(25):
        dirty_the_heap()
        codings.add(hashlib.sha256(write_video(tmp_path / f"{i}.mp4", list(frames)).read_bytes()).hexdigest())
    assert len(codings) == 1, f"{len(codings)} codings of one film"


def test_bad_arguments_are_refused(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trained on 48x64"):
        evaluate(tiny, "transfer_cube", episodes=1, image_size=(96, 128))
    with pytest.raises(ValueError, match="output_dir"):
        evaluate(tiny, "transfer_cube", episodes=1, videos=1)
    with pytest.raises(PolicyLoadError, match="missing"):
        evaluate(tmp_path, "transfer_cube", episodes=1)
    from typer.testing import CliRunner

    from robotloop.cli import app

    usage = (["--sim", "nosuch"], ["--output-dir", str(tiny / "config.json")], ["--shadow-map", "3000"])
    usage += (["--temporal-ensemble", "often"], ["--temporal-ensemble", "0.01", "--action-steps", "5"])
    # --against: an evaluation report to compare with, of the task evaluated, sharing seeds with this evaluation
    cube = EvalReport("p", "transfer_cube", 1000, 400, SIZE, 1, [EpisodeResult(0, 1000, True, 4, 4, 400, 1.0)])
    elsewhere = cube.save(tmp_path / "cube.json")
    insertion = EvalReport("p", "insertion", 1000, 400, SIZE, 1, cube.episodes).save(tmp_path / "insertion.json")
    against = {
        "No such file or directory": tmp_path / "none.json",
        "is not an evaluation report": tiny / "config.json",
        "evaluated insertion, not transfer_cube": insertion,
        "ran seeds 1000-1000; this evaluation runs seeds 5000-5001: none in common": elsewhere,
    }
    for option in usage:  # usage errors, before work
        result = CliRunner().invoke(app, ["eval", "--policy", str(tiny), *option], env={"COLUMNS": "300"})
        assert result.exit_code == 2, result.output
    for why, path in against.items():
        args = ["eval", "--policy", str(tiny), "--against", str(path), "--seed", "5000", "--episodes", "2"]
        result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
        assert result.exit_code == 2 and why in " ".join(result.output.replace("│", " ").split()), result.output


def test_acting_overrides_take_lerobot_evals_two_knobs_and_leave_the_rest_as_saved() -> None:
    assert acting_overrides() is None
    assert acting_overrides("off") == {"temporal_ensemble_coeff": None}  # the saved n_action_steps stays
    assert acting_overrides("-0.02") == {"temporal_ensemble_coeff": -0.02, "n_action_steps": 1}  # newer weigh more
    assert acting_overrides(action_steps=20) == {"n_action_steps": 20, "temporal_ensemble_coeff": None}
    for words, steps, why in (("inf", None, "a coefficient"), ("0.01", 5, "one step per"), (None, 0, "at least 1")):
        with pytest.raises(BadValue, match=why):
            acting_overrides(words, steps)


def test_an_unknown_task_fails_before_the_policy_is_located(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="unknown ALOHA task 'juggling'"):
        locate_and_evaluate(
            Settings(),
            "hf://buckets/lab/eval/models/run1",
            "juggling",
            1,
            output_dir=tmp_path,
            client_factory=lambda: pytest.fail("the policy was fetched"),
        )


def test_resolve_policy_local_forms(tiny: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    step = run / "checkpoints" / "000020"
    step.mkdir(parents=True)
    (step / "pretrained_model").symlink_to(tiny)
    (run / "checkpoints" / "last.json").write_text(json.dumps({"step": 20}))
    assert resolve_policy(str(tiny)) == tiny
    assert resolve_policy(str(step)) == step / "pretrained_model"
    assert resolve_policy(str(run)) == step / "pretrained_model"
    with pytest.raises(PolicyLoadError, match="neither"):
        resolve_policy(str(tmp_path))
    with pytest.raises(PolicyLoadError, match="release name"):
        resolve_policy("cube@v3")
    with pytest.raises(PolicyLoadError, match="no such directory"):  # a mistyped path is not taken for a release
        resolve_policy(
            str(tmp_path / "runs" / "typo"), release_resolver=lambda name: pytest.fail("asked for a release")
        )


def test_cli_evaluates_a_checkpoint_in_a_bucket(tiny: Path, bucket_server, tmp_path: Path) -> None:
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    run = BucketUrl.parse("hf://buckets/lab/eval/models/run1")
    client.create_bucket(run)
    client.upload(tiny, run / "checkpoints" / "000005" / "pretrained_model")
    (tmp_path / "last.json").write_text(json.dumps({"step": 5}))
    client.upload(tmp_path / "last.json", run / "checkpoints" / "last.json")
    # Library: every URL form lands on the same files; a run without checkpoints is a clear error.
    cache = tmp_path / "policies"
    for form in (
        str(run),
        f"{run}/checkpoints/5",
        f"{run}/checkpoints/000005/pretrained_model",
    ):
        local = resolve_policy(form, lambda: client, cache)
        assert (local / "model.safetensors").read_bytes() == (tiny / "model.safetensors").read_bytes()
    with pytest.raises(PolicyLoadError, match="no checkpoints/last.json"):
        resolve_policy("hf://buckets/lab/eval/models/nothing", lambda: client, cache)

    env = {
        **os.environ,
        "ROBOTLOOP_STORAGE__ENDPOINT": bucket_server.endpoint,
        "ROBOTLOOP_STORAGE__TOKEN": WRITE_TOKEN,
        "ROBOTLOOP_STORAGE__CACHE_DIR": str(tmp_path / "cache" / "read-cache"),
        "COLUMNS": "200",
    }
    out = tmp_path / "eval"
    args = [
        "--policy",
        str(run),
        "--episodes",
        "2",
        "--workers",
        "1",
        "--max-steps",
        "8",
        "--videos",
        "1",
        "--output-dir",
        str(out),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "robotloop.cli", "eval", *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "success 0/2 = 0.0% (95% CI 0.0-65.8%)" in done.stdout
    assert re.search(r"^failed episodes got as far as: .+ 2$", done.stdout, re.M), done.stdout  # one stage: 8 steps
    saved = json.loads((out / "eval_report.json").read_text())
    assert saved["summary"]["n_episodes"] == 2 and saved["image_size"] == list(SIZE)
    # downloaded beside the read cache, not into ~/.cache
    downloaded = Path(saved["policy"])
    assert saved["source"] == str(run) and downloaded.is_relative_to(tmp_path / "cache" / "policies")
    # the step "latest" meant, printed before the episodes and kept in the report
    assert saved["checkpoint"] == f"{run}/checkpoints/000005" and f"policy: {run}/checkpoints/000005" in done.stdout
    assert len(_decode(saved["episodes"][0]["video"])) == 9
    assert re.search(
        r"time: \d+\.\d s in the policy's forward passes, \d+\.\d s stepping and rendering the sims "
        r"\(8 lockstep steps\); each sim worker busy \d+\.\d s on average, \d+\.\d s of it rendering",
        " ".join(done.stdout.split()),
    ), done.stdout


def _eval_json(*args: str) -> tuple[dict, str]:
    """`robotloop eval ARGS --json` in a process of its own: its JSON document and what it showed on stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "robotloop.cli", "eval", *args, "--json"],
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout), " ".join(done.stderr.split())


def test_eval_json_is_the_report_alone_on_stdout(tiny: Path, tmp_path: Path) -> None:
    """`robotloop eval --json`: stdout is one JSON document (the report, its summary, where it was saved); the
    policy line, progress and table a person sees go to stderr."""
    args = ["--policy", str(tiny), "--episodes", "1", "--max-steps", "3", "--videos", "0", "--shadow-map", "2048"]
    args += ["--action-steps", "2"]  # lerobot-eval's --policy.n_action_steps: chunks, not the saved ensembling
    report, shown = _eval_json(*args, "--output-dir", str(tmp_path / "out"))
    assert report["summary"]["n_episodes"] == 1 and report["episodes"][0]["steps"] == 3
    assert report["checkpoint"] == str(tiny.parent) and report["task"] == "transfer_cube"
    assert report["shadow_map"] == 2048  # --shadow-map reached the sims' report
    assert report["inference"]["n_action_steps"] == 2 and report["inference"]["temporal_ensemble_coeff"] is None
    assert report["report_file"] == str(tmp_path / "out" / "eval_report.json")
    assert json.loads((tmp_path / "out" / "eval_report.json").read_text())["summary"] == report["summary"]
    assert "policy: " in shown and "success 0/1" in shown
    chunk = report["inference"]["chunk_size"]
    assert f"acting on 2 of each chunk's {chunk} actions, then a new chunk" in shown

    # Again, against that evaluation: scene by scene on the seeds both ran (the same policy: nothing to tell apart).
    again, shown = _eval_json(*args, "--output-dir", str(tmp_path / "again"), "--against", report["report_file"])
    assert again["versus"] == {"won": 0, "lost": 0, "p_value": 1.0} and again["against"] == report["report_file"]
    assert "on the seeds both ran: 0 scenes won, 0 lost (sign test p = 1)" in shown


def test_given_seeds_run_in_their_order_and_must_match_the_episode_count(tiny: Path) -> None:
    """The scenes a fleet ran, evaluated in lockstep (`robotloop loop --fleet-check`): seeds as given, not seed + i."""
    report = evaluate(tiny, "transfer_cube", episodes=3, workers=1, max_steps=2, seeds=[105, 7, 42])
    assert [(e.index, e.seed) for e in report.episodes] == [(0, 105), (1, 7), (2, 42)]
    with pytest.raises(BadValue, match="2 seeds given for 3 episodes"):
        evaluate(tiny, "transfer_cube", episodes=3, max_steps=2, seeds=[1, 2])


def test_the_sims_shadow_maps_can_be_chosen_and_the_report_says_which(tiny: Path) -> None:
    """`--shadow-map`: a batch's sims film with the given maps, as a lone sim given them does (and not as the
    default's); the report records the side used, the default's too; a side the sim does not take is refused."""
    with SimBatch("transfer_cube", size=2, workers=2, image_size=SIZE, max_steps=3, shadow_map=4096) as sims:
        images, _ = sims.reset([Slot(0, 11), Slot(1, 12)])
        with (
            AlohaSim("transfer_cube", image_size=SIZE, shadow_map=4096) as lone,
            AlohaSim("transfer_cube", image_size=SIZE) as default,
        ):
            for j, seed in enumerate((11, 12)):
                np.testing.assert_array_equal(images[j], lone.reset(seed=seed)["pixels"]["top"])
            assert not np.array_equal(images[1], default.reset(seed=12)["pixels"]["top"])
    assert evaluate(tiny, "transfer_cube", episodes=1, max_steps=2, shadow_map=2048).shadow_map == 2048
    assert evaluate(tiny, "transfer_cube", episodes=1, max_steps=2).shadow_map == shadow_map_size(*SIZE) == 1024
    with pytest.raises(BadValue, match="one of 256, 512"):
        evaluate(tiny, "transfer_cube", episodes=1, max_steps=2, shadow_map=3000)


def test_the_onnx_export_evaluates_as_the_checkpoint_does(tiny: Path, tmp_path: Path) -> None:
    """`--backend onnx`: the episodes a robot without torch would run, in the same lockstep, on the same seeds."""
    import shutil

    from robotloop.deploy.errors import BackendUnavailable
    from robotloop.deploy.onnx_export import export_onnx

    with pytest.raises(BackendUnavailable, match="holds no ONNX policy"):
        evaluate(tiny, "transfer_cube", episodes=1, max_steps=2, backend="onnx")
    release = shutil.copytree(tiny, tmp_path / "release")  # a release's model folder: checkpoint and export
    export_onnx(release, release)
    runs = {
        backend: evaluate(release, "transfer_cube", episodes=2, workers=2, max_steps=20, seed=3, backend=backend)
        for backend in ("torch", "onnx")
    }
    assert runs["onnx"].inference["backend"] == "onnx" and runs["onnx"].inference["runs_on"] == "CPUExecutionProvider"
    assert runs["torch"].inference["backend"] == "torch"
    assert {k: v for k, v in runs["onnx"].inference.items() if k not in ("backend", "runs_on")} == {
        k: v for k, v in runs["torch"].inference.items() if k not in ("backend", "runs_on")
    }
    for ours, theirs in zip(runs["onnx"].episodes, runs["torch"].episodes, strict=True):
        assert (ours.seed, ours.steps, ours.success, ours.max_reward) == (
            theirs.seed,
            theirs.steps,
            theirs.success,
            theirs.max_reward,
        )
