"""One list of training options (robotloop.train.options.TrainOptions) reaches every front end: `robotloop train`'s
flags, the training service's JobSpec (and the command line it starts) and the agent's start_training tool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from pydantic import BaseModel, Field, SecretStr, ValidationError
from typer.main import get_command
from typer.testing import CliRunner

from robotloop.agent.tools import STORAGE_FIELDS, RobotloopTools
from robotloop.cli import app
from robotloop.options import flag, to_argv, tool_parameters, typer_command, typer_parameters
from robotloop.train.jobs import JobSpec
from robotloop.train.options import TrainOptions

URL = "hf://buckets/lab/demos/datasets/cube"
RUN = "hf://buckets/lab/demos/models/run1"
# Not their defaults, so that a flag the child would not parse back shows.
CHANGED: dict[str, Any] = {
    "datasets": [URL, "hf://buckets/lab/demos/datasets/more"],
    "output": RUN,
    "steps": 7,
    "batch_size": 3,
    "device": "cuda:1",
    "resume": True,
    "init_from": "hf://buckets/lab/demos/models/run0/checkpoints/000500",
    "init_stats": "data",
    "log_every": 2,
    "checkpoint_every": 5,
    "decode_workers": 2,
    "buffer_gib": 1.5,
    "demo_weight": 0.5,
    "expert_weight": 3.0,
    "success_weight": 0.75,
    "failed_weight": 0.125,
    "dataset_weights": [f"{URL}=0.25"],
    "seed": 11,
    "tiny": True,
    "fp8": "rowwise",
    "chunk_size": 20,
    "n_action_steps": 4,
    "dim_model": 64,
    "lr": 3e-4,
    "image_size": "120x160",
    "onnx": "off",
}


def train_command():
    return get_command(app).commands["train"]


def test_every_option_is_a_cli_flag_a_job_spec_field_and_a_tool_parameter():
    assert set(CHANGED) == set(TrainOptions.model_fields), "give a new option a non-default value in CHANGED"
    cli = {opt: param for param in train_command().params for opt in param.opts}
    tool = RobotloopTools.start_training.tool_spec["inputSchema"]["json"]["properties"]
    for name, info in TrainOptions.model_fields.items():
        assert flag(name, info) in cli, name
        assert info.description and info.description in (cli[flag(name, info)].help or ""), name
        assert name in JobSpec.model_fields, name
        assert name in tool and tool[name]["description"] == JobSpec.model_fields[name].description, name
    # What a job adds runs the job (gpus, weights from the service's own folder) or is the service's business
    # (storage: never the model's to choose).
    assert set(JobSpec.model_fields) - set(TrainOptions.model_fields) == {"gpus", "backbone_weights", *STORAGE_FIELDS}
    assert set(tool) == set(JobSpec.model_fields) - set(STORAGE_FIELDS)


def test_a_job_spec_command_line_parses_back_to_the_same_options(tmp_path: Path):
    spec = JobSpec(**CHANGED)
    argv = spec.command(tmp_path / "progress.jsonl")
    args = argv[argv.index("robotloop.train") + 1 :]  # python -m robotloop.train <options>
    parsed = train_command().make_context("train", args).params
    assert {k: parsed[k] for k in CHANGED} == CHANGED
    assert parsed["progress_file"] == tmp_path / "progress.jsonl"
    # Defaults (False flags included) are written out too: the child runs with exactly the spec.
    plain = JobSpec(datasets=[URL], output=RUN).command(tmp_path / "p")
    assert "--no-resume" in plain and "--no-tiny" in plain and plain[plain.index("--device") + 1] == "cpu"


def test_the_options_become_the_runs_data_settings():
    data = TrainOptions(**CHANGED).data_settings()
    assert (data.decode_workers, data.buffer_bytes) == (2, 3 * 2**29)  # 1.5 GiB
    assert (data.weights.demo, data.weights.expert, data.weights.datasets) == (0.5, 3.0, {URL: 0.25})
    assert TrainOptions(datasets=[URL], output=RUN).data_settings().buffer_bytes is None  # the GPU's share


def test_bounds_and_checks_are_the_same_on_every_front_end():
    runner = CliRunner()
    result = runner.invoke(app, ["train", "--dataset", URL, "--output", RUN, "--steps", "0"])
    assert result.exit_code == 2 and "--steps" in result.output
    result = runner.invoke(app, ["train", "--dataset", "s3://lab/cube", "--output", RUN])
    assert result.exit_code == 2 and "hf://buckets/" in " ".join(result.output.split())
    other = "hf://buckets/lab/demos/datasets/other"
    result = runner.invoke(app, ["train", "--dataset", URL, "--output", RUN, "--dataset-weight", f"{other}=2"])
    assert result.exit_code == 2 and "--dataset-weight" in result.output and "not a --dataset" in result.output
    result = runner.invoke(app, ["train", "--dataset", URL, "--output", RUN, "--failed-weight", "-1"])
    assert result.exit_code == 2 and "--failed-weight" in result.output
    weights = ({"dataset_weights": [f"{other}=2"]}, {"dataset_weights": [URL]}, {"expert_weight": -1})
    for bad in ({"steps": 0}, {"datasets": ["s3://lab/cube"]}, {"fp8": "fp4"}, *weights, {"init_from": "s3://x"}):
        with pytest.raises(ValidationError):
            JobSpec(**{**CHANGED, **bad})
    tool = RobotloopTools.start_training.tool_spec["inputSchema"]["json"]["properties"]
    assert tool["steps"]["minimum"] == 1 and tool["fp8"]["enum"][0] == "off"


def test_an_option_added_to_the_model_reaches_every_front_end():
    """What adding a field to TrainOptions does, on a model of its own: no front end lists options by hand."""

    class Options(TrainOptions):
        warmup_steps: int = Field(default=0, ge=0, description="Steps of linear learning-rate warm-up.")

    seen: list[BaseModel] = []

    @typer_command(Options)
    def command(options: Options) -> None:
        seen.append(options)

    cli = typer.Typer()
    cli.command()(command)
    cli.command("other")(lambda: None)  # two commands: the first is then named, as `robotloop train` is
    args = ["command", *to_argv(Options(datasets=[URL], output=RUN, warmup_steps=9))]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert seen[0].warmup_steps == 9 and seen[0].datasets == [URL]
    assert "--warmup-steps" in CliRunner().invoke(cli, ["command", "--help"], env={"COLUMNS": "200"}).output

    class Tools:
        @tool_parameters(Options, param="spec")
        def start(self, spec: Options) -> BaseModel:
            """Start."""
            return spec

    from strands import tool

    start = tool(Tools.start)
    assert "warmup_steps" in start.tool_spec["inputSchema"]["json"]["properties"]
    assert Tools().start(datasets=[URL], output=RUN, warmup_steps=4).warmup_steps == 4


def test_progress_has_one_wire_type_from_the_trainer_to_the_agent():
    import dataclasses

    from robotloop.agent.tools import _job
    from robotloop.train.jobs.record import JobState, _apply
    from robotloop.train.progress import JOB_FIELDS, Progress, progress_line, read_line

    sent = Progress(12, float("nan"), 850.5, 0.02, 3, 1.5, last_checkpoint=f"{RUN}/checkpoints/000010")
    line = progress_line("progress", sent)
    assert read_line(line) == ("progress", dataclasses.replace(sent, loss=None))  # NaN: strict JSON's null
    assert read_line(line[:-5]) is None  # a torn last line is skipped
    state = JobState("j1", "running", {"steps": 20, "output": RUN}, 0.0)
    _apply(state, line.encode())
    shown = _job(dataclasses.asdict(state))
    assert {k: shown[k] for k in JOB_FIELDS} == {k: getattr(read_line(line)[1], k) for k in JOB_FIELDS}
    assert set(JOB_FIELDS) <= {f.name for f in dataclasses.fields(JobState)}


def test_a_secret_option_is_typed_in_as_text_and_kept_secret():
    """A SecretStr field is a plain text option to Typer (Typer 0.27, the GPU image's, refuses the type); the model
    wraps what was typed, so it never prints."""

    class Options(BaseModel):
        token: SecretStr | None = Field(default=None, description="A token.")

    seen: list[Options] = []

    @typer_command(Options)
    def command(options: Options) -> None:
        seen.append(options)

    (param,) = typer_parameters(Options)
    assert param.annotation.__origin__ == str | None
    cli = typer.Typer()
    cli.command()(command)
    cli.command("other")(lambda: None)
    assert CliRunner().invoke(cli, ["command", "--token", "s3cret"]).exit_code == 0
    assert isinstance(seen[0].token, SecretStr) and seen[0].token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(seen[0])


def test_a_config_file_holds_options_and_flags_given_win(tmp_path: Path):
    """`robotloop train --config FILE` (LeRobot's `--config_path` too): ours as YAML, or lerobot's train_config.json;
    a flag on the command line wins over the file, a key the options do not know is refused, naming it."""
    from robotloop.train.options import read_train_config

    seen: list[TrainOptions] = []

    @typer_command(TrainOptions, config=read_train_config)
    def command(options: TrainOptions) -> None:
        seen.append(options)

    cli = typer.Typer()
    cli.command()(command)
    cli.command("other")(lambda: None)
    ours = tmp_path / "run.yaml"
    ours.write_text(f"datasets: [{URL}]\noutput: {RUN}\nsteps: 100\nbatch-size: 3\nchunk_size: 20\n")
    result = CliRunner().invoke(cli, ["command", "--config", str(ours), "--steps", "5"])
    assert result.exit_code == 0, result.output
    assert (seen[-1].datasets, seen[-1].output, seen[-1].steps, seen[-1].batch_size) == ([URL], RUN, 5, 3)
    assert seen[-1].chunk_size == 20 and seen[-1].log_every == 50  # not in the file: the model's default

    from lerobot.policies.act.configuration_act import ACTConfig

    from robotloop.storage import BucketUrl
    from robotloop.train.policy import ACTSettings
    from robotloop.train.train_config import lerobot_train_config
    from robotloop.train.trainer import TrainSettings

    theirs = lerobot_train_config(
        ACTConfig(chunk_size=30, n_action_steps=30, dim_model=256, push_to_hub=False),
        [BucketUrl.parse("hf://buckets/lab/cube")],
        BucketUrl.parse(RUN),
        TrainSettings(steps=3000, batch_size=64, seed=4, log_every=10, checkpoint_every=500),
        ACTSettings(lr=1e-4),
    )
    theirs.save_pretrained(tmp_path / "pretrained_model")
    lerobot_file = tmp_path / "pretrained_model" / "train_config.json"
    result = CliRunner().invoke(cli, ["command", "--config_path", str(lerobot_file), "--output", RUN])
    assert result.exit_code == 0, result.output
    got = seen[-1]
    assert got.datasets == ["hf://buckets/lab/cube"] and (got.steps, got.batch_size, got.seed) == (3000, 64, 4)
    assert (got.log_every, got.checkpoint_every, got.chunk_size, got.dim_model, got.lr) == (10, 500, 30, 256, 1e-4)

    # The flags' own names as keys (the README's promise): `dataset` as for the flag, one URL for a list, LeRobot's
    # `policy.chunk_size` spelling as for its flag alias.
    for key in ("dataset", "datasets", "--dataset"):
        (flags := tmp_path / "flags.yaml").write_text(f"{key}: {URL}\noutput: {RUN}\npolicy.chunk_size: 7\n")
        result = CliRunner().invoke(cli, ["command", "--config", str(flags)])
        assert result.exit_code == 0, (key, result.output)
        assert seen[-1].datasets == [URL] and seen[-1].chunk_size == 7

    (bad := tmp_path / "bad.yaml").write_text(f"datasets: [{URL}]\noutput: {RUN}\nlearning_rate: 1e-4\n")
    result = CliRunner().invoke(cli, ["command", "--config", str(bad)])
    assert result.exit_code == 2 and "learning_rate" in result.output
    result = CliRunner().invoke(cli, ["command", "--output", RUN])  # no dataset, no file
    assert result.exit_code == 2 and "missing" in result.output and "--dataset" in result.output
    result = CliRunner().invoke(app, ["train", "--output", RUN])  # the real command, the same way
    assert result.exit_code == 2 and "--dataset" in result.output
