"""Every service client speaks through `ServiceClient`: a service that cannot be reached, or refuses, raises the
client's own `ServiceError` subclass (never a raw httpx error), with the HTTP status (0: no answer)."""

import socket

import pytest

from robotloop.capture.client import CaptureClient, CaptureError
from robotloop.deploy.client import DeployClient, DeployError
from robotloop.service_client import ServiceError
from robotloop.train.client import TrainerClient, TrainerError


def closed_port() -> int:
    with socket.socket() as s:  # bound, never listening, then closed: connecting is refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def test_the_capture_client_needs_a_token() -> None:
    with pytest.raises(CaptureError, match="capture service needs a token"):
        CaptureClient("http://127.0.0.1:1", "")
