"""Takeovers in a running episode: when the policy stalls (or the user asks), an expert drives from the state the
robot is in until it is done, then hands back; the robot runtime asks `Takeovers` who drives each tick.

The policy keeps running beside the expert (its action is what a fleet dataset records as `policy_action`, and its
temporal ensemble stays fed, so the hand-back is smooth). Only the policy's own ticks count towards the episode's
length: an episode the expert took over lasts as long as the policy would have run plus the expert's steps, so a
recovery near the end of an episode is not cut off. The sim for that must allow the longer episode
(`SimControlEnv(episode_steps=policy_steps + MAX_REPLAN_STEPS)`): `Takeovers.after` ends it at the policy's share.
With `at_end`, an episode whose policy ticks run out without success is handed to the expert before it ends, once:
a policy that made progress and then stalled late (Insertion's failures reach stage 2 or 3 after ~170 steps and
sit there) never fires a stall trigger of K = 230 within 400 steps, and its failure would reach no expert.

Example:
    ```python
    >>> takeovers = Takeovers(ScriptedExpert("insertion"), StallTrigger(230), sim=lambda: env.sim, policy_steps=400)
    >>> takeovers.begin()                                         # at each episode's start
    >>> action, expert = takeovers.choose(policy_action, obs)     # each tick, before the step
    >>> over = takeovers.after(result.reward, result.success)     # after it: whether the episode ends here
    ```
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import Unprocessable

if TYPE_CHECKING:  # the sim expert imports MuJoCo: a hardware robot with a teleoperator needs none of it
    from ..sim.expert import Expert, StallTrigger, UserTrigger

log = logging.getLogger(__name__)


@dataclass
class TakeoverStats:
    """What the expert did on this robot, over all its episodes."""

    takeovers: int = 0  # hand-overs to the expert
    at_end: int = 0  # of which at the end of the policy's ticks (`at_end`), the others by the trigger
    declined: int = 0  # trigger fired, but the expert found no way to success from that state (Unrecoverable)
    expert_frames: int = 0  # ticks the expert drove
    last_declined: str | None = None  # the expert's reason, the last time it declined

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class Takeovers:
    """Who drives each tick of an episode: the policy, or the expert once `trigger` fired (module docstring).

    `sim()` gives the state the expert re-plans from (the sim robot's `AlohaSim`; None on hardware, where a
    teleoperator expert needs none). `policy_steps`: the policy's ticks after which the episode ends (None: the
    environment alone ends it). `at_end`: hand an episode whose policy ticks are spent without success to the
    expert, once, before it ends (module docstring).
    """

    def __init__(
        self,
        expert: Expert,
        trigger: StallTrigger | UserTrigger,
        sim: Callable[[], Any] = lambda: None,
        policy_steps: int | None = None,
        at_end: bool = False,
    ) -> None:
        self.expert, self.trigger, self.sim, self.policy_steps = expert, trigger, sim, policy_steps
        self.at_end = at_end
        self.stats = TakeoverStats()
        self.active = False
        self._policy_ticks, self._end_taken = 0, False

    def begin(self) -> None:
        """A new episode: the policy drives, the trigger starts over."""
        self.active, self._policy_ticks, self._end_taken = False, 0, False
        self.trigger.reset()

    def choose(self, policy_action: np.ndarray, obs: dict[str, Any]) -> tuple[np.ndarray, bool]:
        """The action to send this tick, and whether the expert chose it."""
        if self.active and self.expert.done:
            self._hand_back()
        if self.active:
            self.stats.expert_frames += 1
            return np.asarray(self.expert.act(obs), np.float32), True
        self._policy_ticks += 1
        return policy_action, False

    def after(self, reward: float | None, success: bool = False) -> bool:
        """After the tick's step: maybe hand over; whether the episode is over (the policy's ticks are spent)."""
        spent = self.policy_steps is not None and self._policy_ticks >= self.policy_steps
        if not self.active:
            fired = self.trigger.update(reward)
            last_chance = self.at_end and spent and not success and not self._end_taken
            if fired or last_chance:
                self._end_taken |= last_chance
                self._take_over(at_end=last_chance and not fired)
        return spent and not self.active

    def _take_over(self, at_end: bool) -> None:
        try:
            self.expert.start(self.sim())
        except Unprocessable as error:  # Unrecoverable: the policy goes on, the trigger may fire again
            self.stats.declined += 1
            self.stats.last_declined = str(error)
            log.info("the expert declined a takeover: %s", error)
            self._restart_trigger()
            return
        self.active = True
        self.stats.takeovers += 1
        self.stats.at_end += at_end

    def _hand_back(self) -> None:
        self.active = False
        self._restart_trigger()

    def _restart_trigger(self) -> None:
        # From the stage reached: only new progress (or another stall of K steps) fires it again.
        self.trigger.reset(getattr(self.trigger, "best", 0.0))


__all__ = ["TakeoverStats", "Takeovers"]
