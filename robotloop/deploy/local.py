"""A deploy service on localhost, as its own process: what `robotloop loop` and the tests start.

Example:
    ```python
    >>> service = start_local_deploy_service(Path("/tmp/loop/deploy"))
    >>> DeployClient(service.url, service.token).status()
    >>> service.stop()
    ```
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class LocalDeployService:
    url: str
    token: str  # an operator write token
    proc: subprocess.Popen
    log: Path

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_local_deploy_service(base: Path, token: str | None = None, timeout_s: float = 30.0,
                               extra_args: tuple[str, ...] = (), extra_tokens: tuple[str, ...] = ()) -> LocalDeployService:  # fmt: skip
    """Start `python -m services.deploy` on 127.0.0.1 with an operator write token (`token`, else a fresh one),
    more tokens-file lines (`extra_tokens`, e.g. "<token> read *") and a database under `base`.

    Raises:
        RuntimeError: the service exited or did not answer within `timeout_s` (the message ends with its log).
    """
    base.mkdir(parents=True, exist_ok=True)
    token = token or "rl_ops_" + secrets.token_urlsafe(24)
    tokens = base / "ops.tokens"
    tokens.touch(mode=0o600)
    tokens.write_text("".join(f"{line}\n" for line in (f"{token} write *", *extra_tokens)))
    port, log = _free_port(), base / "deploy.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "services.deploy", "--tokens", str(tokens), "--db",
                                 str(base / "deploy.sqlite"), "--port", str(port), *extra_args], stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    service = LocalDeployService(f"http://127.0.0.1:{port}", token, proc, log)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            service.stop()
            raise RuntimeError(f"the deploy service did not start; {log} ends:\n{log.read_text()[-3000:]}")
        try:
            httpx.get(f"{service.url}/v1/health", timeout=2).raise_for_status()
            return service
        except httpx.HTTPError:
            time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
