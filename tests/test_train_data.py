"""The streaming data path: batches from episodes recorded into the real bucket server, decoded by worker processes.

Episodes are tiny (24x32 h264) and carry known values per frame: in episode k at frame t the state is
100k + t, the action 1000k + t and the image is uniformly (20t + 40k) % 250, so every sample says where it
came from and what its action chunk must hold.
"""

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from robotloop.capture import DatasetRecorder, DatasetSpec, Episode
from robotloop.errors import BadInput
from robotloop.errors import NotFound as Missing
from robotloop.storage import BucketClient, BucketUrl, NotFound
from robotloop.storage.cache import ReadCache
from robotloop.train.data import DatasetMismatch, DataSettings, StaleState, StreamingSampler

from .conftest import WRITE_TOKEN

SPEC = DatasetSpec({"top": (24, 32, 3)}, state_dim=4, action_dim=3, fps=50, vcodec="h264", with_reward=False)
LENGTHS = [12, 30, 20]
CHUNK = 16


def known_episode(k: int, frames: int) -> Episode:
    t = np.arange(frames, dtype=np.float32)
    images = np.stack([np.full((24, 32, 3), (20 * i + 40 * k) % 250, np.uint8) for i in range(frames)])
    state = np.tile((100 * k + t)[:, None], (1, SPEC.state_dim))
    action = np.tile((1000 * k + t)[:, None], (1, SPEC.action_dim))
    return Episode({"top": images}, state, action, "transfer the cube")


def record(client: BucketClient, url: BucketUrl, lengths: list[int], staging: Path) -> DatasetRecorder:
    recorder = DatasetRecorder(client, url, SPEC, staging=staging)
    for k, n in enumerate(lengths):
        recorder.commit(known_episode(k, n))
    return recorder


def settings(**kw) -> DataSettings:
    return DataSettings(**{"decode_workers": 1, "chunk_size": CHUNK, "refresh_every_s": 0, "seed": 7, **kw})


def where(batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """(episode, frame) of each sample, read back from its state."""
    state = batch["observation.state"][:, 0].cpu().numpy().astype(int)
    return state // 100, state % 100


@pytest.fixture(scope="module")
def dataset(bucket_server, tmp_path_factory) -> BucketUrl:
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/train-data/datasets/known")
    record(client, url, LENGTHS, tmp_path_factory.mktemp("stage"))
    return url


@pytest.fixture(scope="module")
def full(bucket_server, dataset, tmp_path_factory):
    """A sampler whose buffer holds the whole dataset; its cache shows what was downloaded."""
    cache = ReadCache(tmp_path_factory.mktemp("cache"), 1 << 30)
    sampler = StreamingSampler(BucketClient(bucket_server.endpoint, WRITE_TOKEN, cache), [dataset], settings())
    sampler.wait_ready(timeout_s=120)
    yield sampler, cache
    sampler.close()


def test_batches_hold_the_recorded_values(full):
    sampler, _ = full
    batch = sampler.next_batch(256)
    assert (
        batch["observation.images.top"].shape == (256, 3, 24, 32)
        and batch["observation.images.top"].dtype == torch.uint8
    )
    assert batch["observation.state"].shape == (256, 4) and batch["observation.state"].dtype == torch.float32
    assert batch["action"].shape == (256, CHUNK, 3) and batch["action"].dtype == torch.float32
    assert batch["action_is_pad"].shape == (256, CHUNK) and batch["action_is_pad"].dtype == torch.bool
    k, t = where(batch)
    assert set(k) == {0, 1, 2}  # uniform over frames: every episode shows up
    assert (batch["observation.state"] == torch.from_numpy(100.0 * k + t)[:, None].float()).all()
    length = np.array(LENGTHS)[k]
    ahead = t[:, None] + np.arange(CHUNK)
    want = 1000 * k[:, None] + np.minimum(ahead, length[:, None] - 1)  # clamped to the episode's last action
    assert (batch["action"][:, :, 0].numpy() == want).all()
    assert (batch["action_is_pad"].numpy() == (ahead >= length[:, None])).all()
    pixels = batch["observation.images.top"].float().mean(dim=(1, 2, 3)).numpy()
    assert (
        np.abs(pixels - (20 * t + 40 * k) % 250).max() < 4
    )  # h264 at crf 30: flat frames come back within a few levels


def test_action_chunks_pad_exactly_as_lerobot(full, bucket_server, dataset, tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    sampler, _ = full
    reference = tmp_path / "copy"  # a full copy for lerobot, through a client without the sampler's cache
    BucketClient(bucket_server.endpoint, WRITE_TOKEN).fetch(dataset, reference)
    lerobot = LeRobotDataset(
        dataset.bucket_id, root=reference, delta_timestamps={"action": [i / SPEC.fps for i in range(CHUNK)]}
    )
    batch = sampler.next_batch(3000)  # covers all 62 frames (seeded, so always the same draw)
    k, t = where(batch)
    starts = np.cumsum([0, *LENGTHS])
    for index in [0, 5, 11, 12, 30, 41, 42, 50, 55, 61]:
        item = lerobot[index]
        ep, frame = int(item["episode_index"]), int(item["frame_index"])
        b = int(np.flatnonzero((k == ep) & (t == frame))[0])
        assert index == starts[ep] + frame
        assert torch.equal(batch["action"][b], item["action"]), index
        assert torch.equal(batch["action_is_pad"][b], item["action_is_pad"]), index
        assert (batch["observation.images.top"][b].float() - item["observation.images.top"] * 255).abs().max() <= 2


def test_same_seed_same_batches_and_resume_is_exact(full, bucket_server, dataset):
    sampler, _ = full
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    with StreamingSampler(client, [dataset], settings()) as a:
        a.wait_ready(timeout_s=120)
        first = [a.next_batch(8) for _ in range(3)]
        state = a.state_dict()
        after = [a.next_batch(8) for _ in range(3)]
        assert a.wait_s < 120
    # The fixture's sampler has drawn other batches; loading the state makes it continue a's sequence.
    sampler.load_state_dict(torch.load(_saved(state), weights_only=True))
    resumed = [sampler.next_batch(8) for _ in range(3)]
    for x, y in zip(after, resumed, strict=True):
        assert all(torch.equal(x[key], y[key]) for key in x)
    with StreamingSampler(client, [dataset], settings()) as b:  # same seed, fresh: same sequence from the start
        b.wait_ready(timeout_s=120)
        for x, y in zip(first, [b.next_batch(8) for _ in range(3)], strict=True):
            assert all(torch.equal(x[key], y[key]) for key in x)


def test_resume_decodes_the_episodes_that_were_in_flight_at_the_save(bucket_server, dataset):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    with StreamingSampler(client, [dataset], settings()) as a:
        deadline = time.monotonic() + 60
        while not a._feed.order.in_flight and time.monotonic() < deadline:  # saved while decode workers hold episodes
            time.sleep(0.01)
        assert a._feed.order.in_flight, "no episode was ever in flight"
        state = a.state_dict()
    assert len(state["buffered"]) < len(LENGTHS)
    with StreamingSampler(client, [dataset], settings()) as b:
        b.load_state_dict(torch.load(_saved(state), weights_only=True))
        b.wait_ready(timeout_s=60)  # every episode: none lost because it was being decoded at the save
        assert sorted(i for _, i in b.buffered_episodes) == list(range(len(LENGTHS)))


def _saved(state: dict):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)  # the state must survive a checkpoint round trip
    buffer.seek(0)
    return buffer


def test_nothing_is_downloaded_whole(full):
    sampler, cache = full
    # The recorder packs episodes into shared data/video files (as lerobot does): they are read by byte
    # ranges, and nothing of the dataset lands in the read cache as a whole file.
    assert all(f["url"].endswith(("file-000.parquet", "file-000.mp4")) for e in sampler.episodes() for f in e["files"])
    assert {p.name for p in cache.root.glob("??/*")} == set()
    lineage = sampler.episodes()
    assert [e["episode_index"] for e in lineage] == [0, 1, 2]
    assert all(
        f["url"].startswith(str(sampler.sources[0].url)) and len(f["xet_hash"]) == 64
        for e in lineage
        for f in e["files"]
    )


def test_ranks_take_disjoint_episodes(bucket_server, dataset, tmp_path):
    shares = []
    for rank in range(2):
        cache = ReadCache(tmp_path / f"cache-{rank}", 1 << 30)
        with StreamingSampler(
            BucketClient(bucket_server.endpoint, WRITE_TOKEN, cache), [dataset], settings(), rank=rank, world_size=2
        ) as sampler:
            sampler.wait_ready(timeout_s=120)
            k, _ = where(sampler.next_batch(200))
            shares.append({e["episode_index"] for e in sampler.episodes()})
            assert set(k) == shares[-1]
    assert shares == [{0, 2}, {1}]


def test_episodes_committed_while_training_are_picked_up(bucket_server, tmp_path):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/train-data/datasets/live")
    recorder = record(client, url, [12, 14], tmp_path / "stage")
    with StreamingSampler(client, [url], settings()) as sampler:
        sampler.wait_ready(timeout_s=120)
        assert set(where(sampler.next_batch(100))[0]) == {0, 1}
        assert sampler.refresh() == 0
        recorder.commit(known_episode(2, 16))  # the recorder commits while the trainer samples
        assert sampler.refresh() == 1
        sampler.wait_ready(timeout_s=120)
        assert set(where(sampler.next_batch(200))[0]) == {0, 1, 2}
        assert [e["episode_index"] for e in sampler.episodes()] == [0, 1, 2]


def test_a_small_buffer_streams_every_episode_through(bucket_server, dataset):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    with StreamingSampler(client, [dataset], settings(buffer_frames=35)) as sampler:
        seen: set[int] = set()
        for _ in range(2000):
            seen |= set(where(sampler.next_batch(8))[0].tolist())
            assert sampler.buffered_frames <= 35
            if seen == {0, 1, 2}:
                break
            time.sleep(0.005)
        assert seen == {0, 1, 2}


def test_datasets_with_other_features_are_refused(bucket_server, dataset, tmp_path):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/train-data/datasets/bigger")
    other = DatasetSpec({"top": (48, 64, 3)}, 4, 3, fps=50, vcodec="h264", with_reward=False)
    episode = known_episode(0, 12)
    episode.images = {"top": np.zeros((12, 48, 64, 3), np.uint8)}
    DatasetRecorder(client, url, other, staging=tmp_path / "stage").commit(episode)
    with pytest.raises(DatasetMismatch, match="one DatasetSpec"):
        StreamingSampler(client, [dataset, url], settings())
    with pytest.raises(NotFound, match="datasets holds no LeRobot dataset: no meta/info.json"):  # a parent folder
        StreamingSampler(client, [BucketUrl.parse("hf://buckets/lab/train-data/datasets")], settings())
    with pytest.raises(NotFound, match="bucket 'lab/no-such' does not exist"):
        StreamingSampler(client, [BucketUrl.parse("hf://buckets/lab/no-such/datasets/x")], settings())


def test_files_shared_by_episodes_are_read_by_ranges(bucket_server, tmp_path):
    """lerobot's own writer packs episodes into one parquet and one mp4: those files are never downloaded."""
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    url = BucketUrl.parse("hf://buckets/lab/train-data/datasets/packed")
    writer = LeRobotDataset.create(
        url.bucket_id,
        fps=SPEC.fps,
        features=SPEC.features(),
        root=tmp_path / "ds",
        rgb_encoder=RGBEncoderConfig(vcodec="h264"),
    )
    for k, n in enumerate([12, 20]):
        episode = known_episode(k, n)
        for t in range(n):
            writer.add_frame(
                {
                    "observation.images.top": episode.images["top"][t],
                    "observation.state": episode.state[t],
                    "action": episode.action[t],
                    "task": episode.task,
                }
            )
        writer.save_episode()
    writer.finalize()
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN, ReadCache(tmp_path / "cache", 1 << 30))
    client.create_bucket(url)
    client.upload(tmp_path / "ds", url)
    with StreamingSampler(client, [url], settings()) as sampler:
        files = {f["url"] for e in sampler.episodes() for f in e["files"]}
        assert len(files) == 2  # one parquet and one mp4 for both episodes
        sampler.wait_ready(timeout_s=120)
        batch = sampler.next_batch(256)
    k, t = where(batch)
    assert set(k) == {0, 1}
    length = np.array([12, 20])[k]
    want = 1000 * k[:, None] + np.minimum(t[:, None] + np.arange(CHUNK), length[:, None] - 1)
    assert (batch["action"][:, :, 0].numpy() == want).all()
    pixels = batch["observation.images.top"].float().mean(dim=(1, 2, 3)).numpy()
    assert np.abs(pixels - (20 * t + 40 * k) % 250).max() < 4
    assert not list((tmp_path / "cache").glob("??/*"))  # nothing went through the whole-file download path


def test_pyav_decodes_the_frames_torchcodec_does(bucket_server, dataset, tmp_path):
    """Where FFmpeg's shared libraries are missing (torchcodec cannot load), PyAV's bundled FFmpeg decodes the
    same frames: same rows, same frame for every timestamp, in ranged reads and whole-file downloads."""
    from robotloop.train.data import _FRAME_READERS, DatasetSource, _decode_episode

    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    refs = DatasetSource(client, dataset).episodes
    for ref in refs:
        by = {name: _decode_episode(client, ref, SPEC.fps, tmp_path, read) for name, read in _FRAME_READERS.items()}
        assert torch.equal(by["pyav"]["observation.state"], by["torchcodec"]["observation.state"])
        a, b = by["pyav"]["observation.images.top"], by["torchcodec"]["observation.images.top"]
        assert a.shape == b.shape == (ref.length, 3, 24, 32)
        assert (a.int() - b.int()).abs().max() <= 2, ref.index  # same frames; colour conversion may round apart
    with StreamingSampler(client, [dataset], settings(video_backend="pyav")) as sampler:
        sampler.wait_ready(timeout_s=120)
        batch = sampler.next_batch(64)
    assert sampler.video_backend == "pyav"
    k, t = where(batch)
    pixels = batch["observation.images.top"].float().mean(dim=(1, 2, 3)).numpy()
    assert np.abs(pixels - (20 * t + 40 * k) % 250).max() < 4


def test_unknown_video_backend_is_refused():
    with pytest.raises(ValueError, match="video_backend") as refused:
        DataSettings(video_backend="opencv")
    assert isinstance(refused.value, BadInput)


def test_bad_input_is_filed_under_the_error_model(full, bucket_server, dataset):
    """What the caller got wrong is a BadInput (or NotFound) and still the ValueError it was before."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    bad = (([], 0, 1, "at least one dataset"), ([dataset], 2, 2, r"rank 2 is not in \[0, 2\)"))
    for urls, rank, world, want in bad:
        with pytest.raises(BadInput, match=want) as refused:
            StreamingSampler(client, urls, settings(), rank=rank, world_size=world)
        assert isinstance(refused.value, ValueError)
    sampler, _ = full
    state = sampler.state_dict()
    with pytest.raises(BadInput, match="state is for rank/world/seed"):
        sampler.load_state_dict({**state, "world": [1, 2, 7]})
    gone = {**state, "known": [*state["known"], [str(dataset), 99]]}  # an episode the dataset does not hold
    with pytest.raises(Missing, match="do not hold") as stale:
        sampler.load_state_dict(gone)
    assert isinstance(stale.value, StaleState) and isinstance(stale.value, ValueError)


def test_a_dataset_at_a_bucket_root_streams(bucket_server, tmp_path):
    """lerobot's bucket reader wants a dataset at the bucket's root; the sampler reads it there too."""
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/root-dataset")
    client.create_bucket(url)
    record(client, url, [12], tmp_path / "stage")
    with StreamingSampler(client, [url], settings()) as sampler:
        assert [e["episode_index"] for e in sampler.episodes()] == [0]
        sampler.wait_ready(timeout_s=120)
        k, t = where(sampler.next_batch(8))
    assert set(k) == {0} and (t < 12).all()


def test_several_datasets_normalize_with_their_combined_stats():
    from types import SimpleNamespace

    from robotloop.train.data import _combined_stats

    def source(mean: float, std: float, count: int) -> SimpleNamespace:
        feature = {"mean": [mean], "std": [std], "min": [mean - 1], "max": [mean + 1], "count": [count]}
        return SimpleNamespace(url="hf://buckets/lab/x", stats={"action": feature})

    both = _combined_stats([source(0.0, 1.0, 100), source(10.0, 1.0, 300)])["action"]
    assert both["mean"] == [7.5] and both["min"] == [-1.0] and both["max"] == [11.0] and both["count"] == [400]
    assert 4.0 < both["std"][0] < 5.0  # the spread between the datasets counts, not just within each
    assert _combined_stats([source(2.0, 1.0, 5), SimpleNamespace(url="u", stats={})])["action"]["mean"] == [2.0]


def test_close_removes_the_workers_scratch_and_frees_the_buffer(bucket_server, dataset):
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    sampler = StreamingSampler(client, [dataset], settings(decode_workers=2))
    sampler.next_batch(4)
    scratch = Path(sampler._feed.pool.scratch)
    assert scratch.is_dir()
    sampler.close()
    assert not scratch.exists() and sampler.arena.tensors == {}
    assert not any(w.is_alive() for w in sampler._feed.pool.workers)


# -- the pieces, one at a time -------------------------------------------------------------------------------------
def test_the_catalog_reads_the_recorded_episodes_and_splits_them_between_ranks(bucket_server, dataset, tmp_path):
    from robotloop.train.data import EpisodeCatalog

    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    catalogs = [EpisodeCatalog(client, [dataset], rank, 2) for rank in range(2)]
    for catalog in catalogs:
        assert catalog.fps == SPEC.fps and catalog.video_keys == ["observation.images.top"]
        assert set(catalog.features) == {"observation.images.top", "observation.state", "action"}
        assert catalog.frame_shapes() == {
            "observation.images.top": ((3, 24, 32), torch.uint8),
            "observation.state": ((4,), torch.float32),
            "action": ((3,), torch.float32),
        }
        assert catalog.known == {}  # nothing is this rank's until the sampler takes it
    refs = catalogs[0].sources[0].episodes
    assert [(r.index, r.length) for r in refs] == list(enumerate(LENGTHS))
    assert [r.to_index - r.from_index for r in refs] == LENGTHS
    taken = [catalog.take(refs, 0) for catalog in catalogs]
    assert taken == [[(str(dataset), 0), (str(dataset), 2)], [(str(dataset), 1)]]
    assert catalogs[0].take(refs, 0) == []  # known already
    assert catalogs[0].share_frames() == LENGTHS[0] + LENGTHS[2]
    assert [r.index for r in catalogs[1].refs()] == [1]
    assert [r.index for r in catalogs[1].refs(all_ranks=True)] == [0, 1, 2]
    lineage = refs[1].lineage()
    assert lineage["episode_index"] == 1 and lineage["length"] == LENGTHS[1]
    assert [f.get("video_key") for f in lineage["files"]] == [None, "observation.images.top"]
    assert all(len(f["xet_hash"]) == 64 for f in lineage["files"])

    live = BucketUrl.parse("hf://buckets/lab/train-data/datasets/catalog-live")
    recorder = record(client, live, [12], tmp_path / "stage")
    catalog = EpisodeCatalog(client, [live], 0, 1)
    assert catalog.take(catalog.sources[0].episodes, 0) == [(str(live), 0)]
    recorder.commit(known_episode(1, 14))
    assert [r.index for r in catalog.sources[0].refresh()] == [1]  # only what was committed since
    assert catalog.sources[0].refresh() == []


def test_the_schedule_permutes_per_pass_puts_fresh_episodes_first_and_restores_first():
    from robotloop.train.data import DecodeSchedule, EpisodeRef, FileRef

    def ref(i: int, length: int = 10) -> EpisodeRef:
        return EpisodeRef("d", i, length, 0, length, FileRef("u", "h", 1, False), {})

    keys = [("d", i) for i in range(6)]
    known = {k: ref(k[1]) for k in keys}
    a, b = DecodeSchedule(seed=3), DecodeSchedule(seed=3)
    a.add(keys)
    b.add(keys)
    assert list(a.queue) == list(b.queue) and sorted(a.queue) == keys  # seeded: the same order every time
    a.add([("d", 9)], fresh=True)
    assert a.queue[0] == ("d", 9)  # a fresh episode jumps the queue
    order = [a.next(known, set(), bound=1000) for _ in range(7)]
    assert order[0] == ("d", 9) and a.next(known, set(), bound=1000) is None  # all fit: no second pass
    assert a.passes == 0
    first = a.next(known, busy={("d", 0)}, bound=30)  # 60 frames in a 30-frame buffer: a new pass
    assert a.passes == 1 and first != ("d", 0) and ("d", 0) not in a.queue
    a.restart([("d", 4), ("d", 1)], [("d", 2)])
    assert a.next(known, busy={("d", 4)}, bound=30) == ("d", 4)  # to restore: decoded even though busy
    a.restored(("d", 1))  # not the next one to restore: nothing changes
    assert a.restore == [("d", 4), ("d", 1)]
    a.restored(("d", 4))
    assert a.restore == [("d", 1)]


def test_the_arena_grows_then_wraps_evicting_the_oldest_episodes():
    from robotloop.train.data import DataError, FrameArena

    shapes = {"action": ((2,), torch.float32)}
    arena = FrameArena(shapes, bound=10, device=torch.device("cpu"))

    def put(key: str, length: int) -> tuple[int, list]:
        start, evicted = arena.place(("d", key), length, hint=4)
        arena.fill(start, {"action": torch.full((length, 2), float(ord(key)))})
        return start, evicted

    assert arena.grows(3) and put("a", 3) == (0, []) and arena.capacity == 4  # sized for the hint
    assert arena.grows(3) and put("b", 3) == (3, []) and arena.capacity == 8  # doubled
    assert put("c", 3) == (6, []) and arena.capacity == 10  # up to the bound, never past it
    assert not arena.grows(3)
    assert put("d", 3) == (0, [("d", "a")])  # wrapped: the oldest episode it overlaps goes
    assert arena.tensors["action"][6:9, 0].tolist() == [ord("c")] * 3  # growth kept what was buffered
    assert arena.last[0:3].tolist() == [2, 2, 2] and arena.last[6:9].tolist() == [8, 8, 8]
    view = arena.view()
    assert view.keys == [("d", "b"), ("d", "c"), ("d", "d")]  # insertion order, not slot order
    assert view.start_list == [3, 6, 0] and view.offset_list == [0, 3, 6, 9]
    assert arena.view(exclude=("d", "d")).keys == [("d", "b"), ("d", "c")] and view.total == 9
    assert put("e", 4) == (3, [("d", "b"), ("d", "c")])  # one episode may evict several
    assert list(arena.slots) == [("d", "d"), ("d", "e")] and arena.last[3:7].tolist() == [6] * 4
    with pytest.raises(DataError, match="more than the buffer holds"):
        arena.place(("d", "e"), 11, hint=11)
    arena.clear()
    assert arena.view().total == 0 and put("f", 2) == (0, [])


def test_an_arena_without_room_to_double_grows_to_what_fits_then_wraps(caplog):
    from robotloop.train.data import DataError, FrameArena

    class SmallDevice(FrameArena):
        """A stand-in for a GPU with room for `room` frames in all (an out-of-memory GPU cannot be had here):
        old and new tensors both count while a growth copies."""

        room = 18

        def _allocate(self, capacity):
            if self.capacity + capacity > self.room:
                raise torch.OutOfMemoryError(f"no room for {capacity} frames")
            return super()._allocate(capacity)

        def _frames_free(self):
            return self.room - self.capacity

    def put(arena, key: str, length: int) -> tuple[int, list]:
        start, evicted = arena.place(("d", key), length, hint=4)
        arena.fill(start, {"action": torch.full((length, 2), float(ord(key)))})
        return start, evicted

    shapes = {"action": ((2,), torch.float32)}
    arena = SmallDevice(shapes, bound=40, device=torch.device("cpu"))
    assert put(arena, "a", 3) == (0, []) and put(arena, "b", 3) == (3, []) and arena.capacity == 8
    with caplog.at_level("WARNING"):
        assert put(arena, "c", 3) == (6, [])  # 16 did not fit beside 8: 10 did, and the arena stops there
    assert arena.capacity == arena.bound == 10 and not arena.grows(3) and "stops growing at 10" in caplog.text
    assert arena.tensors["action"][:9, 0].tolist() == [ord("a")] * 3 + [ord("b")] * 3 + [ord("c")] * 3
    assert put(arena, "d", 3) == (0, [("d", "a")])  # wraps, evicting the oldest

    full = SmallDevice(shapes, bound=40, device=torch.device("cpu"))
    full.room = 14
    put(full, "a", 3), put(full, "b", 3)
    assert put(full, "c", 3) == (0, [("d", "a")])  # not even 9 fit beside 8: no growth, it wraps at once
    assert full.capacity == full.bound == 8
    with pytest.raises(DataError, match="more than the buffer holds"):
        full.place(("d", "e"), 9, hint=9)  # longer than the arena it settled at: refused, nothing changed
    assert list(full.slots) == [("d", "b"), ("d", "c")]

    none = SmallDevice(shapes, bound=40, device=torch.device("cpu"))
    none.room = 2
    with pytest.raises(DataError, match="no room for 3 frames"):
        none.place(("d", "a"), 3, hint=4)


def test_decode_results_enter_in_job_order_and_a_drop_makes_older_jobs_stale():
    from robotloop.train.data import DecodeOrder

    order = DecodeOrder()
    seqs = [order.number(("d", i)) for i in range(3)]
    assert seqs == [0, 1, 2] and not order.room(3) and order.room(4)
    assert order.hold(1, {"x": 1}, None) and order.take_next() is None  # job 0 has not come back yet
    assert order.hold(0, {"x": 0}, None)
    assert order.take_next() == (0, ("d", 0), {"x": 0}, None)
    assert order.take_next() is None  # job 0 is being copied in: job 1 waits until it is ingested
    order.ingested(0)
    assert order.take_next() == (1, ("d", 1), {"x": 1}, None)
    order.ingested(1)
    assert order.in_flight_keys() == [("d", 2)] and order.busy() == {("d", 2)}
    order.drop()
    assert order.busy() == set() and order.room(1)
    assert not order.hold(2, {"x": 2}, None)  # submitted before the drop: stale
    assert order.number(("d", 5)) == 3 and order.hold(3, None, "boom")
    assert order.take_next() == (3, ("d", 5), None, "boom")
