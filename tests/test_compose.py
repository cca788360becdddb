"""docker-compose.yml stays in step with the CLI (no Docker engine runs here: this checks what can be checked)."""

import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from robotloop.cli import app

COMPOSE = Path(__file__).parents[1] / "docker-compose.yml"


def test_every_service_runs_a_real_robotloop_command():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert {"buckets", "capture", "trainer"} <= set(services)
    for name, service in services.items():
        if "build" not in service:  # an engine's own image (the replicas profile's PostgreSQL)
            continue
        command = service["command"]
        result = CliRunner().invoke(app, [*command[:2], "--help"])
        assert result.exit_code == 0, f"{name}: robotloop {' '.join(command[:2])} is not a command"
        for flag in (c for c in command if c.startswith("--")):
            assert flag in result.output, f"{name}: {flag} is not an option of robotloop {' '.join(command[:2])}"


def test_services_never_expose_ports_beyond_localhost():
    for name, service in yaml.safe_load(COMPOSE.read_text())["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def test_compose_validates_the_file(tmp_path):
    """`docker compose config` (or Debian's docker-compose) parses and interpolates the file: no engine needed."""
    import shutil
    import subprocess

    compose = (
        ["docker", "compose"]
        if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
        else ["docker-compose"]
        if shutil.which("docker-compose")
        else None
    )
    if compose is None:
        pytest.skip("neither `docker compose` nor docker-compose is installed (scripts/system-deps installs it)")
    shutil.copy(COMPOSE, tmp_path / "docker-compose.yml")
    (tmp_path / "secrets").mkdir()
    for name in ("tokens", "robot_tokens", "deploy_tokens", "deploy.pub"):
        (tmp_path / "secrets" / name).write_text("")
    env = {"PATH": os.environ["PATH"], "ROBOTLOOP_SERVICE_TOKEN": "t", "ROBOTLOOP_ROBOT_TOKEN": "r"}
    ok = subprocess.run([*compose, "config", "-q"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    # The replicas profile: PostgreSQL, two bucket servers over one root, two deploy services, all on it.
    replicas = [*compose, "--profile", "replicas", "config"]
    with_pg = {**env, "ROBOTLOOP_PG_PASSWORD": "pw"}
    config = subprocess.run(replicas, cwd=tmp_path, env=with_pg, capture_output=True, text=True)
    assert config.returncode == 0, config.stderr
    services = yaml.safe_load(config.stdout)["services"]
    assert {"postgres", "buckets-a", "buckets-b", "deploy-a", "deploy-b"} <= set(services)
    for name in ("buckets-a", "buckets-b", "deploy-a", "deploy-b"):
        command = services[name]["command"]
        assert command[command.index("--database") + 1] == "postgresql://robotloop@postgres:5432/robotloop"
        assert "pw" not in " ".join(command)  # the password only in the environment
    assert services["buckets-a"]["volumes"] == services["buckets-b"]["volumes"]  # one shared root
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "pw"
    assert all(services[name]["environment"]["PGPASSWORD"] == "pw" for name in ("buckets-b", "deploy-b"))
    unset = subprocess.run(
        [*compose, "config", "-q"], cwd=tmp_path, env={"PATH": os.environ["PATH"]}, capture_output=True, text=True
    )
    assert unset.returncode != 0 and "ROBOTLOOP_SERVICE_TOKEN" in unset.stderr  # no silent empty token
