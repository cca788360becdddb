"""Every use of another package's private API, in one place.

robotloop reaches into a few private corners of huggingface_hub and lerobot, where their public API does not
(yet) give what it needs:

* ``huggingface_hub._buckets._BucketAddFile``: registering a file in a bucket by a Xet hash it already has
  (`HfApi.batch_bucket_files` takes only local files or bytes, and would upload them again).
* ``huggingface_hub.utils._xet``: the shared hf_xet session and its token refresh route, to drive uploads
  ourselves (for the dedup figures `batch_bucket_files` keeps to itself) and to stream byte ranges.
* lerobot's ``NormalizerProcessorStep._tensor_stats``: its normalization stats as tensors, so the fused
  normalization on the GPU uses lerobot's own numbers.
* lerobot's ``DatasetWriter._streaming_encoder._dropped_frames``: the frames its streaming video encoder dropped
  (there is no public counter), so an episode shorter in video than in data is refused.
* lerobot's ``StreamingVideoEncoder._frame_queues``: its per-camera frame queues, so a batch from the network waits
  for room instead of having frames dropped (lerobot's `feed_frame` drops after 0.1 s and cannot be told to wait).
* lerobot's ``LeRobotDatasetMetadata._load_metadata``: overridden to read a local dataset's episodes table with
  pyarrow, without the per-episode stats columns lerobot's loader reads through `datasets` and then drops (13 of 133
  columns kept; 0.013 s against 0.12 s a call), for the recorder's append of every committed episode.
* lerobot's ``dataset_writer.embed_images``, the module global its ``DatasetWriter`` calls at each ``save_episode``:
  wrapped to skip episodes with no feature to embed (`embed_images_only_where_needed`).
* Ray's ``ray.init(_system_config=...)`` (documented "testing only"), in `robotloop.cluster.ray_session`: a `--ray
  local` cluster's ``worker_niceness``, the one Ray setting a driver cannot pass otherwise without changing its own
  environment; `tests/test_ray.py` checks its effect (a local cluster's workers at niceness 0).

huggingface_hub is pinned only to ``>=1.6,<2``: any release may move these. `tests/test_compat.py` checks that
each one still exists with the signature or fields used here, naming the one that changed; `untested_versions`
says which installed package is outside the versions tested (pyproject's pins, in `TESTED`).

Example:
    ```python
    >>> from robotloop.compat import untested_versions
    >>> untested_versions()
    []
    ```
"""

from __future__ import annotations

import functools
import importlib.metadata
import queue
import warnings
from pathlib import Path
from typing import Any

from huggingface_hub import BucketFile
from huggingface_hub._buckets import _BucketAddFile as BucketAddFile
from huggingface_hub.utils._xet import XetTokenType, get_xet_session, xet_connection_info_refresh_url
from packaging.specifiers import SpecifierSet
from packaging.version import Version

__all__ = [
    "TESTED",
    "BucketAddFile",
    "BucketFile",
    "dropped_video_frames",
    "embed_images_only_where_needed",
    "video_encoder_queues",
    "normalizer_tensor_stats",
    "untested_versions",
    "xet_refresh_url",
    "xet_session",
]

# The versions the private uses above were tested with: pyproject.toml's pins (tests/test_compat.py keeps the two
# in step).
TESTED: dict[str, str] = {"huggingface_hub": ">=1.6,<2", "hf-xet": "==1.8.*", "lerobot": "==0.6.1"}
OPTIONAL = {"lerobot"}  # absent from a slim robot install ('robotloop[robot]'), which makes no use of it


def untested_versions() -> list[str]:
    """One line per package in `TESTED` whose installed version is outside the tested range (or missing)."""
    lines = []
    for name, spec in TESTED.items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            if name not in OPTIONAL:
                lines.append(f"{name} is not installed (tested: {spec})")
            continue
        if Version(installed) not in SpecifierSet(spec):
            lines.append(f"{name} {installed} is installed; robotloop's private uses of it were tested with {spec}")
    return lines


@functools.cache
def _warn_untested_once() -> None:
    # At the first private use, not at import: importing robotloop does no work.
    for line in untested_versions():
        warnings.warn(f"{line} (see robotloop/compat.py)", RuntimeWarning, stacklevel=3)


def xet_refresh_url(bucket_id: str, endpoint: str, write: bool) -> str:
    """The route hf_xet calls for (fresh) CAS tokens of bucket `bucket_id` on `endpoint`."""
    _warn_untested_once()
    kind = XetTokenType.WRITE if write else XetTokenType.READ
    return xet_connection_info_refresh_url(token_type=kind, repo_id=bucket_id, repo_type="bucket", endpoint=endpoint)


def xet_session() -> Any:
    """huggingface_hub's process-wide ``hf_xet.XetSession`` (its connection pools and caches are shared)."""
    _warn_untested_once()
    return get_xet_session()


def normalizer_tensor_stats(norm: Any) -> dict[str, dict[str, Any]]:
    """lerobot's ``NormalizerProcessorStep`` stats as tensors (key -> {"mean", "std", "min", "max", ...}), on its
    device and dtype: what lerobot itself normalizes with.

    Raises:
        AttributeError: `norm` has no ``_tensor_stats`` (a lerobot release renamed it).
    """
    _warn_untested_once()
    return norm._tensor_stats


def dropped_video_frames(writer: Any) -> int:
    """Frames lerobot's streaming video encoder of `writer` (a ``DatasetWriter``) dropped so far; 0 without one.

    lerobot drops frames rather than block when the encoder's queue is full, and counts them only privately.
    """
    _warn_untested_once()
    encoder = getattr(writer, "_streaming_encoder", None)
    return sum(getattr(encoder, "_dropped_frames", {}).values())


def video_encoder_queues(writer: Any) -> list[queue.Queue]:
    """The per-camera frame queues of lerobot's streaming video encoder of `writer` (a ``DatasetWriter``); none
    before an episode's first frame or without a streaming encoder. Only for waiting on: `full()`, `qsize()`."""
    _warn_untested_once()
    encoder = getattr(writer, "_streaming_encoder", None)
    return list(getattr(encoder, "_frame_queues", {}).values())


@functools.cache
def embed_images_only_where_needed() -> None:
    """Make lerobot's dataset writer skip `embed_images` on an episode with no image feature stored in the table.

    lerobot 0.6.1 runs every saved episode through ``embed_images``: a `datasets` map that rebuilds the table one row
    at a time, even when no feature needs embedding (video datasets keep their frames in MP4 files, not the table).
    The table comes back unchanged, at 0.8 CPU s for a 400-frame episode: two thirds of a fleet robot's writer
    process (py-spy, 2 cores), taken from its control loop. Idempotent; datasets with image features embed as before.
    """
    _warn_untested_once()
    from datasets.features.features import require_storage_embed
    from lerobot.datasets import dataset_writer

    lerobots = dataset_writer.embed_images

    def embed_images(dataset: Any) -> Any:
        if any(require_storage_embed(feature) for feature in dataset.features.values()):
            return lerobots(dataset)
        return dataset

    dataset_writer.embed_images = embed_images


def local_dataset_metadata(repo_id: str, root: Path) -> Any:
    """lerobot's ``LeRobotDatasetMetadata`` of the local dataset at `root` (a recorder's copy), equal to lerobot's
    own but for how its `episodes` table is read: with pyarrow, only the columns lerobot keeps (not ``stats/*``).

    Raises:
        FileNotFoundError: no dataset at `root`.
    """
    _warn_untested_once()
    return _episodes_by_pyarrow()(repo_id, root=root)


@functools.cache
def _episodes_by_pyarrow() -> type:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from lerobot.datasets.dataset_metadata import CODEBASE_VERSION, LeRobotDatasetMetadata
    from lerobot.datasets.io_utils import load_info, load_stats, load_tasks
    from lerobot.datasets.utils import check_version_compatibility

    def episodes(root: Path) -> Dataset:
        paths = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
        if not paths:
            raise FileNotFoundError(f"{root}: no meta/episodes parquet files")
        columns = [n for n in pq.read_schema(paths[0]).names if not n.startswith("stats/")]
        return Dataset(InMemoryTable(pa.concat_tables([pq.read_table(p, columns=columns) for p in paths])))

    class Metadata(LeRobotDatasetMetadata):
        def _load_metadata(self) -> None:  # lerobot 0.6.1's, but for `episodes`
            self.info = load_info(self.root)
            check_version_compatibility(self.repo_id, self._version, CODEBASE_VERSION)
            self.tasks = load_tasks(self.root) if self.total_tasks > 0 else None
            self.episodes = episodes(self.root) if self.total_episodes > 0 else None
            self.stats = load_stats(self.root)

    return Metadata
