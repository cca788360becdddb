"""Every `robotloop ...` command the README shows is a real command, with options it really has, and its help
renders (rich markup in a help text once crashed `robotloop bucket create --help`)."""

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from robotloop.cli import app

README = Path(__file__).parents[1] / "README.md"


def readme_commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    out = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("robotloop "):
                out.append(shlex.split(line)[1:])
    assert out, "no robotloop commands found in README's bash blocks"
    return out


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda a: " ".join(a[:2]))
def test_readme_command_exists_with_its_options(argv):
    words = [a for a in argv if not a.startswith("-")]
    groups = {"bucket", "capture", "trainer", "deploy", "robot", "train"}
    path = (
        words[:2]
        if words and words[0] in groups and len(words) > 1 and words[1] in _subcommands(words[0])
        else words[:1]
    )
    if path[:1] == ["train"] and path[1:] in (["serve"], ["watch"]):
        path = ["trainer", *path[1:]]
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, f"robotloop {' '.join(path)} is not a command: {result.output[-500:]}"
    for flag in (a.split("=")[0] for a in argv if a.startswith("--")):
        assert flag in result.output, f"robotloop {' '.join(path)} has no option {flag}"


def _subcommands(group: str) -> set[str]:
    result = CliRunner().invoke(app, [group, "--help"], terminal_width=200)
    return set(re.findall(r"│ (\w[\w-]*) ", result.output))


def test_readme_sim_recordings_give_the_expert_time_to_finish():
    """`--max-steps` under the task's episode length cuts the scripted expert off before it succeeds: such a README
    command commits 0 episodes (Insertion's 200 once did)."""
    from robotloop.sim.tasks import get_task

    for argv in (a for a in readme_commands() if a[:1] == ["record"] and "--sim" in a):
        if "--max-steps" in argv:
            task = get_task(argv[argv.index("--sim") + 1])
            steps = int(argv[argv.index("--max-steps") + 1])
            assert steps >= task.episode_length, f"robotloop {' '.join(argv)}: the expert needs {task.episode_length}"
