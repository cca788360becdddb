"""Entry points only call downward: `python -m services.<X>` parses the options `robotloop <X> serve` has, from
one definition per service, without importing the CLI."""

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from robotloop.cli import app
from services.bucket import BucketOptions
from services.capture import CaptureOptions
from services.deploy import DeployOptions
from services.trainer import TrainerOptions
from services.ui import UiOptions

REPO = Path(__file__).resolve().parents[1]
SERVICES = {
    "bucket": BucketOptions,
    "capture": CaptureOptions,
    "trainer": TrainerOptions,
    "deploy": DeployOptions,
    "ui": UiOptions,
}
COMMANDS = {"ui": ["ui"]}  # the dashboard is `robotloop ui`; the others `robotloop <X> serve`


def flags(options: type) -> set[str]:
    return {
        name
        for f in dataclasses.fields(options)
        for name in (f.metadata["names"] or ("--" + f.name.replace("_", "-"),))
    }


@pytest.mark.parametrize("name", SERVICES)
def test_the_service_and_the_cli_have_the_same_options(name: str) -> None:
    cli = CliRunner().invoke(app, [*COMMANDS.get(name, [name, "serve"]), "--help"], terminal_width=80)
    assert cli.exit_code == 0, cli.output
    code = f"import runpy, sys; sys.argv = ['x', '--help']; runpy.run_module('services.{name}', run_name='__main__')"
    own = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env={"COLUMNS": "80", "PATH": ""}
    )
    assert own.returncode == 0, own.stderr
    for flag in flags(SERVICES[name]):
        assert flag in cli.output and flag in own.stdout, flag
    table = [" ".join(out.split("Options", 1)[1].split()) for out in (cli.output, own.stdout)]
    assert table[0] == table[1]  # the same options, help and all


@pytest.mark.parametrize("name", SERVICES)
def test_a_service_starts_without_the_cli(name: str) -> None:
    code = (
        "import runpy, sys; sys.argv = ['x', '--help']\n"
        f"try: runpy.run_module('services.{name}', run_name='__main__')\n"
        "except SystemExit: pass\n"
        "print('robotloop.cli' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert run.stdout.split()[-1] == "False", run.stdout + run.stderr


def test_a_refusal_is_one_line_and_exit_code_1(tmp_path: Path) -> None:
    """What the service refuses to start with reads the same from either entry point."""
    env = {"ROBOTLOOP_CONFIG": "/dev/null", "PATH": "", "XDG_CACHE_HOME": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-m", "services.capture", "--port", "0"], cwd=REPO, capture_output=True, text=True, env=env
    )
    assert run.returncode == 1 and "needs robot tokens: pass --tokens FILE" in run.stderr, run.stderr


def test_python_m_robotloop_train_is_robotloop_train_without_the_cli() -> None:
    code = (
        "import runpy, sys; sys.argv = ['x', '--help']\n"
        "try: runpy.run_module('robotloop.train', run_name='__main__')\n"
        "except SystemExit: pass\n"
        "print('robotloop.cli' in sys.modules)"
    )
    own = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env={"COLUMNS": "80"})
    assert own.stdout.split()[-1] == "False", own.stdout + own.stderr
    cli = CliRunner().invoke(app, ["train", "--help"], terminal_width=80)
    table = [" ".join(out.split("Options", 1)[1].split()) for out in (cli.output, own.stdout.rsplit("\n", 2)[0])]
    assert table[0] == table[1]


def test_only_the_cli_imports_the_cli() -> None:
    """Entry points only call downward: nothing in robotloop/ or services/ outside robotloop/cli names it."""
    pattern = re.compile(r"robotloop\.cli\b|from \.\.cli\b|from robotloop import cli\b")  # not ..clients
    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for top in ("robotloop", "services")
        for path in (REPO / top).rglob("*.py")
        if not path.is_relative_to(REPO / "robotloop" / "cli")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_the_cli_starts_without_torch_or_mujoco() -> None:
    """No work at import time: building every command (what `robotloop --help` does) loads neither torch nor
    MuJoCo; `robotloop.sim` and `robotloop.loop` load them with the first name that needs them."""
    code = (
        "import sys\n"
        "from typer.main import get_command\n"
        "from robotloop.cli import app\n"
        "get_command(app)\n"
        "import robotloop.loop, robotloop.sim\n"
        "robotloop.loop.LoopOptions().settings\n"
        "robotloop.sim.get_task('insertion')\n"
        "print('torch' in sys.modules, 'mujoco' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert run.stdout.split()[-2:] == ["False", "False"], run.stdout + run.stderr
