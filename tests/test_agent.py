"""The agent's tools, driven by a real `strands.Agent` against real services on 127.0.0.1: the bucket server
(conftest), the training service (started as its own tests start it) and the deploy service (likewise).

The one stand-in is the LLM: `ScriptedModel` replays a fixed list of tool calls, then a final answer, with no
network. Everything the tools do is checked on the services themselves: the dataset in the bucket, the job
and its checkpoints, the releases, channels and history of the deploy service, the evaluation report.
Sizes are tiny (48x64 images, episodes of 30 steps, 4 training steps of a tiny ACT).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncGenerator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from strands.models import Model
from typer.testing import CliRunner

from robotloop.agent import AgentContext, ModelUnavailable, build_model, make_agent
from robotloop.capture.info import dataset_info
from robotloop.cli import app
from robotloop.config import AgentSettings, Settings
from robotloop.deploy.client import DeployClient
from robotloop.deploy.keys import generate_keypair
from robotloop.storage import BucketUrl, connect

from .conftest import WRITE_TOKEN
from .test_deploy import OPS, start_deploy_service
from .test_train_service import WRITER, trainer  # noqa: F401 (the training service fixture, as its tests start it)

DATASET = "hf://buckets/lab/agent/datasets/cube"
RUN = "hf://buckets/lab/agent/models/run1"

Call = tuple[str, dict]
Step = Call | list[Call] | str | Callable[[dict | None], "Call | str"]


class ScriptedModel(Model):
    """A stand-in for an LLM (the only mock in this suite): it answers each turn with the next step of its
    script, with no network. A step is a tool call `(name, input)`, several calls in one turn (a list), or the
    final text; or a function of the previous tool result (parsed JSON, or {"error": text}), as a model reads a
    job id before watching the job. Every tool result the agent fed back is kept in `results`, in order."""

    def __init__(self, script: list[Step]) -> None:
        self.script, self.results, self.tool_names = list(script), [], []

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> dict:
        return {}

    async def structured_output(self, output_model, prompt, system_prompt=None, **kwargs) -> AsyncGenerator:
        raise NotImplementedError("the scripted model has no structured output")
        yield

    async def stream(self, messages, tool_specs=None, system_prompt=None, **kwargs) -> AsyncGenerator[dict, None]:
        self.tool_names = [spec["name"] for spec in tool_specs or []]
        fed_back = _tool_results(messages[-1]) if messages else []
        self.results += fed_back
        step = self.script.pop(0)
        step = step(fed_back[-1] if fed_back else None) if callable(step) else step
        yield {"messageStart": {"role": "assistant"}}
        if isinstance(step, str):
            yield {"contentBlockStart": {"start": {}}}
            yield {"contentBlockDelta": {"delta": {"text": step}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}
            return
        for name, args in step if isinstance(step, list) else [step]:
            call_id = f"call_{len(self.results)}_{name}"
            yield {"contentBlockStart": {"start": {"toolUse": {"name": name, "toolUseId": call_id}}}}
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(args)}}}}
            yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "tool_use"}}


def _tool_results(message: dict) -> list[dict]:
    """The tool results in a message, as the model reads them: parsed JSON, or {"error": text}."""
    results = []
    for block in message["content"]:
        if "toolResult" in block:
            result = block["toolResult"]
            text = " ".join(c.get("text", "") for c in result["content"])
            results.append({"error": text} if result["status"] == "error" else json.loads(text))
    return results


@pytest.fixture(scope="module")
def services(bucket_server, trainer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:  # noqa: F811
    """Settings naming the real bucket server, training service and deploy service, and a fresh deploy key."""
    base = tmp_path_factory.mktemp("agent")
    proc, deploy_url = start_deploy_service(base)
    generate_keypair(base / "deploy.key")
    settings = Settings(
        storage={"endpoint": bucket_server.endpoint, "token": WRITE_TOKEN, "cache_dir": base / "cache" / "read"},
        trainer={"url": trainer.endpoint, "token": WRITER},
        # publish_release without the ONNX export (~8 s a release on 2 cores): the agent's tools are the subject here
        deploy={"url": deploy_url, "token": OPS, "key_file": base / "deploy.key", "onnx": "off"},
    )
    with pytest.MonkeyPatch.context() as patch:  # recordings stage under this test's cache, not the user's
        patch.setenv("XDG_CACHE_HOME", str(base / "xdg"))
        yield settings
    proc.terminate()
    proc.wait(10)


def run_agent(settings: Settings, script: list[Step], tmp_path: Path) -> tuple[ScriptedModel, str]:
    model = ScriptedModel(script)
    agent = make_agent(settings, model, AgentContext(settings, eval_dir=tmp_path / "eval"), callback_handler=None)
    answer = str(agent("go"))
    assert not model.script, "the agent stopped before the script ended"
    return model, answer


def test_agent_records_trains_publishes_rolls_back_and_evaluates(services: Settings, tmp_path: Path):
    ops = DeployClient(services.deploy.url, OPS)
    robot_token = ops.register_robot("arm1", channel="stable")
    script: list[Step] = [
        (
            "record_episodes",
            {
                "dataset": DATASET,
                "episodes": 2,
                "image_size": "48x64",
                "max_steps": 30,
                "codec": "h264",
                "keep_failed": True,
                "shadow_map": 512,  # cheaper than 48x64's default 1024 on a CPU; the policy keeps it
            },
        ),
        ("dataset_info", {"dataset": DATASET}),
        (
            "start_training",
            {
                "datasets": [DATASET],
                "output": RUN,
                "steps": 4,
                "batch_size": 2,
                "tiny": True,
                "checkpoint_every": 2,
                "log_every": 1,
                "onnx": "off",  # its releases are published without the export (`services`): none to make
            },
        ),
        lambda job: ("watch_training", {"job_id": job["id"], "wait_s": 120}),
        ("publish_release", {"checkpoint": f"{RUN}/checkpoints/000002", "name": "v1", "channel": "stable"}),
        [
            ("publish_release", {"checkpoint": RUN, "name": "v2"}),  # one turn: run in order, not raced
            ("promote_release", {"release": "v2", "channel": "stable", "reason": "4 steps beat 2"}),
        ],
        ("rollback", {"channel": "stable", "reason": "arm1 dropped the cube"}),
        "Recorded 2 episodes, trained 4 steps, released v1 and v2, rolled stable back to v1.",
    ]
    model, answer = run_agent(services, script, tmp_path)
    assert answer.startswith("Recorded 2 episodes")
    assert set(model.tool_names) == {
        "record_episodes",
        "dataset_info",
        "start_training",
        "watch_training",
        "publish_release",
        "promote_release",
        "rollback",
        "robot_status",
        "evaluate_policy",
    }
    # the robot follows stable: it reports running v1; a second question about it
    DeployClient(services.deploy.url, robot_token).heartbeat(
        "arm1", "v1", {"control_hz": 49.5, "health": {"score": 4.0}}
    )
    later, _ = run_agent(
        services,
        [
            ("robot_status", {"robot": "arm1"}),
            ("evaluate_policy", {"policy": RUN, "episodes": 1, "max_steps": 5, "action_steps": 2}),
            "ok",
        ],
        tmp_path,
    )
    recorded, info, job, watched, v1, v2, promoted, rolled, status, evaluated = model.results + later.results
    assert not [r for r in model.results + later.results if "error" in r], model.results + later.results

    # recorded: the dataset in the bucket has the two episodes the tool reported, 30 frames each
    assert recorded["committed"] == 2 and recorded["episodes_before"] == 0
    stored = dataset_info(connect(services), BucketUrl.parse(DATASET))
    assert (stored.episodes, stored.frames, stored.fps) == (2, 60, 50)
    assert info["episodes"] == 2 and info["frames"] == 60 and info["bytes"] == stored.bytes > 0
    assert info["features"]["observation.images.top"]["shape"] == [48, 64, 3]

    # trained: the job ran to its last step on the service, checkpoints in the bucket
    assert job["status"] in ("queued", "running") and job["steps"] == 4
    assert watched["status"] == "succeeded" and watched["step"] == 4, watched
    assert watched["last_checkpoint"].endswith("checkpoints/000004") and watched["loss"] is not None

    # released, promoted, rolled back: as the deploy service records it
    assert v1["release"] == "v1" and v1["checkpoint"].endswith("checkpoints/000002") and v1["files"] > 0
    assert v2["checkpoint"].endswith("checkpoints/000004")
    assert promoted == {"channel": "stable", "release": "v2", "previous": "v1"}
    assert rolled == {"channel": "stable", "release": "v1", "previous": "v2"}
    state = ops.status()
    assert state["channels"]["stable"] == "v1" and {r["name"] for r in state["releases"]} == {"v1", "v2"}
    kinds = [(e["kind"], e["release"], e["detail"]) for e in ops.history(channel="stable")]
    assert kinds[0][:2] == ("rollback", "v1") and "arm1 dropped the cube" in kinds[0][2]
    assert ("promote", "v2") in [k[:2] for k in kinds]

    # robot status: the heartbeat the robot sent, the assignment after the rollback
    (arm1,) = status["robots"]
    assert arm1 | {"last_seen_s_ago": None} == {
        "id": "arm1",
        "channel": "stable",
        "pinned": None,
        "assigned": "v1",
        "running": "v1",
        "control_hz": 49.5,
        "health": {"score": 4.0},
        "last_seen_s_ago": None,
    }
    assert status["channels"]["stable"] == "v1"

    # evaluated: one episode of the trained policy, its report on disk
    assert evaluated["n_episodes"] == 1 and evaluated["successes"] == 0
    assert evaluated["acting"]["n_action_steps"] == 2 and evaluated["acting"]["temporal_ensemble_coeff"] is None
    report = json.loads(Path(evaluated["report"]).read_text())
    assert report["source"] == RUN and report["image_size"] == [48, 64] and len(report["episodes"]) == 1
    assert report["shadow_map"] == 512  # filmed as its data was: the side went dataset -> training -> evaluation


def test_bad_arguments_are_error_results_the_agent_reads(services: Settings, tmp_path: Path):
    script: list[Step] = [
        ("rollback", {"channel": "stable", "robot": "arm1"}),
        ("promote_release", {"release": "v404", "channel": "stable"}),
        ("dataset_info", {"dataset": "hf://buckets/lab/agent/datasets/nothing-here"}),
        ("dataset_info", {"dataset": "s3://lab/cube"}),
        ("record_episodes", {"dataset": DATASET, "episodes": 0}),
        ("record_episodes", {"dataset": DATASET, "task": "juggling", "image_size": "48x64"}),
        ("start_training", {"datasets": [DATASET], "output": "hf://buckets/elsewhere/x/models/a", "steps": 1}),
        ("start_training", {"datasets": [DATASET], "output": RUN, "fp8": "fp4"}),  # refused before it is sent
        ("start_training", {"datasets": [DATASET], "output": RUN, "gpus": 2}),
        ("watch_training", {"job_id": "no-such-job"}),
        ("evaluate_policy", {"policy": "hf://buckets/lab/agent/models/never-trained"}),
        lambda last: f"I could not do that: {last['error']}",
    ]
    model, answer = run_agent(services, script, tmp_path)
    errors = [r.get("error", "") for r in model.results]
    assert all(errors), model.results  # every call was refused, none crashed the agent
    expected = [
        "exactly one of channel or robot",
        "v404",
        "nothing-here/meta/info.json",
        "hf://buckets/",
        "episodes",
        "unknown sim task 'juggling'",
        "403",
        "fp8",
        "needs device 'cuda'",
        "no job 'no-such-job'",
        "no checkpoints/last.json",
    ]
    for text, want in zip(errors, expected, strict=True):
        assert want in text, (want, text)
        assert "Traceback" not in text
    assert answer.startswith("I could not do that") and "never-trained" in answer
    assert DeployClient(services.deploy.url, OPS).status()["channels"].get("stable") != "v404"


def test_cli_prints_tool_calls_and_the_answer(services: Settings, monkeypatch: pytest.MonkeyPatch):
    # The CLI builds its model from settings; here the settings' model is the scripted stand-in.
    model = ScriptedModel([("robot_status", {"history": 0}), ("rollback", {}), "The fleet looks fine."])
    monkeypatch.setattr("robotloop.agent.agent.build_model", lambda cfg: model)
    env = {"ROBOTLOOP_DEPLOY__URL": services.deploy.url, "ROBOTLOOP_DEPLOY__TOKEN": OPS}
    result = CliRunner().invoke(app, ["agent", "how is the fleet?"], env=env)
    assert result.exit_code == 0, result.output
    assert "→ robot_status(history=0)" in result.output and "channels" in result.output
    assert "→ rollback()" in result.output and "exactly one of channel or robot" in result.output
    assert "The fleet looks fine." in result.output


def test_models_from_settings_and_missing_packages():
    bedrock = build_model(AgentSettings(model_id="us.anthropic.claude-sonnet-4-5", region="eu-west-1"))
    assert (
        type(bedrock).__name__ == "BedrockModel"
        and bedrock.get_config()["model_id"] == "us.anthropic.claude-sonnet-4-5"
    )
    with pytest.raises(ModelUnavailable, match="needs a model id"):
        build_model(AgentSettings(provider="ollama"))
    for provider, package in (("openai", "openai"), ("ollama", "ollama")):
        try:
            __import__(package)
        except ImportError:
            with pytest.raises(ModelUnavailable, match=rf"pip install 'strands-agents\[{provider}\]'"):
                build_model(AgentSettings(provider=provider, model_id="m", base_url="http://127.0.0.1:1/v1"))
        else:  # installed: the model is built without contacting the endpoint
            assert build_model(AgentSettings(provider=provider, model_id="m", base_url="http://127.0.0.1:1/v1"))


def test_the_agent_and_publishing_start_without_torch():
    # torch takes seconds to import: the agent's tools and `robotloop deploy publish` find checkpoints and catch
    # policy errors without it (evaluation imports it when it runs).
    code = (
        "import sys, robotloop.agent.tools, robotloop.deploy.publish; "
        "print(sorted(m for m in sys.modules if m == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_an_unknown_provider_is_a_usage_error_listing_the_choices():
    from typer.testing import CliRunner

    from robotloop.cli import app

    result = CliRunner().invoke(app, ["agent", "--provider", "nope", "hello"], terminal_width=200)
    assert result.exit_code == 2, result.output  # a usage error, not a pydantic dump with exit 1
    assert "choose one of bedrock, openai, ollama" in result.output and "ValidationError" not in result.output
