"""`robotloop loop`'s options for rounds through the fleet, on top of the loop's own (`LoopOptions`).

Example:
    ```python
    >>> options = RoundsOptions(preset="cpu", rounds=2, fleet=2)
    >>> options.round_settings().fleet_episodes     # the cpu preset's
    2
    ```
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..loop.options import LoopOptions
from ..train.options import MAX_WEIGHT
from . import MAX_BRANCHES, MAX_REDEMO_NEAR


class RoundsOptions(LoopOptions):
    """The loop's options, then how many rounds through the fleet follow it (0: the loop alone)."""

    rounds: int = Field(
        default=0,
        ge=0,
        le=100,
        description="Rounds after the first: a sim fleet runs stable, its failures and the expert's takeovers "
        "train the next release, promoted only if it beats stable.",
    )
    fleet: int | None = Field(default=None, ge=1, le=64, description="Sim robots per round (cpu 2, h200 10).")
    fleet_episodes: int | None = Field(
        default=None, ge=1, le=10_000, description="Episodes per robot per round (cpu 2, h200 6)."
    )
    fleet_rate_hz: float | None = Field(
        default=None,
        gt=0,
        description="The sim robots' control rate in Hz (default 50, ALOHA's); inf: as fast as the machine runs them "
        "(a sim has no clock to keep up with: fewer minutes for the fleet stage).",
    )
    round_steps: int | None = Field(
        default=None, ge=1, le=100_000_000, description="Fine-tuning steps per round (default: --steps)."
    )
    round_lr_scale: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="A round's fine-tune peaks at this fraction of the recipe's learning rate (default 0.1).",
    )
    stall_steps: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Steps without a new reward stage before the expert takes over (default: the task's, TransferCube "
        "180 and Insertion 230, raised above the slowest pace at which stable's own evaluation succeeded).",
    )
    round_from_scratch: bool = Field(
        default=False,
        description="Each round (and its baseline) trains from random init on all its data with round 0's recipe and "
        "steps, instead of fine-tuning stable (slower: what the round's data is worth fully trained in).",
    )
    round_data_share: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="Draw this share of each round's batches from the expert frames the rounds gathered (takeovers, "
        "re-demonstrations; the baseline's extra demos) against the rest, e.g. 0.5 (default: in proportion to "
        "their frames).",
    )
    round_success_weight: float | None = Field(
        default=None,
        ge=0,
        le=MAX_WEIGHT,
        description="Weight of the fleet's autonomous frames in episodes the policy won on its own, against a demo "
        "frame's 1 (default 0: the policy's own successes are no expert data; added, they cost TransferCube 13-15 "
        "points on one H200).",
    )
    redemonstrate: bool = Field(default=True, description="The expert re-demonstrates each failed fleet scene.")
    redemo_near: int | None = Field(
        default=None,
        ge=0,
        le=MAX_REDEMO_NEAR,
        description="Per fleet scene the policy did not win alone, the expert also demonstrates the N fresh scenes "
        "whose objects lie nearest it, where the policy is likely to fail too (default: the preset's, 3 on h200, 0 on "
        "cpu; 0: none).",
    )
    branches: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BRANCHES,
        description="Per fleet episode the policy did not finish alone, the expert also drives from N of its states, "
        "spread evenly over the ticks after its last progress (a new reward stage), each drive recorded as expert "
        "frames (sim only; default 0).",
    )
    fleet_check: bool = Field(
        default=False,
        description="Also evaluate stable in lockstep on the fleet's own scenes and pair them, episode by episode, "
        "with what the robots did alone (a diagnostic: it costs an evaluation of the fleet's episodes).",
    )
    baseline: bool = Field(
        default=False,
        description="Also train the fair baseline each round: the same expert frames as demos of random scenes.",
    )
    baseline_rounds: int | None = Field(
        default=None,
        ge=1,
        le=100,
        description="The baseline beside the first N rounds only (implies --baseline; default: every round). Its "
        "demos, training and evaluation cost each round about as much as the round: later rounds then run at their "
        "own pace.",
    )

    def round_settings(self):
        """The rounds' `RoundSettings`: the preset's, then every option given.

        Raises:
            BadValue: rounds given with --live.
        """
        from ..errors import BadValue
        from .run import RoundSettings, round_weights

        if self.rounds and self.live:
            raise BadValue("--rounds and --live are two ways of running rounds: choose one")
        given = {
            "rounds": self.rounds or 1,
            "fleet": self.fleet,
            "fleet_episodes": self.fleet_episodes,
            "fleet_rate_hz": self.fleet_rate_hz,
            "steps": self.round_steps,
            "stall_steps": self.stall_steps,
            "lr_scale": self.round_lr_scale,
            "redemonstrate": self.redemonstrate,
            "redemo_near": self.redemo_near,
            "branches": self.branches,
            "fleet_check": self.fleet_check,
            "from_scratch": self.round_from_scratch,
            "data_share": self.round_data_share,
            "baseline": self.baseline or self.baseline_rounds is not None,
            "baseline_rounds": self.baseline_rounds,
        }
        if self.round_success_weight is not None:
            given["weights"] = replace(round_weights(), autonomous_success=self.round_success_weight)
        return RoundSettings.for_preset(self.preset, **{k: v for k, v in given.items() if v is not None})
