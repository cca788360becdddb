"""Every service client speaks through `ServiceClient`: a service that cannot be reached, or refuses, raises the
client's own `ServiceError` subclass (never a raw httpx error), filed under the category of the answer's status
(Unavailable when there is none), with the HTTP status (0: no answer); the CLI prints it as one line."""

import pickle
import socket
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from robotloop.capture.client import CaptureClient, CaptureError
from robotloop.cli import app
from robotloop.cli.output import EXIT_CODES
from robotloop.deploy.client import DeployClient, DeployError
from robotloop.deploy.local import LocalDeployService, start_local_deploy_service
from robotloop.errors import BadInput, Conflict, NotFound, Unavailable, category, category_of_status
from robotloop.service_client import ServiceError
from robotloop.train.client import TrainerClient, TrainerError


def closed_port() -> int:
    with socket.socket() as s:  # bound, never listening, then closed: connecting is refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def deploy_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployService]:
    service = start_local_deploy_service(tmp_path_factory.mktemp("deploy"))
    yield service
    service.stop()


@pytest.mark.parametrize(
    ("client", "error", "call"),
    [
        (CaptureClient, CaptureError, lambda c: c.health()),
        (DeployClient, DeployError, lambda c: c.status()),
        (TrainerClient, TrainerError, lambda c: c.jobs()),
    ],
)
def test_a_refused_connection_is_the_clients_service_error(client, error, call) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(error, match=f"cannot reach the .* at {url}") as refused:
        call(client(url, "token", timeout_s=5))
    assert isinstance(refused.value, ServiceError) and refused.value.status == 0
    assert category(refused.value) is Unavailable


def test_a_service_that_never_answers_is_unavailable() -> None:
    with socket.socket() as silent:  # listening, never accepting: the request times out
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(Unavailable, match="cannot reach the deploy service") as timed_out:
            DeployClient(url, "token", timeout_s=0.3).status()
    assert isinstance(timed_out.value, DeployError) and timed_out.value.status == 0


def test_the_capture_client_needs_a_token() -> None:
    with pytest.raises(CaptureError, match="capture service needs a token") as missing:
        CaptureClient("http://127.0.0.1:1", "")
    assert isinstance(missing.value, BadInput)


def test_a_refusal_is_filed_under_its_statuss_category(deploy_service: LocalDeployService) -> None:
    ops = DeployClient(deploy_service.url, deploy_service.token)
    with pytest.raises(NotFound, match=r"deploy service: .*nope.* \(HTTP 404\)") as missing:
        ops.release("nope")
    assert isinstance(missing.value, DeployError) and missing.value.status == 404
    assert type(missing.value).__name__ == "DeployNotFound"
    ops.register_robot("arm1")
    with pytest.raises(Conflict) as taken:
        ops.register_robot("arm1")
    assert isinstance(taken.value, DeployError) and taken.value.status == 409
    # one class per family and category, whoever raised it; and it survives a trip to another process
    assert type(taken.value) is DeployError.filed(Conflict) is DeployError.filed(Conflict)
    again = pickle.loads(pickle.dumps(taken.value))
    assert type(again) is type(taken.value) and again.status == 409 and str(again) == str(taken.value)


def test_the_cli_prints_a_refusal_as_one_line_with_its_exit_code(deploy_service: LocalDeployService) -> None:
    where = ["--deploy-url", deploy_service.url, "--deploy-token", deploy_service.token]
    for url, kind, want in (
        (deploy_service.url, NotFound, "(HTTP 404)"),
        (f"http://127.0.0.1:{closed_port()}", Unavailable, "cannot reach the deploy service"),
    ):
        where[1] = url
        result = CliRunner().invoke(app, ["deploy", "promote", "nope", *where], env={"COLUMNS": "300"})
        assert result.exit_code == EXIT_CODES[kind], result.output
        assert result.output.startswith("error: ") and want in result.output, result.output
        assert result.output.count("\n") == 1 and "Traceback" not in result.output, result.output


def test_statuses_read_back_as_categories() -> None:
    assert category_of_status(401) is category_of_status(403)
    assert category_of_status(418) is BadInput and category_of_status(502) is Unavailable
    assert category_of_status(500).__name__ == "RobotloopError"
