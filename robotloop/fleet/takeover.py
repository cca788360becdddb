"""Takeovers in a running episode: when the policy stalls (or the user asks), an expert drives from the state the
robot is in until it is done, then hands back; the robot runtime asks `Takeovers` who drives each tick.

The policy keeps running beside the expert (its action is what a fleet dataset records as `policy_action`, and its
temporal ensemble stays fed, so the hand-back is smooth); a policy acting in whole chunks plans a new one at the
hand-back (`handing_back`), from the state the expert leaves, not from the one its queued chunk was planned at. Only
the policy's own ticks count towards the episode's length: an episode the expert took over lasts as long as the
policy would have run plus the expert's steps, so a recovery near the end of an episode is not cut off. The sim for
that must allow the longer episode (`SimControlEnv(episode_steps=policy_steps + MAX_REPLAN_STEPS)`):
`Takeovers.after` ends it at the policy's share. With `at_end`, an episode whose policy ticks run out without
success is handed to the expert before it ends, once: a policy that made progress and then stalled late (Insertion's
failures reach stage 2 or 3 after ~170 steps and sit there) never fires a stall trigger of K = 230 within 400 steps,
and its failure would reach no expert.

With `branch_points` N (a sim's option), the physical state is kept at each of the policy's ticks until the expert
first takes over. An episode the policy did not finish alone hands N of them to `branches`: spread evenly over the
ticks after the policy's last progress (the tick it last reached a new reward stage), where it went wrong. The expert
can drive again from each later (`robotloop.rounds.fleet`: corrections from the states the policy passed through on
its way to failing, with time left, not only from where it ended). Insertion's failures lift both parts as its
successes do, then miss bringing them together: their branch points fall in that approach, not before the grasp.

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

from ..errors import BadValue, Unprocessable

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
    branches: int = 0  # drives from kept branch points, recorded (`robotloop.rounds.fleet.record_branches`)
    branch_frames: int = 0  # their frames, all the expert's
    branches_declined: int = 0  # branch points the expert found no way to success from

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class Takeovers:
    """Who drives each tick of an episode: the policy, or the expert once `trigger` fired (module docstring).

    `sim()` gives the state the expert re-plans from (the sim robot's `AlohaSim`; None on hardware, where a
    teleoperator expert needs none). `policy_steps`: the policy's ticks after which the episode ends (None: the
    environment alone ends it). `at_end`: hand an episode whose policy ticks are spent without success to the
    expert, once, before it ends (module docstring). `branch_points`: how many states of each episode the policy
    did not finish alone go to `branches`, tagged with `scene()` (the episode's seed), to drive from later.

    Raises:
        BadValue: `branch_points` is negative.
    """

    def __init__(
        self,
        expert: Expert,
        trigger: StallTrigger | UserTrigger,
        sim: Callable[[], Any] = lambda: None,
        policy_steps: int | None = None,
        at_end: bool = False,
        branch_points: int = 0,
        scene: Callable[[], int | None] = lambda: None,
    ) -> None:
        if branch_points < 0:
            raise BadValue(f"branch points per failed episode must be >= 0, not {branch_points}")
        self.expert, self.trigger, self.sim, self.policy_steps = expert, trigger, sim, policy_steps
        self.at_end, self.branch_points, self.scene = at_end, branch_points, scene
        self.stats = TakeoverStats()
        self.active = False
        self._policy_ticks, self._end_taken = 0, False
        # (scene, policy tick, physical state) of episodes the policy did not finish alone, chosen from their trails
        self.branches: list[tuple[int | None, int, np.ndarray]] = []
        self._trail: list[tuple[int | None, int, np.ndarray]] | None = []  # this episode's, until a takeover
        self._best, self._progress_tick = 0.0, 0  # the episode's furthest reward stage, and the tick it came

    def begin(self) -> None:
        """A new episode: the policy drives, the trigger starts over."""
        self.active, self._policy_ticks, self._end_taken = False, 0, False
        self._trail = []  # the last episode's, if the policy finished it alone
        self._best, self._progress_tick = 0.0, 0
        self.trigger.reset()

    @property
    def handing_back(self) -> bool:
        """Whether this tick's `choose` hands back to the policy: a policy acting in chunks should plan a new one
        from this tick's state first (`Policy.replan`)."""
        return self.active and self.expert.done

    def choose(self, policy_action: np.ndarray, obs: dict[str, Any]) -> tuple[np.ndarray, bool]:
        """The action to send this tick, and whether the expert chose it."""
        if self.handing_back:
            self._hand_back()
        if self.active:
            self.stats.expert_frames += 1
            return np.asarray(self.expert.act(obs), np.float32), True
        self._policy_ticks += 1
        return policy_action, False

    def after(self, reward: float | None, success: bool = False) -> bool:
        """After the tick's step: maybe hand over; whether the episode is over (the policy's ticks are spent)."""
        spent = self.policy_steps is not None and self._policy_ticks >= self.policy_steps
        if not self.active and reward is not None and reward > self._best:
            self._best, self._progress_tick = reward, self._policy_ticks
        if self._keeps_state(spent, success) and (sim := self.sim()) is not None:  # None: hardware keeps nothing
            self._trail.append((self.scene(), self._policy_ticks, sim.physics_state()))
        if not self.active:
            fired = self.trigger.update(reward)
            last_chance = self.at_end and spent and not success and not self._end_taken
            if fired or last_chance:
                self._end_taken |= last_chance
                self._take_over(at_end=last_chance and not fired)
        return spent and not self.active

    def _keeps_state(self, spent: bool, success: bool) -> bool:
        """Whether this tick's state joins the trail branch points are chosen from: with `branch_points`, every
        policy tick before the expert first takes over (`_trail` None after) and before the episode ends."""
        return bool(self.branch_points) and self._trail is not None and not (self.active or spent or success)

    def _take_over(self, at_end: bool) -> None:
        try:
            self.expert.start(self.sim())
        except Unprocessable as error:  # Unrecoverable: the policy goes on, the trigger may fire again
            self.stats.declined += 1
            self.stats.last_declined = str(error)
            log.info("the expert declined a takeover: %s", error)
            if at_end:  # the episode ends failed: its states on the way are what the expert may start from
                self._hand_on_branches()
            self._restart_trigger()
            return
        self._hand_on_branches()
        self.active = True
        self.stats.takeovers += 1
        self.stats.at_end += at_end

    def _hand_on_branches(self) -> None:
        if self._trail:
            # Spread over the ticks after the last progress: before it the policy was doing fine.
            after = [kept for kept in self._trail if kept[1] > self._progress_tick] or self._trail[-1:]
            picks = sorted({len(after) * (i + 1) // (self.branch_points + 1) for i in range(self.branch_points)})
            self.branches.extend(after[i] for i in picks)
        self._trail = None  # no more this episode: the states after a takeover are not the policy's alone

    def _hand_back(self) -> None:
        self.active = False
        self._restart_trigger()

    def _restart_trigger(self) -> None:
        # From the stage reached: only new progress (or another stall of K steps) fires it again.
        self.trigger.reset(getattr(self.trigger, "best", 0.0))


__all__ = ["TakeoverStats", "Takeovers"]
