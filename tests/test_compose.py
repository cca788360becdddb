"""docker-compose.yml stays in step with the CLI (no Docker engine runs here: this checks what can be checked)."""

from pathlib import Path

import yaml
from typer.testing import CliRunner

from robotloop.cli import app

COMPOSE = Path(__file__).parents[1] / "docker-compose.yml"


def test_every_service_runs_a_real_robotloop_command():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert {"buckets", "capture", "trainer"} <= set(services)
    for name, service in services.items():
        command = service["command"]
        result = CliRunner().invoke(app, [*command[:2], "--help"])
        assert result.exit_code == 0, f"{name}: robotloop {' '.join(command[:2])} is not a command"
        for flag in (c for c in command if c.startswith("--")):
            assert flag in result.output, f"{name}: {flag} is not an option of robotloop {' '.join(command[:2])}"


def test_services_never_expose_ports_beyond_localhost():
    for name, service in yaml.safe_load(COMPOSE.read_text())["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"
