"""Which torch device a command runs on: one check for train, eval, the loop and robots."""

from __future__ import annotations

import torch

from ..errors import BadValue


def resolve_device(device: str) -> str:
    """`auto` becomes `cuda` when torch sees a GPU, else `cpu` (LeRobot's tools default to cuda; a GPU user who
    forgets the flag should not train on the CPU). Other values are checked, so that a typo or a missing GPU is
    a clear error before any work starts, not a torch traceback minutes into a run.

    Example:
        ```python
        >>> resolve_device("auto")
        'cpu'
        ```

    Raises:
        ValueError: not a torch device (`gpu`), CUDA asked for on a machine without it, or `cuda:N` past the
            GPUs there are.
    """
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise BadValue(f"device {device!r}: not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BadValue(f"device {device!r}: CUDA is not available on this machine (use 'cpu')")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise BadValue(f"device {device!r}: this machine has {torch.cuda.device_count()} GPU(s)")
    return device
