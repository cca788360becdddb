"""Training progress: one wire type from the trainer to the agent.

The trainer reports a `Progress` (its `on_progress` callback); `robotloop train --progress-file` writes each one
as a JSON line (`progress_line`); the training service reads the lines back into the same type (`read_line`)
and copies `JOB_FIELDS` into the job's state by name; GET /v1/jobs/<id> and the agent's watch_training show
those fields as they are. Nothing on the way renames or recomputes a field.

Example:
    ```python
    >>> line = progress_line("progress", Progress(step=50, loss=0.41, samples_per_s=900.0, data_wait_share=0.01))
    >>> read_line(line)
    ('progress', Progress(step=50, loss=0.41, samples_per_s=900.0, data_wait_share=0.01, episodes=None, ...))
    ```
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from pydantic import TypeAdapter, ValidationError


@dataclass
class Progress:
    """Where a run stands at a log step (or at its end). None: not known (yet), or not finite (a NaN loss)."""

    step: int
    loss: float | None
    samples_per_s: float | None
    data_wait_share: float | None
    episodes: int | None = None  # in the sampler's buffer
    elapsed_s: float = 0.0  # since this run's first step (its compile included)
    data_wait_s: float = 0.0  # of which inside next_batch; two reports give the rate and share between them
    data_gpu_s: float = 0.0  # blocked on an empty buffer + GPU time of sampling (see StreamingSampler.gpu_s)
    last_checkpoint: str | None = None  # URL of the latest checkpoint this run wrote


# What a training job's state shows of its progress (robotloop.train.jobs.JobState has these fields).
JOB_FIELDS = ("step", "loss", "samples_per_s", "data_wait_share", "episodes", "last_checkpoint")

_WIRE = TypeAdapter(Progress)  # reads a line back with the dataclass's types checked


def progress_line(event: str, progress: Progress, **extra: Any) -> str:
    """One line of the progress file: `{"event": ..., <progress fields>, <extra>}`, newline included.

    `extra` adds fields only the run's summary has (the "done" line: wall time, the checkpoints list, ...).
    """
    record = {"event": event, **asdict(progress), **extra}
    # Non-finite floats become null: the file stays strict JSON (a NaN loss is reported as unknown).
    clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    return json.dumps(clean) + "\n"


def read_line(line: bytes | str) -> tuple[str, Progress] | None:
    """The event and progress of one line of the progress file; None for a torn or foreign line."""
    try:
        record = json.loads(line)
        known = {f.name: record[f.name] for f in fields(Progress) if f.name in record}
        return str(record["event"]), _WIRE.validate_python(known)
    except (ValueError, KeyError, TypeError, ValidationError):
        return None
