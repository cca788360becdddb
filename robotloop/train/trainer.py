"""The training loop: stream batches from buckets, step ACT, log, checkpoint to the bucket. One sitting.

Example:
    ```python
    >>> report = train(client, [BucketUrl.parse("hf://buckets/lab/demos/datasets/cube")],
    ...                BucketUrl.parse("hf://buckets/lab/demos/models/run1"), TrainSettings(steps=500))
    >>> report.samples_per_s, report.data_wait_share
    ```
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist

from ..errors import BadValue
from ..storage import BucketClient, BucketUrl
from .checkpoint import (
    code_version,
    export_onnx_beside,
    init_weights,
    load_checkpoint,
    onnx_exporter_installed,
    read_lineage,
    save_checkpoint,
    trained_stats,
)
from .data import DataSettings, StreamingSampler
from .device import release_cuda_memory
from .layout import checkpoint_url, latest_step, resolve_checkpoint
from .policy import ACTSettings, build_policy
from .progress import Progress  # the wire type of on_progress (re-exported: callers import it from here)
from .train_config import lerobot_train_config

log = logging.getLogger(__name__)


@dataclass
class TrainSettings:
    """The run: how long, how big, where to, how often to log and checkpoint."""

    steps: int = 1000
    batch_size: int = 8
    log_every: int = 50
    checkpoint_every: int = 1000
    seed: int = 0
    device: str = "cpu"
    resume: bool = False
    # A new run starting from another's weights (not its optimizer or step count): a run URL (its last complete
    # checkpoint) or a step folder. A resumed run has its own weights: there it is only the lineage's.
    init_from: str | None = None
    # The normalization of a run started `init_from` a checkpoint: "checkpoint" keeps the stats its weights were
    # trained with (features it lacks take the data's), "data" takes the new data's, as lerobot-train does for a
    # pretrained policy on another dataset. A round goes on with the same task: new stats would move every input
    # and output the weights map, so the fine-tune would start from another policy than the one it improves on.
    init_stats: Literal["checkpoint", "data"] = "checkpoint"
    # Wait until every episode is buffered before step 1 (when the data fits the buffer): the run is then
    # bit-for-bit reproducible and resumable. Off: training starts with the first decoded episodes.
    deterministic: bool = False
    # Python's garbage collector. None: automatic. N: automatic collection off for the run and the young
    # generations collected every N steps, as torchtitan does: a full collection in a big process (the loop's)
    # stalls a launch-bound eager step. Not yet measured to help: benchmarks/loop_train.py --gc-every compares.
    gc_every: int | None = None
    # The run's last checkpoint carries its policy's ONNX export (`checkpoint.export_onnx_beside`), which publish
    # then checks and reuses instead of exporting (~10 s of a 2-core machine for the default ACT). "auto": when
    # this machine has the exporter (`checkpoint.onnx_exporter_installed`); "off": never. Only the last: an export
    # runs on the CPU, so one per checkpoint would stall the training step that long each time (in the background
    # it would take the CPU the data decoding needs), and the last is the one a run URL publishes. A run stopped
    # early (the training service's cancel: SIGTERM) skips it: its checkpoint must land within the cancel's grace
    # before SIGKILL, and publishing it exports then.
    onnx: Literal["auto", "off"] = "auto"


@dataclass
class TrainReport:
    """A run's figures. `wall_s` (and the rates from it) is the steps' time, checkpoints included, and leaves out the
    ONNX export of the last checkpoint: `onnx` is what its lineage.json records of it (its `seconds`; `error` for a
    policy that cannot be exported), None when none ran. `setup_s`: the time before the first step (the data's
    sources opened, the policy built, the weights it starts from downloaded)."""

    steps: int
    wall_s: float
    samples_per_s: float
    data_wait_share: float
    final_loss: float
    checkpoints: list[str] = field(default_factory=list)
    losses: list[tuple[int, float]] = field(default_factory=list)
    onnx: dict | None = None
    setup_s: float = 0.0

    @property
    def export_s(self) -> float:
        """The last checkpoint's ONNX export, in seconds (0: none ran)."""
        return float((self.onnx or {}).get("seconds") or 0.0)

    def split(self) -> dict[str, float]:
        """Where the run's time went: {"setup", "steps", "export"} in seconds."""
        return {"setup": round(self.setup_s, 1), "steps": round(self.wall_s, 1), "export": round(self.export_s, 1)}


def train(
    client: BucketClient,
    datasets: list[BucketUrl],
    output: BucketUrl,
    settings: TrainSettings,
    act: ACTSettings | None = None,
    data: DataSettings | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> TrainReport:
    """Train ACT on `datasets`, streaming from the bucket; checkpoints go to `output`.

    `should_stop()` is polled every step: when it turns true, a checkpoint is written and training ends
    (how the training service cancels a job without losing work). `settings.init_from` starts the run from that
    checkpoint's weights (a round fine-tuning the last); each checkpoint's lineage.json names it (`init_from`),
    and what each dataset held of each kind of frame and how many weighed 0 (`sources`).

    Example:
        ```python
        >>> report = train(connect(), [BucketUrl.parse("hf://buckets/lab/demos/datasets/cube")],
        ...                BucketUrl.parse("hf://buckets/lab/demos/models/run1"),
        ...                TrainSettings(steps=500, device="cuda"),
        ...                ACTSettings.fast())
        >>> report.samples_per_s, report.checkpoints[-1]
        ```

    Raises:
        robotloop.storage.NotFound: a dataset does not exist. robotloop.storage.StorageError: the bucket cannot be
        reached, read or written. ValueError: bad settings or mismatched datasets, `output` holds a run and
        `resume` is off, or the run is already at `steps`; `Fp8Error` (a ValueError) when
        an FP8 recipe does not fit the device. robotloop.train.data.DataError: an episode could not be decoded.
        robotloop.train.data.NothingToTrain (a BadInput): every frame weighs 0 (fleet data with no success and
        no expert frame, and no demos). robotloop.storage.NotFound: `init_from` holds no checkpoint.
        ModelMismatch (a ValueError): the checkpoint resumed or started from is of another model.
    """
    try:
        return _train(client, datasets, output, settings, act, data, on_progress, should_stop)
    finally:  # the policy, optimizer and sampler are gone with _train's frame: their GPU memory can go back
        release_cuda_memory()


def _train(
    client: BucketClient,
    datasets: list[BucketUrl],
    output: BucketUrl,
    settings: TrainSettings,
    act: ACTSettings | None,
    data: DataSettings | None,
    on_progress: Callable[[Progress], None] | None,
    should_stop: Callable[[], bool],
) -> TrainReport:
    started = time.perf_counter()
    last = latest_step(client, output)
    if last is not None and not settings.resume:  # two runs' checkpoints in one folder: last.json would mix them
        raise BadValue(
            f"{output} already holds a run (last checkpoint at step {last}): resume it (--resume) or "
            "train into another output"
        )
    if last is not None and last >= settings.steps:
        raise BadValue(f"{output} is already at step {last}: ask for more steps than that to train on")
    if settings.onnx not in ("auto", "off"):
        raise BadValue(f"onnx={settings.onnx!r}: use auto or off")
    if settings.init_stats not in ("checkpoint", "data"):
        raise BadValue(f"init_stats={settings.init_stats!r}: use checkpoint or data")
    init = None  # resolved now: a wrong URL fails before the data streams in
    if settings.init_from and last is None:
        init = resolve_checkpoint(client, BucketUrl.parse(settings.init_from))
    rank, world, device = _distributed(settings.device)
    torch.manual_seed(settings.seed)  # the same initial weights on every rank
    act = act or ACTSettings()
    # A copy: the caller's settings stay as given (a notebook reuses them across runs and ranks).
    data = dataclasses.replace(data or DataSettings(), device=device, seed=settings.seed, chunk_size=act.chunk_size)
    with StreamingSampler(client, datasets, data, rank, world) as sampler:  # a missing dataset fails here, first
        client.create_bucket(output)
        stats = sampler.stats
        if last is not None:  # a resumed run normalizes as it did: with the stats its first session saved
            stats = {**stats, **trained_stats(client, checkpoint_url(output, last))}
        elif init is not None and settings.init_stats == "checkpoint":
            stats = {**stats, **trained_stats(client, init)}
        policy = build_policy(sampler.features, stats, act, device)
        optimizer = policy.optimizer()
        if world > 1:
            policy.grad_sync = _average_gradients
        start, losses = 0, []
        origin = str(init) if init else None
        if last is not None:
            sampler_state, losses = load_checkpoint(client, output, last, policy, optimizer, rank)
            sampler.load_state_dict(sampler_state)
            start = last
            origin = read_lineage(client, checkpoint_url(output, last)).get("init_from")
            log.info("resumed from step %d", last)
        elif init is not None:
            init_weights(client, init, policy)
            log.info("starting from the weights of %s", init)
        if world > 1:  # dropout and VAE noise differ across ranks (one RNG state is saved: resume is not bitwise)
            torch.manual_seed(settings.seed + start + 1000 * rank)
        if settings.deterministic:
            sampler.wait_ready()
        setup_s = time.perf_counter() - started
        with _automatic_gc(settings.gc_every is None):
            report = _loop(
                client,
                sampler,
                policy,
                optimizer,
                output,
                settings,
                act,
                data,
                start,
                losses,
                on_progress,
                should_stop,
                origin,
            )
    return dataclasses.replace(report, setup_s=setup_s)


@contextmanager
def _automatic_gc(on: bool) -> Iterator[None]:
    """Python's automatic garbage collection on (as it is) or off for the block, then as it was."""
    was = gc.isenabled()
    if not on:
        gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _loop(
    client, sampler, policy, optimizer, output, settings, act, data, start, losses, on_progress, should_stop, origin
) -> TrainReport:
    losses = list(losses)  # the run's history before `start` (a resume), then this session's
    checkpoints: list[str] = []
    pending: list[tuple[int, torch.Tensor]] = []  # device losses: read back only at log points (no per-step sync)
    t0, wait0, step = time.perf_counter(), sampler.wait_s, start
    gpu0 = sampler.blocked_s + sampler.gpu_s
    scheduled = act.lr_schedule != "constant" or act.warmup_steps > 0
    # The run in lerobot's terms, saved in every checkpoint (train_config.json) for lerobot's own tools; none where
    # lerobot would train on other frames (it draws every frame alike: it would learn the failures dropped here).
    uniform = all(data.weights.uniform(source.role) for source in sampler.sources)
    lerobot_config = lerobot_train_config(
        policy.policy.config, sampler_urls(sampler), output, settings, act, data, uniform=uniform
    )

    exported: list[dict] = []  # the last checkpoint's ONNX export, when it ran
    export = settings.onnx == "auto" and onnx_exporter_installed()

    def export_last(model: Path) -> dict:
        exported.append(export_onnx_beside(model))
        return exported[-1]

    def checkpoint(at: int, last: bool) -> None:
        world = sampler.world_size
        lineage = {
            "step": at,
            "datasets": [str(u) for u in sampler_urls(sampler)],
            "init_from": origin,  # the checkpoint whose weights the run started from (None: from scratch)
            "world_size": world,
            "sources": sampler.frame_kinds(all_ranks=world > 1),
            "episodes": sampler.episodes(all_ranks=world > 1),
            "train": asdict(settings),
            "act": asdict(act),
            "data": asdict(data),
            "code": code_version(),
        }
        url = save_checkpoint(
            client,
            output,
            at,
            policy,
            optimizer,
            sampler.state_dict(),
            lineage,
            losses,
            sampler.rank,
            world,
            train_config=lerobot_config,
            export=export_last if last and export else None,
        )
        checkpoints.append(str(url))

    while step < settings.steps:
        batch = sampler.next_batch(settings.batch_size)
        if scheduled:
            policy.set_lr_factor(act.lr_factor(step, settings.steps))
        pending.append((step, policy.train_step(batch)))
        step += 1
        if settings.gc_every and step % settings.gc_every == 0:
            gc.collect(1)
        if step % settings.log_every == 0 or step == settings.steps:
            losses += _read_losses(pending)  # the one host sync per log interval
            pending.clear()
            elapsed = time.perf_counter() - t0
            waited = sampler.wait_s - wait0
            progress = Progress(
                step,
                losses[-1][1],
                (step - start) * settings.batch_size / elapsed,
                waited / elapsed,
                len(sampler.buffered_episodes),
                elapsed,
                waited,
                sampler.blocked_s + sampler.gpu_s - gpu0,
                checkpoints[-1] if checkpoints else None,
            )
            log.info(
                "step %d loss %.4f %.1f samples/s data wait %.1f%%",
                step,
                progress.loss,
                progress.samples_per_s,
                100 * progress.data_wait_share,
            )
            if on_progress:
                on_progress(progress)
        stop = _agreed_stop(should_stop(), step % settings.log_every == 0 or step == settings.steps, sampler.device)
        if step % settings.checkpoint_every == 0 or step == settings.steps or stop:
            losses += _read_losses(pending)
            pending.clear()
            checkpoint(step, last=step == settings.steps and not stop)
        if stop:
            break
    # Training's own time: the export is deployment's work done here, and would read as a slower run.
    wall = time.perf_counter() - t0 - sum(e["seconds"] for e in exported)
    return TrainReport(
        step,
        wall,
        (step - start) * settings.batch_size / wall,
        (sampler.wait_s - wait0) / wall,
        losses[-1][1] if losses else float("nan"),
        checkpoints,
        losses,
        exported[-1] if exported else None,
    )


def _world_size() -> int:
    """The ranks training together: 1 outside a process group."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _read_losses(pending: list[tuple[int, torch.Tensor]]) -> list[tuple[int, float]]:
    """The pending steps' losses on the host, in one sync. Under DDP each is the mean over the ranks, in one
    all-reduce: the global batch's loss, what one process at the same global batch logs (rank 0's own half would
    read as a noisier curve, and the checkpoint keeps these)."""
    if not pending:
        return []
    values = torch.stack([v.detach().float().reshape(()) for _, v in pending])
    if (world := _world_size()) > 1:
        dist.all_reduce(values)  # a sum: gloo has no average
        values /= world
    return [(s, v) for (s, _), v in zip(pending, values.tolist(), strict=True)]


def _agreed_stop(stop: bool, log_step: bool, device: torch.device) -> bool:
    """Under DDP, ranks see a stop request (torchrun's SIGTERM) at different steps; one that checkpoints while the
    others wait in the next gradient all-reduce hangs them all. So the ranks decide together, at log steps (which
    sync with the host anyway): stop if any rank was asked to."""
    if _world_size() == 1:
        return stop
    if not log_step:
        return False
    flag = torch.tensor([int(stop)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def sampler_urls(sampler: StreamingSampler) -> list[BucketUrl]:
    return [source.url for source in sampler.sources]


def _distributed(device: str) -> tuple[int, int, str]:
    """(rank, world size, this rank's device). Under torchrun (WORLD_SIZE > 1) this joins the process group:
    NCCL between GPUs, gloo on CPU; each rank takes the GPU of its LOCAL_RANK."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, device
    cuda = device.startswith("cuda")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    return dist.get_rank(), world, device


def _average_gradients(params: list[torch.Tensor]) -> None:
    """Average gradients over ranks in one flat all-reduce. Done by hand rather than with DDP's wrapper so
    that it composes with the compiled, CUDA-graphed step: the collective runs between backward and the
    optimizer, outside the graph."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for p, synced in zip(params, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
        if p.grad is None:
            p.grad = synced
        else:
            p.grad.copy_(synced)
