"""The loop's scene seeds: what a run trains on (demos, fleet scenes, baseline demos) never meets what it is evaluated
on, and runs with different loop seeds train on different scenes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from robotloop.errors import BadValue
from robotloop.loop.pipeline import LoopSettings
from robotloop.loop.seeds import (
    BASELINE_SEEDS,
    DEMO_ATTEMPTS,
    EVAL_SEEDS,
    MAX_LOOP_SEED,
    NEAR_CANDIDATES,
    NEAR_SEEDS,
    SEED_BLOCK,
    baseline_first_seed,
    check_baseline_seeds,
    check_demo_seeds,
    check_fleet_seeds,
    demo_first_seed,
    demo_seeds_left,
    fleet_first_seed,
    near_candidates,
)
from robotloop.rounds.run import RoundSettings
from robotloop.sim.scenes import nearest_scenes, scene_points

loop_seeds = st.integers(0, MAX_LOOP_SEED)


def _fleet_ranges(seed: int, rounds: int, robots: int, episodes: int) -> list[range]:
    return [
        range(start, start + episodes)
        for k in range(1, rounds + 1)
        for i in range(robots)
        for start in [fleet_first_seed(seed, k, i, robots, episodes)]
    ]


def _overlap(a: range, b: range) -> bool:
    return max(a.start, b.start) < min(a.stop, b.stop)


@given(
    seed=loop_seeds,
    rounds=st.integers(1, 100),
    robots=st.integers(1, 64),
    episodes=st.integers(1, 10_000),
    demos=st.integers(1, 100_000),
    eval_episodes=st.integers(1, 100_000),
)
def test_a_runs_training_scenes_never_meet_its_evaluations_or_each_other(
    seed, rounds, robots, episodes, demos, eval_episodes
):
    try:
        check_fleet_seeds(rounds, robots, episodes)
        check_demo_seeds(demo_first_seed(seed), DEMO_ATTEMPTS * demos, eval_episodes)
    except BadValue:
        return  # refused before anything runs: what the next test pins down
    evaluation = range(EVAL_SEEDS, EVAL_SEEDS + eval_episodes)
    demo = range(demo_first_seed(seed), demo_first_seed(seed) + DEMO_ATTEMPTS * demos)
    baseline = range(baseline_first_seed(seed), SEED_BLOCK * seed + NEAR_SEEDS)
    fleet = _fleet_ranges(seed, rounds, robots, episodes)
    near = [near_candidates(seed, k) for k in range(1, rounds + 1)]  # the scenes demonstrated near failures
    block = range(SEED_BLOCK * seed, SEED_BLOCK * (seed + 1))
    assert block.stop <= 2**32  # numpy's seeds
    for r in [demo, baseline, *fleet, *near]:
        assert r.start >= block.start and r.stop <= block.stop  # the loop seed's own scenes
        assert not _overlap(r, evaluation)
    assert not any(_overlap(f, demo) or _overlap(f, baseline) for f in fleet)
    assert not any(_overlap(n, r) for n in near for r in [demo, baseline, *fleet])
    assert all(not _overlap(a, b) for j, a in enumerate(fleet) for b in fleet[j + 1 :])
    assert all(not _overlap(a, b) for j, a in enumerate(near) for b in near[j + 1 :])


def test_refusals_come_before_anything_runs_and_say_what_to_change():
    LoopSettings(episodes=500, eval_episodes=200)  # seeds 0-999 at most: clear of the evaluation's 1000 upwards
    with pytest.raises(BadValue, match="use loop seed 1 or above"):
        LoopSettings(episodes=501, eval_episodes=200)
    LoopSettings(episodes=5000, eval_episodes=200, seed=1)  # its demos start at 10,000,000
    with pytest.raises(BadValue, match="at most 50,000 scripted demos per run"):
        LoopSettings(episodes=50_001, seed=1)
    assert demo_first_seed(0) == 0 and fleet_first_seed(0, 1, 0, 10, 6) == 110_000  # what earlier runs used
    assert baseline_first_seed(0) == BASELINE_SEEDS
    check_baseline_seeds(0, NEAR_SEEDS - 4, 2)  # two demos, two seeds each: up to the last seed below
    with pytest.raises(BadValue, match="would reach the scenes near failures"):
        check_baseline_seeds(0, NEAR_SEEDS - 3, 2)
    with pytest.raises(BadValue, match=f"use 0 to {MAX_LOOP_SEED}"):
        demo_first_seed(MAX_LOOP_SEED + 1)
    # Live mode records until stopped: up to the evaluation's first seed under loop seed 0, the fleet's above.
    assert demo_seeds_left(0, 200) == 1000 and demo_seeds_left(990, 200) == 10 and demo_seeds_left(1100, 200) == 0
    assert demo_seeds_left(SEED_BLOCK, 200) == 100_000
    RoundSettings(rounds=39, fleet=10, fleet_episodes=6)
    with pytest.raises(BadValue, match="at most 39 rounds of that fleet"):
        RoundSettings(rounds=40, fleet=10, fleet_episodes=6)


def test_the_scenes_near_a_failure_are_the_nearest_fresh_ones_each_given_once():
    candidates = near_candidates(0, 1)
    assert len(candidates) == NEAR_CANDIDATES and candidates[0] == NEAR_SEEDS + NEAR_CANDIDATES
    failed = [1020, 1027, 1027]  # a scene twice: its second turn gets the next nearest, never the same seed again
    near = nearest_scenes("insertion", failed, candidates, per_scene=3)
    assert len(near) == len(set(near)) == 9 and set(near) <= set(candidates)
    assert near == nearest_scenes("insertion", failed, candidates, per_scene=3)  # seeds, not chance: reproducible
    pool = scene_points("insertion", candidates)
    varying = pool.max(axis=0) > pool.min(axis=0)
    assert varying.sum() == 4  # x and y of the peg and of the socket; heights and orientations are fixed
    span = pool[:, varying].max(axis=0) - pool[:, varying].min(axis=0)

    def distance(seed: int, to: int) -> float:
        a, b = scene_points("insertion", [seed, to])[:, varying]
        return float(np.linalg.norm((a - b) / span))

    # The first scene's three are nearer than every candidate left, and close: within a few percent of each range.
    first = [distance(s, failed[0]) for s in near[:3]]
    assert first == sorted(first) and max(first) < 0.1
    others = [distance(s, failed[0]) for s in candidates[:2000] if s not in near]
    assert max(first) <= min(others)
    assert nearest_scenes("transfer_cube", [7], candidates, 0) == []
    with pytest.raises(BadValue, match="need 30 candidates, not 20"):
        nearest_scenes("insertion", failed, range(20), per_scene=10)
    with pytest.raises(BadValue, match="at least 0"):
        nearest_scenes("insertion", failed, candidates, per_scene=-1)
    # A round is refused before it runs where its fleet could ask for more than its candidates.
    with pytest.raises(BadValue, match="more than a round's 10,000 candidates"):
        RoundSettings(fleet=100, fleet_episodes=20, redemo_near=10)
