"""The loop's scene seeds: what a run trains on (demos, fleet scenes, baseline demos) never meets what it is evaluated
on, and runs with different loop seeds train on different scenes."""

from __future__ import annotations

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
    SEED_BLOCK,
    baseline_first_seed,
    check_demo_seeds,
    check_fleet_seeds,
    demo_first_seed,
    demo_seeds_left,
    fleet_first_seed,
)
from robotloop.rounds.run import RoundSettings

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
    baseline = range(baseline_first_seed(seed), SEED_BLOCK * (seed + 1))
    fleet = _fleet_ranges(seed, rounds, robots, episodes)
    block = range(SEED_BLOCK * seed, SEED_BLOCK * (seed + 1))
    assert baseline.stop <= 2**32  # numpy's seeds
    for r in [demo, baseline, *fleet]:
        assert r.start >= block.start and r.stop <= block.stop  # the loop seed's own scenes
        assert not _overlap(r, evaluation)
    assert not any(_overlap(f, demo) or _overlap(f, baseline) for f in fleet)
    assert all(not _overlap(a, b) for j, a in enumerate(fleet) for b in fleet[j + 1 :])


def test_refusals_come_before_anything_runs_and_say_what_to_change():
    LoopSettings(episodes=500, eval_episodes=200)  # seeds 0-999 at most: clear of the evaluation's 1000 upwards
    with pytest.raises(BadValue, match="use loop seed 1 or above"):
        LoopSettings(episodes=501, eval_episodes=200)
    LoopSettings(episodes=5000, eval_episodes=200, seed=1)  # its demos start at 10,000,000
    with pytest.raises(BadValue, match="at most 50,000 scripted demos per run"):
        LoopSettings(episodes=50_001, seed=1)
    assert demo_first_seed(0) == 0 and fleet_first_seed(0, 1, 0, 10, 6) == 110_000  # what earlier runs used
    assert baseline_first_seed(0) == BASELINE_SEEDS
    with pytest.raises(BadValue, match=f"use 0 to {MAX_LOOP_SEED}"):
        demo_first_seed(MAX_LOOP_SEED + 1)
    # Live mode records until stopped: up to the evaluation's first seed under loop seed 0, the fleet's above.
    assert demo_seeds_left(0, 200) == 1000 and demo_seeds_left(990, 200) == 10 and demo_seeds_left(1100, 200) == 0
    assert demo_seeds_left(SEED_BLOCK, 200) == 100_000
    RoundSettings(rounds=39, fleet=10, fleet_episodes=6)
    with pytest.raises(BadValue, match="at most 39 rounds of that fleet"):
        RoundSettings(rounds=40, fleet=10, fleet_episodes=6)
