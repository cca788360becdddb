"""Stand-ins for a policy that fails, to leave the sim in the states a takeover starts from (tests, benchmarks).

`FailingPolicy(task, seed, failure, at)` plays the scripted demo of `seed` and goes wrong at step `at`:

- ``freeze``: holds its last action from `at` on (a policy that stalls mid-task);
- ``shake``: the demo's arm joints with Gaussian noise (sigma 0.05 rad) up to `at`, then freezes (a shaky policy:
  the fingers bump and push the objects);
- ``drop``: opens both grippers at `at` and holds (what is held falls);
- ``zero``: the all-zero action from `at` on (arms stretched, grippers shut: the arms sweep over the table).

    >>> policy = FailingPolicy("transfer_cube", seed=3, failure="freeze", at=100)
    >>> obs = sim.reset(seed=3)
    >>> for _ in range(150): obs, *_ = sim.step(policy.act(obs))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from robotloop.errors import BadValue
from robotloop.sim.scripted import record_demo
from robotloop.sim.tasks import TaskSpec, get_task

FAILURES = ("freeze", "shake", "drop", "zero")
SHAKE_SIGMA = 0.05  # rad on each arm joint
ARM_JOINTS = np.r_[np.ones(6), 0, np.ones(6), 0]


class FailingPolicy:
    """The scripted demo of `seed`, going wrong at step `at` as `failure` says (module docstring).

    Raises:
        BadValue: an unknown `failure`, or `at` outside 1..the episode length.
    """

    def __init__(self, task: str | TaskSpec, seed: int, failure: str, at: int):
        spec = get_task(task)
        if failure not in FAILURES:
            raise BadValue(f"unknown failure {failure!r}; choose one of {', '.join(FAILURES)}")
        if not 1 <= at <= spec.episode_length:
            raise BadValue(f"at must be in 1..{spec.episode_length}, got {at}")
        self.failure, self.at, self.t = failure, at, 0
        self.demo = record_demo(spec, seed, image_size=None, max_steps=at).actions.astype(np.float64)
        if failure == "shake":
            noise = np.random.default_rng(seed).normal(0, SHAKE_SIGMA, self.demo.shape) * ARM_JOINTS
            self.demo = self.demo + noise
        self.last = self.demo[-1].copy()
        if failure == "drop":
            self.last[[6, 13]] = 1.0  # normalized gripper: 1 is open
        elif failure == "zero":
            self.last = np.zeros_like(self.last)

    def act(self, obs: dict[str, Any] | None = None) -> np.ndarray:
        self.t += 1
        return self.demo[self.t - 1] if self.t <= self.at else self.last
