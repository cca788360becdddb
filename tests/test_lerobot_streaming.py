"""lerobot 0.6.1's own StreamingLeRobotDataset(repo_type="bucket") reads a dataset from robotloop's bucket server."""

import os
import subprocess
import sys
import textwrap

from robotloop.storage import BucketClient, BucketUrl

from .conftest import WRITE_TOKEN

MAKE = textwrap.dedent(
    """
    import sys, numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    features = {
        "observation.images.top": {"dtype": "video", "shape": (24, 32, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (14,), "names": None},
        "action": {"dtype": "float32", "shape": (14,), "names": None},
    }
    ds = LeRobotDataset.create("lab/tiny", fps=50, features=features, root=sys.argv[1], video_backend="pyav")
    for ep in range(2):
        for i in range(10):
            ds.add_frame({"observation.images.top": np.full((24, 32, 3), 20 * i, np.uint8),
                          "observation.state": np.full(14, i, np.float32),
                          "action": np.full(14, ep, np.float32), "task": "transfer the cube"})
        ds.save_episode()
    ds.finalize()
    """
)

READ = textwrap.dedent(
    """
    import torch
    from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset
    ds = StreamingLeRobotDataset("lab/lerobot-stream", repo_type="bucket", shuffle=False)
    items = list(ds)
    assert len(items) == 20, len(items)
    actions = sorted(float(it["action"][0]) for it in items)
    assert actions == [0.0] * 10 + [1.0] * 10, actions
    frame = items[0]["observation.images.top"]
    assert frame.shape == (3, 24, 32), frame.shape
    print("ok", len(items), ds.meta.total_episodes)
    """
)


def test_lerobot_streams_a_bucket_dataset(bucket_server, tmp_path):
    subprocess.run([sys.executable, "-c", MAKE, str(tmp_path / "ds")], check=True, capture_output=True)
    client = BucketClient(bucket_server.endpoint, WRITE_TOKEN)
    url = BucketUrl.parse("hf://buckets/lab/lerobot-stream")
    client.create_bucket(url)
    client.upload(tmp_path / "ds", url)
    # huggingface_hub reads HF_ENDPOINT at import, so the reader runs as its own process, as a user's would.
    env = {
        **os.environ,
        "HF_ENDPOINT": bucket_server.endpoint,
        "HF_TOKEN": WRITE_TOKEN,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_LEROBOT_HOME": str(tmp_path / "lerobot"),
    }
    read = subprocess.run([sys.executable, "-c", READ], env=env, capture_output=True, text=True, timeout=240)
    assert read.returncode == 0, read.stderr[-4000:]
    assert "ok 20 2" in read.stdout
