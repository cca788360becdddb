"""LeRobot's `train_config.json` for a robotloop run: lerobot's `TrainPipelineConfig`, filled from our settings.

lerobot-train writes it beside `pretrained_model/config.json` in every checkpoint, and lerobot's tools read it
from there: `lerobot-train --resume=true --config_path=<checkpoint>/pretrained_model/train_config.json` resumes
the run it describes, `TrainPipelineConfig.from_pretrained(<checkpoint>/pretrained_model)` loads it. Ours says
what our run was in lerobot's terms, so the same commands work on our checkpoints:

* the dataset: a dataset at a bucket's root, `hf://buckets/<ns>/<bucket>`, is lerobot's
  `repo_id=<ns>/<bucket> repo_type=bucket streaming=true` (streamed from `HF_ENDPOINT`); one below a bucket's root
  names its path after the bucket (`<ns>/<bucket>/<path>`, lerobot streams `hf://buckets/<repo_id>`). A run on
  several datasets has no lerobot config: lerobot trains on one (its `DatasetConfig.repo_id` is one string, and
  a list is read back as the list's text), so there is none rather than one naming a single dataset. Nor is
  there one for a dataset whose frames weigh differently (a fleet dataset's failures dropped, its expert frames
  drawn more often: `robotloop.train.weights`): lerobot draws every frame alike, and would train on the failures;
* the policy: the checkpoint's own ACTConfig (config.json's content);
* the run: steps, batch size, seed, log and checkpoint intervals, decode workers as DataLoader workers;
* the optimizer: ACT's preset (AdamW at lr, weight decay, gradient clip) when the schedule is constant, else the
  same AdamW with lerobot's nearest scheduler (`constant_with_warmup`, `cosine_annealing_with_warmup`, or
  `cosine_decay_with_warmup` when the cosine ends above zero).

Example:
    ```python
    >>> cfg = lerobot_train_config(policy.policy.config, [BucketUrl.parse("hf://buckets/lab/cube")],
    ...                            BucketUrl.parse("hf://buckets/lab/models/run1"), TrainSettings(), ACTSettings())
    >>> cfg.dataset.repo_id, cfg.dataset.repo_type
    ('lab/cube', 'bucket')
    >>> cfg.save_pretrained(checkpoint / "pretrained_model")     # writes train_config.json
    ```
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..storage import BucketUrl

if TYPE_CHECKING:
    from lerobot.configs.train import TrainPipelineConfig

    from .data import DataSettings
    from .policy import ACTSettings
    from .trainer import TrainSettings


def lerobot_repo_id(url: BucketUrl) -> str:
    """The `repo_id` lerobot's bucket datasets (`repo_type="bucket"`) give a dataset at `url`.

    Example:
        ```python
        >>> lerobot_repo_id(BucketUrl.parse("hf://buckets/lab/cube"))
        'lab/cube'
        ```
    """
    return f"{url.bucket_id}/{url.path}".rstrip("/")


def lerobot_train_config(
    policy_config: Any,
    datasets: list[BucketUrl],
    output: BucketUrl,
    settings: TrainSettings,
    act: ACTSettings,
    data: DataSettings | None = None,
    uniform: bool = True,
) -> TrainPipelineConfig | None:
    """lerobot's TrainPipelineConfig for a run (see the module docstring); None for a run on several datasets, or
    one whose frames are not all drawn alike (`uniform` False). `policy_config`: the run's ACTConfig."""
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.optim.optimizers import AdamWConfig

    if len(datasets) != 1 or not uniform:
        return None
    scheduler = _scheduler(act, settings.steps)
    return TrainPipelineConfig(
        dataset=DatasetConfig(
            repo_id=lerobot_repo_id(datasets[0]),
            repo_type="bucket",
            streaming=True,
            use_imagenet_stats=act.use_imagenet_stats,
        ),
        policy=policy_config,
        output_dir=None,  # ours is a bucket URL; lerobot's is a local folder, chosen when it resumes
        job_name=output.name,
        resume=settings.resume,
        seed=settings.seed,
        num_workers=data.decode_workers if data else 4,
        batch_size=settings.batch_size,
        steps=settings.steps,
        log_freq=settings.log_every,
        save_freq=settings.checkpoint_every,
        # With a scheduler lerobot must not put ACT's preset (no scheduler) in place of ours when it starts a run.
        use_policy_training_preset=scheduler is None,
        optimizer=AdamWConfig(lr=act.lr, weight_decay=act.weight_decay, grad_clip_norm=act.grad_clip_norm),
        scheduler=scheduler,
    )


def _scheduler(act: ACTSettings, steps: int):
    from lerobot.optim.schedulers import (
        ConstantWithWarmupSchedulerConfig,
        CosineAnnealingWithWarmupSchedulerConfig,
        CosineDecayWithWarmupSchedulerConfig,
    )

    if act.lr_schedule == "constant":
        return ConstantWithWarmupSchedulerConfig(num_warmup_steps=act.warmup_steps) if act.warmup_steps else None
    if act.lr_min_ratio == 0:
        return CosineAnnealingWithWarmupSchedulerConfig(num_warmup_steps=act.warmup_steps)
    return CosineDecayWithWarmupSchedulerConfig(
        num_warmup_steps=act.warmup_steps, num_decay_steps=steps, peak_lr=act.lr, decay_lr=act.lr * act.lr_min_ratio
    )
