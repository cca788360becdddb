"""services.serve: what every service does before it serves, here the open-files limit a fleet needs."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import resource
import socket
import time
from pathlib import Path

import httpx

from robotloop.deploy.client import DeployClient
from robotloop.deploy.local import start_local_deploy_service
from services.serve import KEEP_ALIVE_S, RESERVED_FILES, connection_limit

LOW_SOFT_LIMIT = 256  # the soft limit the service is started under; 600 long-polls need more descriptors than that
LONG_POLLS = 600


@contextlib.contextmanager
def soft_open_files_limit(soft: int):
    """This process's soft limit lowered while a child starts (children inherit it); the hard one is left alone."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def soft_limit_of(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max open files"))
    return int(line.split()[3])


async def long_polls(url: str, robot: str, token: str, n: int) -> list[int | str]:
    """n assignment long-polls of one robot at once, each on its own connection: their statuses (or errors)."""
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:

        async def one() -> int | str:
            try:
                r = await client.get(
                    f"/v1/robots/{robot}/assignment",
                    params={"wait_s": 2.0},  # no release on its channel: each waits its 2 s
                    headers={"authorization": f"Bearer {token}"},
                )
                return r.status_code
            except httpx.HTTPError as error:
                return type(error).__name__

        return await asyncio.gather(*(one() for _ in range(n)))


def test_a_service_raises_its_open_files_limit_and_holds_hundreds_of_long_polls(tmp_path: Path) -> None:
    """Started under a soft limit of 256 open files, the deploy service raises it to the hard limit, and 600 robots'
    long-polls at once are all answered, with no "Too many open files" in its log (before, asyncio's accept failed,
    logging a traceback each time, and the connections waited in the listen queue)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert hard != resource.RLIM_INFINITY and hard > 2 * LONG_POLLS, "the test needs a hard limit over 1,200"
    with soft_open_files_limit(LOW_SOFT_LIMIT):
        service = start_local_deploy_service(tmp_path / "deploy")
    try:
        raised = soft_limit_of(service.proc.pid)
        assert raised == hard > LOW_SOFT_LIMIT
        robot_token = DeployClient(service.url, service.token).register_robot("r1")
        start = time.monotonic()
        statuses = asyncio.run(long_polls(service.url, "r1", robot_token, LONG_POLLS))
        assert statuses == [200] * LONG_POLLS, sorted(set(map(str, statuses)))
        assert time.monotonic() - start < 25  # 2 s long-polls, not a queue waiting for descriptors
        log = service.log.read_text()
        assert "Too many open files" not in log
        assert f"open files limit {raised}: at most {raised - RESERVED_FILES} connections at once" in log
    finally:
        service.stop()


def test_connections_are_bounded_below_the_open_files_limit() -> None:
    assert connection_limit(None) is None
    assert connection_limit(1024) == 1024 - RESERVED_FILES  # a soft limit that could not be raised: 503 past 896
    assert connection_limit(100) == 16  # never none at all


def test_the_service_keeps_an_idle_connection_longer_than_clients_do(tmp_path: Path) -> None:
    """httpx drops an idle connection after 5 s; the service keeps one for KEEP_ALIVE_S, so it is always the client
    that closes, never the server under a request the client is sending on it (a reset)."""
    service = start_local_deploy_service(tmp_path / "deploy")
    try:
        host, port = service.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/v1/health")
        assert conn.getresponse().read() == b'{"status":"ok"}'
        time.sleep(6)  # past httpx's 5 s and uvicorn's default keep-alive
        assert conn.sock is not None  # the one connection, still held
        conn.sock.setblocking(False)
        try:
            closed = conn.sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:  # nothing to read: still open
            closed = False
        conn.sock.setblocking(True)
        assert not closed
        conn.request("GET", "/v1/health")  # and it still answers on it
        assert conn.getresponse().status == 200
        conn.close()
        assert KEEP_ALIVE_S > 5
    finally:
        service.stop()
