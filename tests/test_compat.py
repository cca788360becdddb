"""The private APIs robotloop uses (all behind robotloop/compat.py) still exist with the shape it relies on.

huggingface_hub is pinned only to >=1.6,<2: when a release moves one of them, these fail naming the symbol, instead
of an upload or a training run failing far from the cause.
"""

import dataclasses
import inspect
import tomllib
from pathlib import Path

import pytest
from huggingface_hub import HfApi
from packaging.requirements import Requirement

from robotloop import compat

REPO = Path(__file__).resolve().parents[1]


def fields(cls: type) -> dict[str, dataclasses.Field]:
    assert dataclasses.is_dataclass(cls), f"{cls.__module__}.{cls.__qualname__} is no longer a dataclass"
    return {f.name: f for f in dataclasses.fields(cls)}


def test_tested_versions_are_pyprojects_pins() -> None:
    pins = {}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [line for lines in project["optional-dependencies"].values() for line in lines]
    for line in [*project["dependencies"], *extras]:  # lerobot is pinned in `full` (not on the slim robot)
        req = Requirement(line)
        if req.name != "robotloop" and str(req.specifier):
            pins.setdefault(req.name.lower(), str(req.specifier))
    for name, spec in compat.TESTED.items():
        assert name.lower() in pins, f"{name} is not a dependency in pyproject.toml"
        assert Requirement(f"{name}{spec}").specifier == Requirement(f"{name}{pins[name.lower()]}").specifier, name


def test_installed_versions_are_the_tested_ones() -> None:
    assert compat.untested_versions() == []


def test_huggingface_hub_bucket_add_file() -> None:
    """huggingface_hub._buckets._BucketAddFile(source, destination, xet_hash=, size=): a file by its Xet hash."""
    init = fields(compat.BucketAddFile)
    for name in ("source", "destination", "xet_hash", "size"):
        assert name in init and init[name].init, f"huggingface_hub._buckets._BucketAddFile lost its field {name!r}"
    add = compat.BucketAddFile(source=b"", destination="a/b.txt", xet_hash="0" * 64, size=3)
    assert (add.destination, add.xet_hash, add.size) == ("a/b.txt", "0" * 64, 3)
    batch = inspect.signature(HfApi.batch_bucket_files).parameters
    assert "add" in batch and "delete" in batch, "HfApi.batch_bucket_files(add=, delete=) changed"


def test_huggingface_hub_bucket_file() -> None:
    have = fields(compat.BucketFile)
    for name in ("path", "size", "xet_hash"):
        assert name in have, f"huggingface_hub.BucketFile lost its field {name!r}"


def test_huggingface_hub_xet_refresh_route() -> None:
    """huggingface_hub.utils._xet.xet_connection_info_refresh_url(*, token_type, repo_id, repo_type, endpoint)."""
    from huggingface_hub.utils import _xet

    assert {t.name for t in _xet.XetTokenType} >= {"READ", "WRITE"}, "huggingface_hub.utils._xet.XetTokenType changed"
    params = inspect.signature(_xet.xet_connection_info_refresh_url).parameters
    for name in ("token_type", "repo_id", "repo_type", "endpoint"):
        assert name in params, f"huggingface_hub.utils._xet.xet_connection_info_refresh_url lost {name!r}"
    url = compat.xet_refresh_url("lab/demos", "http://127.0.0.1:1", write=True)
    assert url.startswith("http://127.0.0.1:1/") and "lab/demos" in url and "write" in url, url
    assert "read" in compat.xet_refresh_url("lab/demos", "http://127.0.0.1:1", write=False)


def test_huggingface_hub_xet_session() -> None:
    """huggingface_hub.utils._xet.get_xet_session(): an hf_xet session with upload commits and download streams."""
    session = compat.xet_session()
    for method in ("new_upload_commit", "new_download_stream_group"):
        assert callable(getattr(session, method, None)), f"get_xet_session() gives no {method}"
    assert compat.xet_session() is session, "get_xet_session() is no longer one shared session"


def test_lerobot_normalizer_tensor_stats() -> None:
    """lerobot's NormalizerProcessorStep._tensor_stats: key -> {"mean", "std", ...} as tensors."""
    import torch
    from lerobot.configs import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.processor import NormalizerProcessorStep

    norm = NormalizerProcessorStep(
        features={"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(2,))},
        norm_map={FeatureType.STATE: NormalizationMode.MEAN_STD},
        stats={"observation.state": {"mean": [1.0, 2.0], "std": [3.0, 4.0]}},
    )
    try:
        stats = compat.normalizer_tensor_stats(norm)
    except AttributeError:
        pytest.fail("lerobot's NormalizerProcessorStep has no _tensor_stats any more")
    assert torch.equal(stats["observation.state"]["std"], torch.tensor([3.0, 4.0])), stats
    assert norm.eps > 0 and norm.norm_map[FeatureType.STATE] is NormalizationMode.MEAN_STD


def test_lerobot_streaming_encoder_dropped_frames() -> None:
    """lerobot's DatasetWriter._streaming_encoder and StreamingVideoEncoder._dropped_frames (video key -> count)."""
    from lerobot.datasets.dataset_writer import DatasetWriter
    from lerobot.datasets.video_utils import StreamingVideoEncoder

    assert "self._streaming_encoder =" in inspect.getsource(DatasetWriter.__init__), (
        "lerobot's DatasetWriter no longer keeps _streaming_encoder"
    )
    encoder = StreamingVideoEncoder(fps=30)
    assert isinstance(getattr(encoder, "_dropped_frames", None), dict), (
        "lerobot's StreamingVideoEncoder no longer counts _dropped_frames"
    )
    writer = type("Writer", (), {"_streaming_encoder": encoder})()
    assert compat.dropped_video_frames(writer) == 0
    encoder._dropped_frames["observation.images.top"] = 2
    assert compat.dropped_video_frames(writer) == 2
    assert compat.dropped_video_frames(type("NoEncoder", (), {})()) == 0


def test_lerobot_streaming_encoder_frame_queues(tmp_path) -> None:
    """lerobot's StreamingVideoEncoder._frame_queues: video key -> queue.Queue(queue_maxsize), made per episode."""
    from lerobot.datasets.video_utils import StreamingVideoEncoder

    encoder = StreamingVideoEncoder(fps=30, queue_maxsize=3)
    writer = type("Writer", (), {"_streaming_encoder": encoder})()
    assert compat.video_encoder_queues(writer) == []
    encoder.start_episode(["observation.images.top"], tmp_path)
    try:
        assert [q.maxsize for q in compat.video_encoder_queues(writer)] == [3], (
            "lerobot's StreamingVideoEncoder no longer keeps its frame queues in _frame_queues"
        )
    finally:
        encoder.cancel_episode()
    assert compat.video_encoder_queues(type("NoEncoder", (), {})()) == []


def test_lerobot_dataset_metadata_loaded_with_the_episodes_table_by_pyarrow(tmp_path) -> None:
    """lerobot's LeRobotDatasetMetadata._load_metadata sets info, tasks, episodes and stats: ours, overriding it to
    read the episodes table with pyarrow, gives a metadata object equal to lerobot's, attribute for attribute."""
    import numpy as np
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

    from robotloop.capture import DatasetSpec, Episode
    from robotloop.capture.append import append_episode
    from robotloop.capture.recorder import write_episode

    spec = DatasetSpec({"top": (16, 24, 3)}, 14, 14, vcodec="h264")

    def episode(k: int) -> Episode:
        zeros = np.full((4, 14), k, np.float32)
        return Episode({"top": np.zeros((4, 16, 24, 3), np.uint8)}, zeros, zeros, "x", np.zeros(4, np.float32))

    root = Path(write_episode(spec, "lab/compat", tmp_path, episode(0)).root)
    append_episode(root, Path(write_episode(spec, "lab/compat", tmp_path, episode(1)).root), "lab/compat")
    theirs, ours = LeRobotDatasetMetadata("lab/compat", root=root), compat.local_dataset_metadata("lab/compat", root)
    assert isinstance(ours, LeRobotDatasetMetadata) and ours.total_episodes == 2
    assert sorted(vars(ours)) == sorted(vars(theirs)), "lerobot's _load_metadata sets other attributes now"
    assert (ours.info, ours.stats.keys()) == (theirs.info, theirs.stats.keys())
    assert ours.tasks.equals(theirs.tasks)
    assert ours.episodes.features == theirs.episodes.features
    assert ours.episodes.to_list() == theirs.episodes.to_list()


def test_lerobot_dataset_writer_embeds_images_only_where_a_feature_needs_it() -> None:
    """lerobot's DatasetWriter calls its module's `embed_images` global; ours skips a table with nothing to embed
    (returned as it is) and hands one with an image feature to lerobot's, which embeds its bytes."""
    import datasets
    import numpy as np
    from lerobot.datasets import dataset_writer
    from PIL import Image

    compat.embed_images_only_where_needed()
    compat.embed_images_only_where_needed()  # idempotent: wrapped once
    embed = dataset_writer.embed_images
    assert embed.__module__ == "robotloop.compat", "lerobot's DatasetWriter no longer calls its embed_images global"
    state = datasets.Features({"observation.state": datasets.Sequence(datasets.Value("float32"), length=2)})
    table = datasets.Dataset.from_dict({"observation.state": [[0.0, 1.0]] * 3}, features=state)
    assert embed(table) is table
    image = np.zeros((4, 4, 3), np.uint8)
    images = datasets.Dataset.from_dict(
        {"image": [Image.fromarray(image)] * 2}, features=datasets.Features({"image": datasets.Image()})
    )
    embedded = embed(images)
    assert embedded is not images and embedded.with_format("arrow")["image"][0]["bytes"].as_py()
