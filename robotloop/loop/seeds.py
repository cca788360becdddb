"""Which scenes (sim seeds) each part of a loop run uses: disjoint by construction, so that no scene a policy is
evaluated on was trained on, and a re-run with another loop seed trains on other scenes.

Evaluations use lerobot-eval's seeds, `EVAL_SEEDS` (1000) upwards, whatever the loop seed: every run and every
round is scored on the same scenes, comparable with `lerobot-eval --seed=1000`. Loop seed `s` owns the block of
`SEED_BLOCK` seeds from `SEED_BLOCK * s`, laid out as:

- round 0's scripted demos from the block's start (loop seed 0: 0 upwards, below the evaluations' 1000);
- fleet robots from `FLEET_SEEDS` into the block, 10,000 per round and 1,000 per robot (wider for larger fleets;
  `check_fleet_seeds` refuses a run whose rounds would reach the baseline's range);
- the baseline's scripted demos from `BASELINE_SEEDS` into the block;
- the candidates for demos near the fleet's failures from `NEAR_SEEDS` into the block, `NEAR_CANDIDATES` per round
  (`robotloop.sim.scenes.nearest_scenes` picks among them).

Loop seed 0's layout is the one every earlier run used. `check_demo_seeds` refuses a recording that could reach
the evaluations' seeds (loop seed 0 with more than 500 demos: a later loop seed's demos start past them).

Example:
    ```python
    >>> demo_first_seed(1), fleet_first_seed(1, round_=2, robot=3), baseline_first_seed(1), near_candidates(1, 2)[0]
    (10000000, 10123000, 10500000, 11020000)
    ```
"""

from __future__ import annotations

from ..deploy.evaluate import DEFAULT_SEED as EVAL_SEEDS  # lerobot-eval's default start seed, 1000
from ..errors import BadValue

DEMO_ATTEMPTS = 2  # seeds a recording tries per demo at most (a failed demo moves on to the next seed)
SEED_BLOCK = 10_000_000  # each loop seed's scenes; 429 blocks fit numpy's 32-bit seeds
MAX_LOOP_SEED = 2**32 // SEED_BLOCK - 1
FLEET_SEEDS = 100_000  # + 10,000 per round + 1,000 per robot
BASELINE_SEEDS = 500_000
NEAR_SEEDS = 1_000_000  # + NEAR_CANDIDATES per round
# Candidates for the scenes near a failure: among 10,000 uniform scenes, Insertion's 3 nearest lie within ~1 cm of it
# (objects sampled over 10 x 20 cm each).
NEAR_CANDIDATES = 10_000


def _block(loop_seed: int) -> int:
    if not 0 <= loop_seed <= MAX_LOOP_SEED:
        raise BadValue(f"loop seed {loop_seed}: use 0 to {MAX_LOOP_SEED} (each owns {SEED_BLOCK:,} scene seeds)")
    return SEED_BLOCK * loop_seed


def demo_first_seed(loop_seed: int) -> int:
    """The first scene of round 0's scripted demos (a restart goes on past the committed ones)."""
    return _block(loop_seed)


def _fleet_strides(robots: int, episodes: int) -> tuple[int, int]:
    """(per robot, per round): 1,000 and 10,000 where they fit (the h200 and cpu presets), wider where not."""
    per_robot = max(1000, episodes)
    return per_robot, max(10_000, robots * per_robot)


def fleet_first_seed(loop_seed: int, round_: int, robot: int, robots: int = 10, episodes: int = 1000) -> int:
    """The first scene of fleet robot `robot` (0-based) of `robots` in round `round_`, each running `episodes`
    episodes: each robot of each round its own fresh scenes."""
    per_robot, per_round = _fleet_strides(robots, episodes)
    return _block(loop_seed) + FLEET_SEEDS + per_round * round_ + per_robot * robot


def check_fleet_seeds(rounds: int, robots: int, episodes: int) -> None:
    """Refuse a fleet whose rounds' scenes would run into the baseline's.

    Raises:
        BadValue: `rounds` rounds of `robots` robots x `episodes` episodes do not fit; the message says the most.
    """
    _, per_round = _fleet_strides(robots, episodes)
    if FLEET_SEEDS + per_round * (rounds + 1) > BASELINE_SEEDS:
        most = (BASELINE_SEEDS - FLEET_SEEDS) // per_round - 1
        raise BadValue(
            f"{rounds} rounds of {robots} robots x {episodes} episodes need more fresh scenes than a run has: "
            f"at most {most} rounds of that fleet"
        )


def baseline_first_seed(loop_seed: int) -> int:
    """The first scene of the baseline's scripted demos (each round's go on past the last one's)."""
    return _block(loop_seed) + BASELINE_SEEDS


def check_baseline_seeds(loop_seed: int, seed_start: int, demos: int) -> None:
    """Refuse baseline demos whose seeds, `DEMO_ATTEMPTS` per demo from `seed_start`, would reach the scenes near
    failures (`NEAR_SEEDS`).

    Raises:
        BadValue: they would.
    """
    if seed_start + DEMO_ATTEMPTS * demos > _block(loop_seed) + NEAR_SEEDS:
        raise BadValue(f"{demos} more baseline demos from seed {seed_start:,} would reach the scenes near failures")


def near_candidates(loop_seed: int, round_: int) -> range:
    """The fresh scenes round `round_` may demonstrate near its fleet's failures (each round its own)."""
    first = _block(loop_seed) + NEAR_SEEDS + NEAR_CANDIDATES * round_
    if first + NEAR_CANDIDATES > _block(loop_seed) + SEED_BLOCK:
        raise BadValue(f"round {round_}: past the last round with scenes of its own near its failures")
    return range(first, first + NEAR_CANDIDATES)


def demo_seeds_left(seed_start: int, eval_episodes: int) -> int:
    """How many demo seeds from `seed_start` on stay clear of the evaluations' `eval_episodes` seeds and of the
    fleet's range: what a recording without an end (live mode) may use."""
    ends = [seed_start - seed_start % SEED_BLOCK + FLEET_SEEDS]
    if seed_start < EVAL_SEEDS + eval_episodes:
        ends.append(EVAL_SEEDS)
    return max(0, min(ends) - seed_start)


def check_demo_seeds(seed_start: int, max_attempts: int, eval_episodes: int) -> None:
    """Refuse a recording whose seeds, `seed_start` up to `max_attempts` of them (failed demos move on to the next
    seed), could meet the evaluations' `eval_episodes` seeds from `EVAL_SEEDS` or run into the fleet's range.

    Raises:
        BadValue: they could; the message says what to change.
    """
    if seed_start % SEED_BLOCK + max_attempts > FLEET_SEEDS:
        raise BadValue(
            f"{max_attempts:,} demo seeds from {seed_start:,} would run into the fleet's scenes: at most "
            f"{FLEET_SEEDS // DEMO_ATTEMPTS:,} scripted demos per run"
        )
    if seed_start < EVAL_SEEDS + eval_episodes and seed_start + max_attempts > EVAL_SEEDS:
        raise BadValue(
            f"scripted demos on seeds {seed_start} to {seed_start + max_attempts - 1} could meet the evaluation's "
            f"seeds {EVAL_SEEDS} to {EVAL_SEEDS + eval_episodes - 1}: record fewer demos per run under loop seed 0, "
            f"or use loop seed 1 or above (its demos start at {SEED_BLOCK:,})"
        )


__all__ = [
    "BASELINE_SEEDS",
    "DEMO_ATTEMPTS",
    "EVAL_SEEDS",
    "FLEET_SEEDS",
    "MAX_LOOP_SEED",
    "NEAR_CANDIDATES",
    "NEAR_SEEDS",
    "SEED_BLOCK",
    "baseline_first_seed",
    "check_baseline_seeds",
    "check_demo_seeds",
    "check_fleet_seeds",
    "demo_first_seed",
    "demo_seeds_left",
    "fleet_first_seed",
    "near_candidates",
]
