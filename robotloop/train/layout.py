"""Where a run's checkpoints live in its bucket (see `robotloop.train.checkpoint` for what each holds).

Apart from the checkpoint code on purpose: publishing, evaluation and the agent find checkpoints without
importing torch.
"""

from __future__ import annotations

import json

from ..storage import BucketClient, BucketUrl, NotFound

STEP_DIR = "{:06d}"


def checkpoint_url(output: BucketUrl, step: int) -> BucketUrl:
    """`<output>/checkpoints/<step:06d>`."""
    return output / "checkpoints" / STEP_DIR.format(step)


def latest_step(client: BucketClient, output: BucketUrl) -> int | None:
    """The step of the last complete checkpoint under `output` (its `checkpoints/last.json`), or None."""
    try:
        return json.loads(client.read_range(output / "checkpoints" / "last.json", 0, 1 << 16))["step"]
    except NotFound:
        return None
