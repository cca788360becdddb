"""Streaming training data: LeRobot v3 episodes from buckets, decoded ahead into a bounded frame buffer.

The data path never downloads a dataset: metadata is small and read whole, and each episode's rows and frames are
fetched on demand, whole for a file of one episode (through the read cache), by byte ranges for a file that many
episodes share. One module per piece, composed by the sampler:

- `catalog`: `EpisodeCatalog`, the datasets (`DatasetSource`: one LeRobot v3 dataset's metadata, re-read as
  episodes are committed) and this rank's share of their episodes; `DecodeSchedule`, the seeded order in
  which to decode them.
- `decode`: `DecodePool`, worker processes that fetch and decode every frame of an episode (torchcodec, or PyAV
  where FFmpeg's libraries are missing) and hand the tensors back through shared memory; `DecodeOrder`, which
  numbers jobs and releases results strictly in job order.
- `arena`: `FrameArena`, a ring of preallocated tensors on the sampler's device (GPU memory on CUDA) that
  evicts the oldest episodes when full; `BufferView`, what batches sample from; on CUDA, the side stream and
  events that keep copies into the arena off the trainer's stream.
- `feed`: `BufferFeed`, the background thread that moves episodes from catalog to arena (schedule, decode,
  reorder, copy in) and publishes what is buffered; it owns the lock the trainer's thread samples under.
- `sampler`: `StreamingSampler`, which composes them: `next_batch` is pure tensor indexing on the device (frames
  drawn by weight), behind a seeded generator; `state_dict`/`load_state_dict` resume it.
- `weighting`: `Weighting`, each frame's sampling weight from its dataset's role (demos, or fleet data with
  `intervention`), its episode's success and who drove it (`robotloop.train.weights.FrameWeights`).
- `settings` and `errors`: `DataSettings`, `DataError`, `DatasetMismatch`, `NothingToTrain`.

Example:
    ```python
    >>> sampler = StreamingSampler(client, [BucketUrl.parse("hf://buckets/lab/demos/datasets/cube")],
    ...                            DataSettings(device="cuda", chunk_size=100))
    >>> batch = sampler.next_batch(8)
    >>> batch["action"].shape, batch["action_is_pad"].shape
    (torch.Size([8, 100, 14]), torch.Size([8, 100]))
    >>> sampler.wait_s   # seconds the trainer spent inside next_batch (data wait)
    ```
"""

from ...features import ACTION_KEY, STATE_KEY
from .arena import BufferView, FrameArena, buffer_bytes
from .catalog import DatasetSource, DecodeSchedule, EpisodeCatalog, EpisodeRef, FileRef
from .catalog import _combined_stats as _combined_stats  # tests check how stats combine
from .decode import _FRAME_READERS as _FRAME_READERS  # tests compare the two video backends
from .decode import DecodeOrder, DecodePool, FrameReader, resolve_video_backend
from .decode import _decode_episode as _decode_episode
from .errors import DataError, DatasetMismatch, NotBuffered, NothingToTrain, StaleState
from .feed import BufferFeed
from .sampler import StreamingSampler
from .settings import DataSettings
from .weighting import SourceFrames, Weighting

__all__ = [
    "ACTION_KEY",
    "STATE_KEY",
    "BufferFeed",
    "BufferView",
    "DataError",
    "DataSettings",
    "DatasetMismatch",
    "DatasetSource",
    "DecodeOrder",
    "DecodePool",
    "DecodeSchedule",
    "EpisodeCatalog",
    "EpisodeRef",
    "FileRef",
    "FrameArena",
    "FrameReader",
    "NotBuffered",
    "NothingToTrain",
    "StaleState",
    "SourceFrames",
    "StreamingSampler",
    "Weighting",
    "buffer_bytes",
    "resolve_video_backend",
]
