"""robotloop.sim: agreement with gym-aloha, observation/action shapes, scripted demos, bad input."""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from robotloop.sim import AlohaGymEnv, AlohaSim, record_demo, register_envs  # noqa: E402
from robotloop.sim.constants import (  # noqa: E402
    NO_SHADOWS,
    START_ARM_POSE,
    shadow_map_size,
)
from robotloop.sim.tasks import get_task  # noqa: E402

TASKS = ["transfer_cube", "insertion"]


def gym_aloha_env(task: str):
    """gym-aloha's own dm_control env, with rendering stubbed out (we compare physics, not pixels)."""
    env_mod = pytest.importorskip("gym_aloha.env")
    env = env_mod.AlohaEnv(task, obs_type="pixels_agent_pos", observation_height=8, observation_width=8)
    env._env.physics.render = lambda *a, **k: np.zeros((8, 8, 3), np.uint8)
    return env


@pytest.fixture(scope="module")
def demos() -> dict[str, object]:
    """A state-only scripted demo per task (seed 3), used as a realistic action sequence."""
    return {task: record_demo(task, seed=3, image_size=None) for task in TASKS}


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("seed", [0, 12345])
def test_reset_matches_gym_aloha(task: str, seed: int) -> None:
    ref = gym_aloha_env(task)
    ref_obs, _ = ref.reset(seed=seed)
    sim = AlohaSim(task, image_size=None)
    obs = sim.reset(seed=seed)
    np.testing.assert_allclose(sim.data.qpos, ref._env.physics.data.qpos, atol=1e-12)
    np.testing.assert_allclose(obs["agent_pos"], ref_obs["agent_pos"], atol=1e-12)
    np.testing.assert_allclose(sim.data.qpos[:16], START_ARM_POSE)


@pytest.mark.parametrize("task", TASKS)
def test_reset_image_matches_gym_aloha(task: str) -> None:
    """The `top` image is rendered from the same scene and camera: pixel-identical to gym-aloha's, given the same
    shadow maps (small images use smaller ones than MuJoCo's 4096: `shadow_map_size`; 480x640 keeps 4096)."""
    env_mod = pytest.importorskip("gym_aloha.env")
    ref = env_mod.AlohaEnv(task, obs_type="pixels_agent_pos", observation_height=24, observation_width=32)
    ref._env.physics.model.vis.quality.shadowsize = shadow_map_size(24, 32)  # read when its render context is made
    assert shadow_map_size(480, 640) == 4096
    inner = ref._env.task  # gym-aloha renders 3 cameras at 480x640 in get_observation: render only `top`, small
    inner.get_observation = lambda physics: {
        "qpos": inner.get_qpos(physics),
        "images": {"top": physics.render(height=24, width=32, camera_id="top")},
    }
    ref_obs, _ = ref.reset(seed=5)
    with AlohaSim(task, image_size=(24, 32)) as sim:
        obs = sim.reset(seed=5)
    np.testing.assert_array_equal(obs["pixels"]["top"], ref_obs["pixels"]["top"])


@pytest.mark.parametrize("task", TASKS)
def test_steps_match_gym_aloha(task: str, demos: dict) -> None:
    """Same seed and actions (a scripted demo that reaches reward 4) -> same rewards, same states."""
    demo = demos[task]
    ref = gym_aloha_env(task)
    ref.reset(seed=demo.seed)
    sim = AlohaSim(task, image_size=None)
    sim.reset(seed=demo.seed)
    ref_rewards, rewards = [], []
    for action in demo.actions.astype(np.float64):
        ref_obs, ref_r, ref_term, _, ref_info = ref.step(action)
        obs, r, term, _, info = sim.step(action)
        ref_rewards.append(ref_r)
        rewards.append(r)
        assert info["is_success"] == ref_info["is_success"] and term == ref_term
    np.testing.assert_allclose(sim.data.qpos, ref._env.physics.data.qpos, atol=1e-6)
    np.testing.assert_allclose(obs["agent_pos"], ref_obs["agent_pos"], atol=1e-6)
    assert rewards == ref_rewards
    assert max(rewards) == 4  # the comparison covered the whole staged reward


def test_observation_and_action_shapes() -> None:
    with AlohaSim("transfer_cube", image_size=(48, 64), seed=7) as sim:
        obs = sim.reset()
        assert sim.seed == 7
        img = obs["pixels"]["top"]
        assert img.shape == (48, 64, 3) and img.dtype == np.uint8 and img.max() > 0
        assert obs["agent_pos"].shape == (14,)
        obs, reward, terminated, truncated, info = sim.step(np.zeros(14, dtype=np.float32))
        assert obs["pixels"]["top"].shape == (48, 64, 3)
        assert isinstance(reward, float) and 0 <= reward <= 4
        assert terminated is False and truncated is False and info == {"is_success": False}
        assert sim.render().shape == (48, 64, 3)


def test_sims_share_a_camera() -> None:
    """A sim filming with another's camera sees its own scene; closing it leaves the owner's camera working; a
    camera of another size is refused."""
    with (
        AlohaSim("transfer_cube", image_size=(24, 32)) as owner,
        AlohaSim("transfer_cube", image_size=(24, 32)) as alone,
    ):
        borrower = AlohaSim("transfer_cube", image_size=(24, 32), camera=owner.camera)
        owner.reset(seed=1), alone.reset(seed=2)
        np.testing.assert_array_equal(borrower.reset(seed=2)["pixels"]["top"], alone.render())
        assert not np.array_equal(owner.render(), alone.render())  # seed 1's scene, not the last one filmed
        borrower.close()
        assert owner.render().shape == (24, 32, 3)
        with pytest.raises(ValueError, match="shared camera renders"):
            AlohaSim("transfer_cube", image_size=(48, 64), camera=owner.camera)


def test_gymnasium_api() -> None:
    import gymnasium as gym

    register_envs()
    env = gym.make("robotloop/AlohaInsertion-v0", observation_height=48, observation_width=64)
    try:
        obs, info = env.reset(seed=1)
        assert env.observation_space.contains(obs)
        assert info["is_success"] is False
        obs, reward, terminated, truncated, info = env.step(obs["agent_pos"])
        assert env.observation_space.contains(obs) and "is_success" in info
    finally:
        env.close()
    assert isinstance(env.unwrapped, AlohaGymEnv)


def test_truncation_at_episode_length() -> None:
    sim = AlohaSim("transfer_cube", image_size=None, max_episode_steps=3)
    obs = sim.reset(seed=0)
    flags = [sim.step(obs["agent_pos"])[3] for _ in range(3)]
    assert flags == [False, False, True]
    assert get_task("transfer_cube").episode_length == 400


def test_scripted_transfer_cube_demo_succeeds() -> None:
    demo = record_demo("transfer_cube", seed=0, image_size=(24, 32), shadow_map=NO_SHADOWS)
    assert demo.success and demo.max_reward == 4
    assert demo.rewards[-1] == 4  # the cube is still held by the left gripper at the end
    assert demo.frames.shape == (400, 24, 32, 3) and demo.frames.dtype == np.uint8
    assert demo.states.shape == (400, 14) and demo.states.dtype == np.float32
    assert demo.actions.shape == (400, 14) and demo.actions.dtype == np.float32
    assert demo.rewards.shape == (400,)
    np.testing.assert_allclose(demo.object_pose, get_task("transfer_cube").sample_objects(0))


def test_demos_are_deterministic(demos: dict) -> None:
    again = record_demo("insertion", seed=3, image_size=None)
    np.testing.assert_array_equal(again.actions, demos["insertion"].actions)
    np.testing.assert_array_equal(again.rewards, demos["insertion"].rewards)


def test_failed_demo_is_marked() -> None:
    """Cut short, the transfer never reaches reward 4: the demo says so."""
    demo = record_demo("transfer_cube", seed=0, image_size=None, max_steps=150)
    assert len(demo) == 150 and not demo.success and demo.max_reward < 4


@pytest.mark.parametrize("bad", [np.zeros(13), np.zeros((2, 14)), np.zeros(16), [np.nan] * 14])
def test_bad_action_raises(bad) -> None:
    sim = AlohaSim("transfer_cube", image_size=None)
    sim.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        sim.step(bad)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="unknown ALOHA task"):
        AlohaSim("stack_blocks", image_size=None)
    with pytest.raises(ValueError, match="image size"):
        AlohaSim("transfer_cube", image_size=(0, 64))
    sim = AlohaSim("insertion", image_size=None)
    with pytest.raises(ValueError, match="object_pose"):
        sim.reset(seed=0, object_pose=np.zeros(7))
    with pytest.raises(RuntimeError, match="image_size=None"):
        sim.render()


def test_a_sim_left_open_at_exit_closes_its_renderer_quietly() -> None:
    """A script that never closes its sims (one of them the scripted demos' cached one) exits with nothing on
    stderr: its renderers are closed before EGL's own exit hook ends the display, not freed after it."""
    code = (
        "from robotloop.sim.env import AlohaSim\n"
        "from robotloop.sim.scripted import record_demo\n"
        "sim = AlohaSim('transfer_cube', (24, 32)); sim.reset(seed=0)\n"
        "record_demo('transfer_cube', 0, (24, 32), max_steps=2)\n"
    )
    env = {**os.environ, "MUJOCO_GL": "egl"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "EGLError" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-3000:]
