"""The one error model (robotloop/errors.py): every category has an exit code and an HTTP status, every library error
is filed under a category, front ends report RobotloopError and let a bug show its traceback."""

from __future__ import annotations

import importlib
import os
import pkgutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from typer.testing import CliRunner

import robotloop
import services
from robotloop.agent.tools import reported
from robotloop.cli import app
from robotloop.cli.output import EXIT_CODES
from robotloop.errors import CATEGORIES, BadInput, NotFound, RobotloopError, category
from robotloop.service_client import ServiceClient, ServiceError
from services.errors import HTTP_STATUS, json_errors

ROOT = Path(__file__).resolve().parents[1]

# Bases of a family whose members each name their category; never raised themselves, or (the service clients)
# raised with whatever status the service answered.
FAMILY_BASES = {
    "BucketError",
    "CasError",
    "StorageError",
    "ServiceError",
    "DeployError",
    "TrainerError",
    "CaptureError",
}


def _all_error_classes() -> list[type[RobotloopError]]:
    for package in (robotloop, services):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if module.name.endswith("__main__"):  # runs its command when imported
                continue
            try:
                importlib.import_module(module.name)
            except ImportError:  # an optional extra (a GPU library, a hardware SDK) that is not installed here
                continue
    found, todo = [], [RobotloopError]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def test_every_category_has_an_exit_code_and_an_http_status():
    for kind in (RobotloopError, *CATEGORIES):
        assert kind in EXIT_CODES, kind
        assert kind in HTTP_STATUS, kind
    assert all(code not in (0, 2) for code in EXIT_CODES.values())  # 0 is success, 2 typer's usage error
    assert all(400 <= status < 600 for status in HTTP_STATUS.values())


def test_every_library_error_is_filed_under_a_category():
    classes = _all_error_classes()
    assert len(classes) > 50, classes
    loose = [c for c in classes if c.__name__ not in FAMILY_BASES and not set(c.__mro__) & set(CATEGORIES)]
    assert not loose, loose


def test_built_in_bases_stay_for_callers_that_caught_them():
    from robotloop.storage import BadBucketUrl
    from robotloop.storage import NotFound as StorageNotFound
    from robotloop.train.jobs import UnknownJob

    assert issubclass(BadBucketUrl, ValueError) and issubclass(BadBucketUrl, BadInput)
    assert issubclass(StorageNotFound, FileNotFoundError) and issubclass(StorageNotFound, NotFound)
    assert issubclass(UnknownJob, KeyError) and issubclass(UnknownJob, NotFound)


@pytest.mark.parametrize("kind", CATEGORIES, ids=lambda k: k.__name__)
def test_a_command_ends_with_its_error_category_exit_code(kind, monkeypatch):
    def refuse(settings):
        raise kind("the [bold]bucket[/bold] said no")

    monkeypatch.setattr("robotloop.cli.bucket.connect", refuse)
    result = CliRunner().invoke(app, ["bucket", "ls", "hf://buckets/lab/x"])
    assert result.exit_code == EXIT_CODES[kind], result.output
    assert "error: the [bold]bucket[/bold] said no" in result.output  # escaped: rich markup is not read
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_bug_in_a_command_shows_its_traceback_not_an_error_line():
    script = (
        "import robotloop.cli, robotloop.cli.bucket as b\n"
        "def broken(settings): raise KeyError('a bug, not a refusal')\n"
        "b.connect = broken\n"
        "robotloop.cli.run(['bucket', 'ls', 'hf://buckets/lab/x'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1, done
    assert "Traceback" in done.stderr and "KeyError: 'a bug, not a refusal'" in done.stderr, done.stderr
    assert "error:" not in done.stdout, done.stdout


def test_agent_tools_report_robotloop_errors_and_let_bugs_through():
    @reported
    def lookup_job(job_id: str) -> dict:
        if job_id == "bug":
            raise ZeroDivisionError("a bug")
        raise NotFound(f"no job {job_id!r}")

    assert lookup_job("j1") == {"status": "error", "content": [{"text": "lookup_job failed: no job 'j1'"}]}
    with pytest.raises(ZeroDivisionError):
        lookup_job("bug")


# --- each category over a real socket, through the services' handler ---------------------------------------------


@pytest.fixture(scope="module")
def service_url() -> Iterator[str]:
    """An app with the services' error handlers, served by uvicorn on 127.0.0.1: /raise/<Category> raises it."""
    service = FastAPI()
    json_errors(service)
    by_name = {kind.__name__: kind for kind in (RobotloopError, *CATEGORIES)}

    @service.get("/raise/{name}")
    def raise_it(name: str) -> dict:
        if name == "bug":
            raise RuntimeError("a bug")
        raise by_name[name](f"{name} refused this")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(service, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.mark.parametrize("kind", (RobotloopError, *CATEGORIES), ids=lambda k: k.__name__)
def test_each_category_answers_its_status_over_a_socket(kind, service_url: str):
    answer = httpx.get(f"{service_url}/raise/{kind.__name__}")
    assert answer.status_code == HTTP_STATUS[kind], answer.text
    assert answer.json() == {"error": f"{kind.__name__} refused this"}


@pytest.mark.parametrize("kind", (RobotloopError, *CATEGORIES), ids=lambda k: k.__name__)
def test_a_service_client_reads_each_status_back_as_its_category(kind, service_url: str):
    class Client(ServiceClient):
        service = "test service"

    with pytest.raises(ServiceError, match=f"test service: {kind.__name__} refused this") as refused:
        Client(service_url, "token")._call("GET", f"/raise/{kind.__name__}")
    assert category(refused.value) is kind and refused.value.status == HTTP_STATUS[kind]


def test_a_bug_in_a_route_is_a_500_not_a_refusal(service_url: str):
    answer = httpx.get(f"{service_url}/raise/bug")
    assert answer.status_code == 500 and "a bug" not in answer.text
