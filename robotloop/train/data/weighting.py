"""The run's frame weights (`robotloop.train.weights.FrameWeights`) applied to its episodes: each decoded frame's
weight, each episode's summed weight from its metadata before any frame is decoded, and what each dataset holds
of each kind of frame (the log line, the checkpoint's lineage, the refusal of a run with nothing to train on).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from ...errors import BadValue
from ...features import INTERVENTION_KEY, SUCCESS_KEY
from ...storage import BucketClient, BucketUrl
from ..weights import FrameWeights, Role, autonomous_outcome
from .catalog import DatasetSource, EpisodeRef


@dataclass
class SourceFrames:
    """What one dataset holds of each kind of frame (from its episodes' metadata), and how many weigh 0."""

    dataset: str
    role: Role
    episodes: int = 0
    frames: int = 0
    expert: int = 0  # a demo's every frame; a fleet dataset's intervention frames
    autonomous_success: int = 0
    autonomous_failed: int = 0  # in failed episodes, and in successful ones the expert took over
    dropped: int = 0
    unknown_episodes: int = 0  # no stats in their metadata: known once decoded, not counted here

    def mass(self, weights: FrameWeights) -> float:
        """The summed weight of the counted frames: how much of the run's draws this dataset takes."""
        if self.role == "demo":
            return self.frames * weights.frame_weight("demo", False, True, self.dataset)
        return (
            self.expert * weights.frame_weight("fleet", False, True, self.dataset)
            + self.autonomous_success * weights.frame_weight("fleet", True, False, self.dataset)
            + self.autonomous_failed * weights.frame_weight("fleet", False, False, self.dataset)
        )

    @classmethod
    def summed(cls, sources: list[SourceFrames]) -> SourceFrames:
        """Several fleet datasets' counts as one, named by their number: the one log line of a round's ten."""
        total = cls(f"{len(sources)} fleet datasets", "fleet")
        for f in fields(cls):
            if f.name not in ("dataset", "role"):  # the rest are counts
                setattr(total, f.name, sum(getattr(src, f.name) for src in sources))
        return total

    def describe(self) -> str:
        """One line, e.g. `hf://.../fleet (40 expert, 50 autonomous in successful episodes, 30 in failed or
        taken-over episodes): 30 of 120 frames weigh 0`."""
        if self.role == "demo":
            kinds = f"{self.frames} demo frames"
        else:
            kinds = (
                f"{self.expert} expert, {self.autonomous_success} autonomous in successful episodes, "
                f"{self.autonomous_failed} in failed or taken-over episodes"
            )
        unknown = f" ({self.unknown_episodes} episodes without stats not counted)" if self.unknown_episodes else ""
        return f"{self.dataset} ({kinds}): {self.dropped} of {self.frames} frames weigh 0{unknown}"


class Weighting:
    """`FrameWeights` over the run's episodes.

    Example:
        ```python
        >>> w = Weighting(FrameWeights())
        >>> w.frames(ref, {"intervention": torch.tensor([True, False]), "next.success": torch.tensor([False, True])})
        tensor([2., 1.])
        ```
    """

    def __init__(self, weights: FrameWeights) -> None:
        self.weights = weights

    def frames(self, ref: EpisodeRef, episode: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each frame's weight, float32 [T], from the decoded episode's `next.success` and `intervention` columns
        (those it has: see `EpisodeRef.flag_columns`)."""
        w, length = self.weights, len(next(iter(episode.values())))
        success = SUCCESS_KEY in episode and bool(episode[SUCCESS_KEY].any())
        if ref.role == "demo":
            return torch.full((length,), w.frame_weight("demo", success, True, ref.dataset), dtype=torch.float32)
        intervention = episode[INTERVENTION_KEY].numpy().astype(bool)
        flags = episode[SUCCESS_KEY].numpy().astype(bool) if SUCCESS_KEY in episode else np.zeros(length, bool)
        on_its_own = torch.from_numpy(autonomous_outcome(intervention, flags))
        expert = torch.tensor(w.frame_weight("fleet", success, True, ref.dataset), dtype=torch.float32)
        good = torch.tensor(w.frame_weight("fleet", True, False, ref.dataset), dtype=torch.float32)
        bad = torch.tensor(w.frame_weight("fleet", False, False, ref.dataset), dtype=torch.float32)
        return torch.where(torch.from_numpy(intervention), expert, torch.where(on_its_own, good, bad))

    def planned(self, ref: EpisodeRef) -> float | None:
        """The episode's summed weight from its metadata; None where the stats that say are missing."""
        if ref.success is None or ref.expert_frames is None:
            return None
        return self.weights.episode_weight(ref.role, ref.success, ref.expert_frames, ref.length, ref.dataset)

    def sources(self, refs: list[EpisodeRef]) -> list[SourceFrames]:
        """Per dataset (in the order first seen), what `refs` hold of each kind of frame and how many weigh 0."""
        out: dict[str, SourceFrames] = {}
        for ref in refs:
            s = out.setdefault(ref.dataset, SourceFrames(ref.dataset, ref.role))
            if ref.success is None or ref.expert_frames is None:
                s.unknown_episodes += 1
                continue
            s.episodes += 1
            s.frames += ref.length
            s.expert += ref.expert_frames
            autonomous = ref.length - ref.expert_frames
            # A successful takeover episode's policy frames count as failed here, as `episode_weight` counts them.
            on_its_own = ref.success and ref.expert_frames == 0
            s.autonomous_success += autonomous if on_its_own else 0
            s.autonomous_failed += 0 if on_its_own else autonomous
            expert_weight = self.weights.frame_weight(ref.role, ref.success, True, ref.dataset)
            autonomous_weight = self.weights.frame_weight(ref.role, on_its_own, False, ref.dataset)
            s.dropped += ref.expert_frames if expert_weight == 0 else 0
            s.dropped += autonomous if autonomous_weight == 0 else 0
        return list(out.values())


def dataset_frames(client: BucketClient, urls: list[BucketUrl], weights: FrameWeights) -> list[SourceFrames]:
    """What each dataset holds of each kind of frame as committed now (its episodes' metadata, nothing decoded)."""
    refs = [ref for url in urls for ref in DatasetSource(client, url).episodes]
    return Weighting(weights).sources(refs)


def with_share(weights: FrameWeights, sources: list[SourceFrames], extra_demos: set[str], share: float) -> FrameWeights:
    """`weights` with the expert's gathered frames drawn as `share` of the draws, whatever their number next to the
    rest: every fleet dataset's intervention frames (takeovers) and every frame of the demo datasets in
    `extra_demos` (re-demonstrations, a baseline's extra demos), by one factor on the `expert` weight and on those
    datasets. As intervention-weighted regression draws corrections (half of every batch), not in proportion to a
    few thousand frames against a demo set ten times larger. The policy's own frames are not the expert's and keep
    their weight: a round that drew half its batches from the fleet's autonomous successes fell from 99% to 84.5%
    (TransferCube, H200, 2026-12-05). Unchanged where there is no expert frame gathered, or nothing else.

    Example:
        ```python
        >>> demos = SourceFrames("demos", "demo", episodes=10, frames=4000)
        >>> fleet = SourceFrames("fleet", "fleet", episodes=2, frames=800, expert=400, autonomous_failed=400)
        >>> with_share(FrameWeights(), [demos, fleet], set(), 0.5).expert     # 400 x 2 x 5 = 4000
        10.0
        ```

    Raises:
        BadValue: `share` is not between 0 and 1 (both excluded).
    """
    if not 0 < share < 1:
        raise BadValue(f"a share of the draws is between 0 and 1, got {share}")

    def gathered(s: SourceFrames) -> float:
        if s.role == "demo":
            return s.mass(weights) if s.dataset in extra_demos else 0.0
        return s.expert * weights.frame_weight("fleet", False, True, s.dataset)

    picked = sum(gathered(s) for s in sources)
    rest = sum(s.mass(weights) for s in sources) - picked
    if picked == 0 or rest == 0:
        return weights
    factor = share / (1 - share) * rest / picked
    demos = {s.dataset for s in sources if s.role == "demo" and s.dataset in extra_demos}
    datasets = {**weights.datasets, **{d: weights.factor(d) * factor for d in demos}}
    return replace(weights, expert=weights.expert * factor, datasets=datasets)
