"""What a LeRobot v3 dataset in a bucket holds, from its `meta/info.json` and the bucket's listing; nothing
else is downloaded.

Example:
    ```python
    >>> info = dataset_info(connect(), BucketUrl.parse("hf://buckets/lab/demos/datasets/cube"))
    >>> info.episodes, info.frames, info.fps, info.bytes
    (50, 20000, 50, 31457280)
    ```
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..storage import BucketClient, BucketUrl


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset's size and shape. `features` maps each feature to its dtype and shape (videos: H, W, C)."""

    url: str
    episodes: int
    frames: int
    fps: int
    tasks: int
    features: dict[str, dict]
    bytes: int  # every file under the dataset URL, as stored
    robot_type: str | None = None
    codebase_version: str | None = None


def dataset_info(client: BucketClient, url: BucketUrl) -> DatasetInfo:
    """Read the dataset at `url`.

    Raises:
        NotFound: no `meta/info.json` under `url` (nothing committed yet, or not a dataset URL).
        ValueError: `meta/info.json` is not JSON.
    """
    entry = client.stat(url / "meta" / "info.json")
    info = json.loads(client.read_range(entry.url, 0, entry.size))
    features = {name: {"dtype": f["dtype"], "shape": list(f["shape"])} for name, f in info.get("features", {}).items()}
    return DatasetInfo(
        str(url),
        info.get("total_episodes", 0),
        info.get("total_frames", 0),
        info.get("fps", 0),
        info.get("total_tasks", 0),
        features,
        client.du(url),
        info.get("robot_type"),
        info.get("codebase_version"),
    )


def episode_files(info: dict, row: dict, video_keys: list[str]) -> dict[str, str]:
    """The paths, relative to the dataset, of an episode's data file (key "") and video files (by video key), from
    `meta/info.json` (`info`) and the episode's row of `meta/episodes` (`row`: its chunk and file indices)."""
    data = info["data_path"].format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])
    paths = {"": data}
    for key in video_keys:
        chunk, file = row[f"videos/{key}/chunk_index"], row[f"videos/{key}/file_index"]
        paths[key] = info["video_path"].format(video_key=key, chunk_index=chunk, file_index=file)
    return paths
