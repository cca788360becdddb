"""How the streaming data path runs (`DataSettings`), and the feature keys every piece of it reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ...errors import BadValue
from ..weights import FrameWeights

WEIGHT_KEY = "weight"  # not a dataset feature: each buffered frame's sampling weight (robotloop.train.weights)


@dataclass
class DataSettings:
    """How the streaming data path runs.

    The buffer bound is `buffer_frames` when set, else `buffer_bytes` divided by the bytes one frame takes
    (all cameras' uint8 images plus state and action). `buffer_bytes` None: on CUDA, `buffer_share` of the
    device's free memory when the sampler starts (on an H200 about 190 episodes of 480x640 frames, so nothing is
    evicted and decoded again); on CPU 8 GiB.

    `weights`: how often each kind of frame is drawn (demo, expert, autonomous frames of successful and failed
    episodes; per dataset), 0 dropping it: `robotloop.train.weights.FrameWeights`.

    Raises:
        ValueError: an unknown `video_backend`.
    """

    decode_workers: int = 4
    buffer_frames: int | None = None
    buffer_bytes: int | None = None
    buffer_share: float = 0.5
    chunk_size: int = 100  # ACT's action horizon
    refresh_every_s: float = 30.0  # the background thread looks for new episodes this often; 0: only on refresh()
    seed: int = 0
    device: str = "cpu"
    max_inflight: int | None = None  # decode jobs submitted but not yet in the buffer; None: 2 per worker
    retries: int = 3  # per episode, inside the worker: reads cross a network
    # "auto": torchcodec when its FFmpeg libraries load, else PyAV (whose wheel bundles FFmpeg), as lerobot does.
    video_backend: Literal["auto", "torchcodec", "pyav"] = "auto"
    weights: FrameWeights = field(default_factory=FrameWeights)

    def __post_init__(self) -> None:
        if self.video_backend not in ("auto", "torchcodec", "pyav"):
            raise BadValue(f"video_backend must be 'auto', 'torchcodec' or 'pyav', got {self.video_backend!r}")
