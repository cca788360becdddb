"""Which torch device a command runs on: one check for train, eval, the loop and robots."""

from __future__ import annotations

import logging

import torch

from ..errors import BadValue

log = logging.getLogger(__name__)


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


def release_cuda_memory() -> None:
    """Give back to the GPU what a finished training in this process still holds, so that the processes started
    next (the loop's sim robots and evaluation workers, each with its own CUDA context) have the memory.

    Two things keep it otherwise, for as long as the process lives: torch.compile's CUDA graphs (the `cuda_graphs`
    option) keep a private memory pool while their compiled code is cached, and the code cache is global (it hangs
    on the policy class's methods, not on one policy); and torch's caching allocator keeps every freed block. On an
    80 GB card the h200 preset's training left too little for ten fleet robots (2026-12-05: "CUDA error: out of
    memory" as each loaded its release). The cost: the next training in this process compiles again (from the
    on-disk compile caches). Call it with no training running in this process; a no-op where CUDA was never used.
    """
    if not torch.cuda.is_initialized():
        return
    import gc

    try:
        torch._dynamo.reset()  # drops the compiled code, and with it the CUDA graph trees and their memory pools
        gc.collect()
        torch.cuda.empty_cache()
    except Exception as error:  # noqa: BLE001 - a device already failing (the training's own error) must not be hidden
        log.warning("GPU memory not given back after training: %s", error)
