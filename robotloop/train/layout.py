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


def resolve_checkpoint(client: BucketClient, url: BucketUrl) -> BucketUrl:
    """The checkpoint step folder `url` means: a step folder (`<run>/checkpoints/<step>`, `checkpoints/2000` as
    `002000`, or its `pretrained_model`) as it is; a run, its last complete checkpoint (`checkpoints/last.json`).

    Raises:
        NotFound: `url` is no step folder and no run with a complete checkpoint.
    """
    parts = url.path.split("/")
    if parts[-1] == "pretrained_model":
        parts = parts[:-1]
    if len(parts) >= 2 and parts[-2] == "checkpoints" and parts[-1].isdigit():
        return checkpoint_url(BucketUrl(url.bucket_id, "/".join(parts[:-2])), int(parts[-1]))
    step = latest_step(client, url)
    if step is None:
        raise NotFound(
            f"{url}: neither a checkpoint folder (<run>/checkpoints/<step>) nor a run with a complete checkpoint "
            "(no checkpoints/last.json)"
        )
    return checkpoint_url(url, step)


def latest_step(client: BucketClient, output: BucketUrl) -> int | None:
    """The step of the last complete checkpoint under `output` (its `checkpoints/last.json`), or None."""
    try:
        return json.loads(client.read_range(output / "checkpoints" / "last.json", 0, 1 << 16))["step"]
    except NotFound:
        return None
