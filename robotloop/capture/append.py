"""Append a one-episode LeRobot v3 dataset to another, growing its current data and video files in place.

LeRobot's `resume` starts new data and video files for every session; lerobot 0.6.1's
StreamingLeRobotDataset, however, reads a camera's frames at `index / fps` inside one mp4, so it only reads
datasets whose episodes are packed into one file per camera and chunk, as lerobot's writer packs them within
a session. Appending each committed episode into the current files keeps that layout (and Xet dedup makes
re-uploading a grown file cost about the episode's bytes). The packing itself is lerobot's aggregation code
(`lerobot.datasets.aggregate`), started from the destination's last file instead of from empty.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd


def load_append() -> None:
    """Import what `append_episode` runs (lerobot's aggregation) now: seconds on a busy machine, which a process
    that commits episodes can spend while it has nothing to commit yet, rather than at its first append."""
    import lerobot.datasets.aggregate  # noqa: F401


def append_episode(dst_root: Path, src_root: Path, repo_id: str) -> None:
    """Append the dataset at `src_root` (lerobot-written, one episode) to the dataset at `dst_root`.

    `dst_root` must hold meta/ and the data and video files of its last episode (the ones that grow).

    Raises:
        FileNotFoundError: a file the append grows is missing locally.
        ValueError: the datasets differ in features or fps (lerobot's own check).
    """
    from lerobot.datasets.aggregate import (
        aggregate_data,
        aggregate_metadata,
        aggregate_videos,
        finalize_aggregation,
        validate_all_metadata,
    )

    from ..compat import local_dataset_metadata

    # lerobot's metadata objects, their episodes tables read the fast way: two of these per commit were most of a
    # small episode's commit on 2 cores (BENCHMARKS.md, "Control rate with recording on").
    dst = local_dataset_metadata(repo_id, dst_root)
    src = local_dataset_metadata(repo_id, src_root)
    validate_all_metadata([dst, src])
    before = SimpleNamespace(total_episodes=dst.total_episodes, total_frames=dst.total_frames, stats=dst.stats)
    new_tasks = [t for t in src.tasks.index if t not in dst.tasks.index]
    if new_tasks:
        added = pd.DataFrame(
            {"task_index": range(len(dst.tasks), len(dst.tasks) + len(new_tasks))},
            index=pd.Index(new_tasks, name="task"),
        )
        dst.tasks = pd.concat([dst.tasks, added])

    last = dst.episodes[dst.total_episodes - 1]
    _require(dst_root / dst.get_data_file_path(dst.total_episodes - 1))
    videos_idx = {}
    for key in dst.video_keys:
        _require(dst_root / dst.get_video_file_path(dst.total_episodes - 1, key))
        chunk, file, end = (
            last[f"videos/{key}/chunk_index"],
            last[f"videos/{key}/file_index"],
            last[f"videos/{key}/to_timestamp"],
        )
        videos_idx[key] = {
            "chunk": chunk,
            "file": file,
            "latest_duration": end,
            "episode_duration": 0,
            "dst_file_durations": {(chunk, file): end},
        }
    data_idx = {"chunk": last["data/chunk_index"], "file": last["data/file_index"]}
    meta_idx = {"chunk": last["meta/episodes/chunk_index"], "file": last["meta/episodes/file_index"]}
    info = dst.info
    aggregate_videos(src, dst, videos_idx, info.video_files_size_in_mb, info.chunks_size)
    data_idx = aggregate_data(src, dst, data_idx, info.data_files_size_in_mb, info.chunks_size)
    aggregate_metadata(src, dst, meta_idx, data_idx, videos_idx)
    # The episode's stats count its index columns from 0, as a dataset of its own: shifted to where it now sits,
    # or the merged stats.json would say the dataset's `index` tops out at the first episode's length. (Its task
    # index moves too when it has one task, as robotloop's episodes do.)
    offsets = {"index": before.total_frames, "episode_index": before.total_episodes}
    if len(src.tasks) == 1:
        task = src.tasks.index[0]
        offsets["task_index"] = int(dst.tasks.loc[task, "task_index"]) - int(src.tasks.loc[task, "task_index"])
    shifted = _shift_stats(src.stats, offsets)
    finalize_aggregation(
        dst, [before, SimpleNamespace(total_episodes=src.total_episodes, total_frames=src.total_frames, stats=shifted)]
    )


def growing_files(root: Path) -> list[str]:
    """The files of the dataset at `root` that the next append grows: its last episode's data file and video files
    (relative paths). Read from meta/ with pyarrow: lerobot's metadata loader (through `datasets`) costs ~0.12 s a
    call, a third of a small fleet episode's commit (profiled on 2 cores, BENCHMARKS.md).

    Raises:
        FileNotFoundError: no episodes metadata under `root`.
    """
    import json

    import pyarrow.parquet as pq

    from .info import episode_files

    info = json.loads((root / "meta" / "info.json").read_text())
    files = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    if not files:
        raise FileNotFoundError(f"{root}: no episodes metadata (meta/episodes/*/*.parquet)")
    videos = [k for k, v in info["features"].items() if v["dtype"] == "video"]
    columns = ["data/chunk_index", "data/file_index"]
    columns += [f"videos/{k}/{index}" for k in videos for index in ("chunk_index", "file_index")]
    table = pq.read_table(files[-1], columns=columns)
    last = {name: table.column(name)[table.num_rows - 1].as_py() for name in columns}
    return list(episode_files(info, last, videos).values())


def _shift_stats(stats: dict, offsets: dict[str, int]) -> dict:
    """`stats` with the value statistics of the columns in `offsets` moved by their offset (spreads unchanged)."""
    out = dict(stats)
    for column, offset in offsets.items():
        if column in stats and offset:
            out[column] = {
                name: (value if name in ("std", "count") else value + offset) for name, value in stats[column].items()
            }
    return out


def _require(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{path}: the file this append grows is not in the local copy")
