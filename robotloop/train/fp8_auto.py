"""fp8="auto" decided in a child process, so that the training process stays as an fp8="off" run would be.

"auto" times linear shapes compiled (with CUDA graphs when training uses them) and the whole step eagerly, on the
training GPU. Done inside the training process, on one H200 "auto" that then converted no layer still ran the
default ACT's batch-8 step at 0.76x and 0.81x of "off" (two runs; resetting dynamo and the CUDA graph trees
between the measurements and the policy's compile did not remove it; BENCHMARKS.md). Whatever the measurements
leave behind (compiled code, CUDA graph pools, allocator state, random streams), a spawned child keeps it: it
rebuilds the same architecture from the job (random weights: timings do not depend on the values), decides, and
answers with layer names. The parent only converts those names, as a recipe run would.

The child gets the job and a CPU copy of the first batch through multiprocessing's pipe (pickle between two
processes of this run on this machine, never a network path).

Example:
    ```python
    >>> job = Fp8AutoJob(features, stats, settings, "cuda:0", Accelerator.detect("cuda"), path)
    >>> chosen, timing = decide_fp8_auto_in_child(job, batch)  # ([] and None when the child fails: bf16)
    ```
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .fp8 import Accelerator, AutoFp8, Measure, ShapeTiming, StepTimer, gpu_measure

if TYPE_CHECKING:
    from .policy import ACTSettings

log = logging.getLogger(__name__)

CHILD_TIMEOUT_S = 1800.0  # cold compiles of every shape: minutes on an H200, never half an hour


@dataclass(frozen=True)
class Fp8AutoJob:
    """What a child process needs to rebuild the policy and run "auto" there (all picklable).

    `measure` and `time_step` stand in for the GPU timers in tests (module-level callables); None: the real ones.
    """

    features: dict[str, Any]
    stats: dict[str, dict[str, Any]]
    settings: ACTSettings
    device: str
    accelerator: Accelerator
    cache_path: Path
    measure: Measure | None = None
    time_step: StepTimer | None = None


def decide_fp8_auto_in_child(
    job: Fp8AutoJob, batch: dict[str, Tensor], timeout_s: float = CHILD_TIMEOUT_S
) -> tuple[list[str], ShapeTiming | None]:
    """The layers "auto" picks for `job`'s policy on `batch`, decided in a spawned process, and the whole step's
    timing if it was measured. A child that fails or takes longer than `timeout_s` means bf16 (`[]`, logged): the
    one mode that is never slower than bf16."""
    ctx = torch.multiprocessing.get_context("spawn")
    answers, child_end = ctx.Pipe(duplex=False)
    cpu_batch = {k: v.detach().cpu() for k, v in batch.items()}
    proc = ctx.Process(target=_child_main, args=(job, cpu_batch, child_end), name="robotloop-fp8-auto")
    t0 = time.perf_counter()
    proc.start()
    child_end.close()  # so that a child that dies closes the pipe's last writer: recv raises EOFError
    try:
        answer = answers.recv() if answers.poll(timeout_s) else ("error", f"no answer in {timeout_s:.0f} s")
    except EOFError:
        answer = ("error", "it exited without answering")
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if answer[0] != "ok":
        log.warning(
            "FP8 auto: deciding in a child process failed (%s, exit %s): training in bf16", answer[1], proc.exitcode
        )
        return [], None
    _, chosen, timing = answer
    log.info("FP8 auto: decided in a child process in %.1f s: %d layers", time.perf_counter() - t0, len(chosen))
    return list(chosen), ShapeTiming(*timing) if timing else None


def _child_main(job: Fp8AutoJob, batch: dict[str, Tensor], answers) -> None:
    """The child: the policy as the parent built it, but eager and in bf16 ("off"), then `AutoFp8.decide`."""
    from ..output import log_to_console

    log_to_console(level=logging.INFO)  # in the parent's style, with what it measured and why it chose
    try:
        from .policy import build_policy

        plain = dataclasses.replace(  # random weights: the timings do not depend on their values
            job.settings, fp8="off", compile=False, cuda_graphs=False, autotune=False, backbone_weights=None
        )
        tp = build_policy(job.features, job.stats, plain, job.device, accelerator=job.accelerator)
        auto = AutoFp8(
            job.accelerator,
            job.measure or gpu_measure(job.device, job.settings.compile_mode),  # compiled as training will run
            cache_path=job.cache_path,
            time_step=job.time_step,
        )
        chosen = tp.decide_fp8_auto(auto, {k: v.to(tp.device) for k, v in batch.items()})
        timing = dataclasses.astuple(auto.step_timing) if auto.step_timing else None
        answers.send(("ok", chosen, timing))
    except BaseException as error:  # the parent trains in bf16 and logs why
        answers.send(("error", f"{type(error).__name__}: {error}"))
        raise
    finally:
        answers.close()


__all__ = ["Fp8AutoJob", "decide_fp8_auto_in_child"]
