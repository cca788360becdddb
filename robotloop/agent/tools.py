"""The agent's tools: record, inspect, train, publish, promote, roll back, watch robots, evaluate.

Each tool is a strands `@tool` method of `RobotloopTools` calling the same library functions as the matching
`robotloop` command, so the agent can do nothing the CLI cannot. Tools answer compact JSON (the model reads it);
a bad argument or a refusal from a service is an error result with the reason, which the model sees and can act
on, never a traceback. Services and keys come from an `AgentContext` (robotloop's settings).

Example:
    ```python
    >>> from strands import Agent
    >>> ctx = AgentContext(load_settings())
    >>> agent = Agent(model=build_model(ctx.settings.agent), tools=make_tools(ctx))
    >>> agent("how many episodes are in hf://buckets/lab/demos/datasets/cube?")
    ```
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError
from strands import tool

from ..clients import ServiceClients
from ..config import Settings, acting_overrides
from ..deploy.client import robot_row
from ..errors import RobotloopError
from ..options import tool_parameters
from ..storage import BucketUrl
from ..train.jobs import JobSpec
from ..train.progress import JOB_FIELDS

# The service's storage, never the model's to choose: the tool's jobs read and write where the service does.
STORAGE_FIELDS = ("storage_endpoint", "storage_token")
# What robot_status shows of a robot: fewer figures than the dashboard's fleet page (the model reads every one).
ROBOT_KEYS = ("id", "channel", "pinned", "assigned", "running", "control_hz", "health", "last_seen_s_ago")


@dataclass
class AgentContext(ServiceClients):
    """What the tools need beyond their arguments: robotloop's settings (storage, `trainer.url`/`token`,
    `deploy.url`/`token`/`key_file`), their service clients (`bucket`, `trainer`, `deploy`, made on first use:
    a tool that needs no training service works without its token, the others say which token is missing) and
    where evaluation reports go."""

    settings: Settings
    eval_dir: Path = Path("outputs/eval")


def error(message: str) -> dict[str, Any]:
    """A tool result strands passes to the model as an error."""
    return {"status": "error", "content": [{"text": message}]}


def reported(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the failures robotloop expects (RobotloopError) into error results that say what went wrong."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        # A tool's own pydantic models (JobSpec) name the bad field in a ValidationError. Anything else is a bug:
        # it reaches strands, which reports it with its traceback.
        except (RobotloopError, ValidationError) as e:
            reason = e.args[0] if isinstance(e, KeyError) and e.args else str(e)  # str(KeyError) adds quotes
            return error(f"{fn.__name__} failed: {reason}")

    return run


class RobotloopTools:
    """The tools, bound to one context. `make_tools(ctx)` lists them for `strands.Agent(tools=...)`."""

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx

    @tool
    @reported
    def record_episodes(
        self,
        dataset: str,
        episodes: int = Field(5, ge=1, le=1000),
        task: str = "transfer_cube",
        image_size: str = "480x640",
        max_steps: int | None = Field(None, ge=1),
        workers: int = Field(1, ge=1, le=64),
        codec: str = "libsvtav1",
        keep_failed: bool = False,
        shadow_map: int | None = None,
    ) -> dict[str, Any]:
        """Record scripted demonstrations in the ALOHA simulator into a LeRobot dataset in a bucket (appends to an
        existing dataset; each episode is committed as it finishes). Failed demos are dropped unless keep_failed.

        Args:
            dataset: dataset URL, hf://buckets/<namespace>/<bucket>/datasets/<name>
            episodes: how many episodes to commit
            task: sim task, transfer_cube or insertion
            image_size: camera image size HxW, e.g. 480x640
            max_steps: steps per episode (default: the task's 400; shorter demos usually fail)
            workers: sim worker processes
            codec: video codec, libsvtav1 (lerobot's default) or h264 (faster on CPU)
            keep_failed: also commit failed demos (marked by next.success never being true)
            shadow_map: side of the sim lights' shadow maps, 256-8192, or 0 for no shadows (default gym-aloha's,
                4096 at 480x640); kept with the dataset, so training and evaluation render the same
        """
        from ..capture import DatasetRecorder, DatasetSpec
        from ..capture.sim_record import check_task, record_sim
        from ..sim.env import parse_image_size

        check_task(task)
        url, size = BucketUrl.parse(dataset), parse_image_size(image_size)
        recorder = DatasetRecorder(self.ctx.bucket, url, DatasetSpec.aloha(size, codec, shadow_map))
        before = recorder.committed_episodes()
        report = record_sim(recorder, task, episodes, workers, size, max_steps, before, keep_failed=keep_failed)
        return {
            "dataset": str(url),
            "committed": len(report.committed),
            "episodes_before": before,
            "failed_seeds": report.failed_seeds,
            "scripted_success_rate": round(report.success_rate, 3),
            "episodes_per_minute": round(report.episodes_per_minute, 2),
            "bytes_sent": sum(c.bytes_sent for c in report.committed),
        }

    @tool
    @reported
    def dataset_info(self, dataset: str) -> dict[str, Any]:
        """Describe a LeRobot dataset in a bucket: episodes, frames, fps, tasks, features (dtype and shape) and
        stored bytes.

        Args:
            dataset: dataset URL, hf://buckets/<namespace>/<bucket>/datasets/<name>
        """
        from ..capture.info import dataset_info

        return asdict(dataset_info(self.ctx.bucket, BucketUrl.parse(dataset)))

    @tool
    @reported
    @tool_parameters(JobSpec, exclude=STORAGE_FIELDS, param="spec")
    def start_training(self, spec: JobSpec) -> dict[str, Any]:
        """Submit an ACT training job to the training service; it streams the datasets from the bucket and writes
        checkpoints under output/checkpoints/<step>. Answers the job id: follow it with watch_training.
        """
        # The parameters are JobSpec's fields (robotloop.train.options.TrainOptions plus gpus): a bad option
        # fails here, naming the field, before anything is sent.
        return _job(self.ctx.trainer.submit(spec.model_dump(mode="json", exclude_none=True)))

    @tool
    @reported
    def watch_training(self, job_id: str, wait_s: float = Field(0.0, ge=0, le=600)) -> dict[str, Any]:
        """State of a training job: status (queued, running, succeeded, failed, cancelled), step, loss, samples/s,
        share of time waiting for data, episodes seen, last checkpoint.

        Args:
            job_id: the id start_training answered
            wait_s: wait up to this many seconds for the job to finish before answering (0: answer now)
        """
        return _job(self.ctx.trainer.wait(job_id, timeout_s=wait_s, every_s=min(1.0, max(wait_s / 10, 0.1))))

    @tool
    @reported
    def publish_release(self, checkpoint: str, name: str, channel: str | None = None) -> dict[str, Any]:
        """Sign a checkpoint as a release with the deploy key, store its manifest in the bucket and register it
        with the deploy service; with a channel, robots on that channel move to it. Release names are immutable.

        Args:
            checkpoint: a run URL (its latest checkpoint) or a step folder, hf://buckets/.../models/<run>[/checkpoints/<step>]
            name: release name, e.g. v7
            channel: channel to point at the release (e.g. canary or stable); none: only register it
        """
        from ..deploy.keys import load_private_key
        from ..deploy.publish import manifest_url, publish

        signer = load_private_key(self.ctx.settings.deploy.key_file)
        signed = publish(
            self.ctx.bucket, checkpoint, name, signer, self.ctx.deploy, channel, onnx=self.ctx.settings.deploy.onnx
        )
        m = signed.manifest
        return {
            "release": m.name,
            "files": len(m.files),
            "bytes": m.total_bytes,
            "key_id": signed.key_id,
            "checkpoint": m.checkpoint,
            "manifest": str(manifest_url(m.bucket, m.name)),
            "channel": channel,
            "onnx_seconds": round(signed.onnx.seconds, 2) if signed.onnx else None,
            "onnx_error": signed.onnx.error if signed.onnx else None,
            "onnx_reused": signed.onnx.reused if signed.onnx else None,  # the trainer's export, checked, taken as is
        }

    @tool
    @reported
    def promote_release(self, release: str, channel: str = "stable", reason: str = "") -> dict[str, Any]:
        """Point a channel at a published release; every robot following the channel moves to it.

        Args:
            release: release name
            channel: channel to point at it
            reason: recorded in the deploy history
        """
        return self.ctx.deploy.promote(channel, release, reason)

    @tool
    @reported
    def rollback(self, channel: str | None = None, robot: str | None = None, reason: str = "") -> dict[str, Any]:
        """Roll a channel back to its previous release, or pin one robot to the release it ran before. Give
        exactly one of channel or robot.

        Args:
            channel: channel to roll back
            robot: robot id to roll back
            reason: recorded in the deploy history
        """
        if (channel is None) == (robot is None):
            return error("rollback needs exactly one of channel or robot")
        deploy = self.ctx.deploy
        return deploy.rollback_channel(channel, reason) if channel else deploy.rollback_robot(robot, reason)

    @tool
    @reported
    def robot_status(self, robot: str | None = None, history: int = Field(5, ge=0, le=100)) -> dict[str, Any]:
        """The fleet as the deploy service sees it: channels and their releases, and per robot its channel, the
        release assigned and the one running, control rate, health and seconds since its last heartbeat; plus the
        latest deploy events (publishes, promotions, swaps, rollbacks with reasons).

        Args:
            robot: only this robot (default: all)
            history: how many recent events to include
        """
        deploy = self.ctx.deploy
        state = deploy.status()
        robots = [_robot(r) for r in state["robots"] if robot is None or r["id"] == robot]
        if robot is not None and not robots:
            return error(f"no robot {robot!r}; known: {[r['id'] for r in state['robots']]}")
        events = deploy.history(robot, None, history) if history else []
        return {
            "channels": state["channels"],
            "releases": [r["name"] for r in state["releases"]],
            "robots": robots,
            "history": [_event(e) for e in events],
        }

    @tool
    @reported
    def evaluate_policy(
        self,
        policy: str,
        task: str = "transfer_cube",
        episodes: int = Field(10, ge=1, le=1000),
        workers: int = Field(1, ge=1, le=64),
        max_steps: int | None = Field(None, ge=1),
        seed: int = 1000,
        videos: int = Field(0, ge=0),
        device: str = "cpu",
        temporal_ensemble: str | None = None,
        action_steps: int | None = Field(None, ge=1),
    ) -> dict[str, Any]:
        """Evaluate a trained policy in the ALOHA simulator: seeded episodes, success rate with a 95% interval,
        mean max reward (furthest stage reached, 0-4), the failed episodes counted by the furthest stage they
        reached (where the policy fails) and mean summed reward.

        Args:
            policy: a run URL (latest checkpoint), hf://buckets/.../models/<run>[/checkpoints/<step>], or a local
                checkpoint directory
            task: sim task, transfer_cube or insertion
            episodes: episodes to run (episode i uses seed seed+i)
            workers: sim worker processes
            max_steps: steps per episode (default: the task's 400)
            seed: first seed
            videos: record the first N episodes as mp4
            device: cpu or cuda
            temporal_ensemble: how the policy acts: ACT's temporal ensembling "off" or its coefficient (default: as
                the checkpoint saved it)
            action_steps: actions executed from each predicted chunk; above 1 turns ensembling off (default: as
                saved)
        """
        from ..deploy.evaluate import REPORT_FILE, default_output_dir, locate_and_evaluate

        out = default_output_dir(task, self.ctx.eval_dir)
        report = locate_and_evaluate(
            self.ctx.settings,
            policy,
            task,
            episodes,
            workers,
            output_dir=out,
            client_factory=lambda: self.ctx.bucket,
            seed=seed,
            max_steps=max_steps,
            videos=videos,
            device=device,
            inference=acting_overrides(temporal_ensemble, action_steps),
        )
        return {
            "policy": policy,
            "task": report.task,
            **_rounded(report.summary),
            "wall_s": round(report.wall_s, 1),
            "acting": report.inference,
            "report": str(out / REPORT_FILE),
            "videos": report.videos,
        }


def make_tools(ctx: AgentContext) -> list:
    """The tools for `strands.Agent(tools=...)`, bound to `ctx`."""
    tools = RobotloopTools(ctx)
    return [
        tools.record_episodes,
        tools.dataset_info,
        tools.start_training,
        tools.watch_training,
        tools.publish_release,
        tools.promote_release,
        tools.rollback,
        tools.robot_status,
        tools.evaluate_policy,
    ]


def _rounded(values: dict[str, Any]) -> dict[str, Any]:
    def r(v: Any) -> Any:
        return round(v, 4) if isinstance(v, float) else [r(x) for x in v] if isinstance(v, list) else v

    return {k: r(v) for k, v in values.items()}


def _job(state: dict[str, Any]) -> dict[str, Any]:
    keep = ("id", "status", *JOB_FIELDS, "exit_code", "message")  # the trainer's Progress, as the service shows it
    return _rounded(
        {**{k: state.get(k) for k in keep}, "steps": state["spec"]["steps"], "output": state["spec"]["output"]}
    )


def _robot(r: dict[str, Any]) -> dict[str, Any]:
    row = robot_row(r, time.time())
    return {k: row[k] for k in ROBOT_KEYS}


def _event(e: dict[str, Any]) -> dict[str, Any]:
    return {k: e.get(k) for k in ("at", "kind", "robot", "channel", "release", "previous", "detail")}
