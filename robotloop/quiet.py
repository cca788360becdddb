"""Quieter video encoding, for processes that record: the CLI's recording commands and the capture service."""

from __future__ import annotations

import os


def quiet_encoders() -> None:
    """Keep what video encoding prints about itself out of a command's output: SVT-AV1's banner and notes (about
    25 lines per episode; errors still show) and the tqdm bars lerobot's writer draws for every episode (`Map`,
    `Validate all meta data`). Variables the user set win. For entry points that record; process-wide, so the entry
    point's choice, not the library's (the commands draw their own progress with rich)."""
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's log level, read when an encoder starts: 1 = errors
    os.environ.setdefault("TQDM_DISABLE", "1")  # read by every tqdm bar as it is made
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # `datasets` bars ignore TQDM_DISABLE
