"""A deploy service on localhost, as its own process: what `robotloop loop` and the tests start.

Example:
    ```python
    >>> service = start_local_deploy_service(Path("/tmp/loop/deploy"))
    >>> DeployClient(service.url, service.token).status()
    >>> service.stop()
    ```
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..auth import new_token
from ..service_process import free_port, start_service_process


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


def start_local_deploy_service(
    base: Path,
    token: str | None = None,
    timeout_s: float = 30.0,
    extra_args: tuple[str, ...] = (),
    extra_tokens: tuple[str, ...] = (),
    trusted_keys: tuple[Path, ...] = (),
    host: str = "127.0.0.1",
) -> LocalDeployService:
    """Start `python -m services.deploy` on `host` (127.0.0.1, or this machine's address where other machines must
    reach it) with an operator write token (`token`, else a fresh one), more tokens-file lines (`extra_tokens`, e.g.
    "<token> read *") and a database under `base`. It registers only
    releases signed by `trusted_keys`; with none (tests, benchmarks) it is started with `--allow-any-signer`.

    Raises:
        ServiceStartError: the service exited or did not answer within `timeout_s` (the message ends with its log).
    """
    base.mkdir(parents=True, exist_ok=True)
    token = token or new_token("rl_ops_")
    tokens = base / "ops.tokens"
    tokens.touch(mode=0o600)
    tokens.write_text("".join(f"{line}\n" for line in (f"{token} write *", *extra_tokens)))
    port, log = free_port(), base / "deploy.log"
    url = f"http://{host}:{port}"
    signers = [a for key in trusted_keys for a in ("--trusted-key", str(key))]
    if not signers and "--trusted-key" not in extra_args:
        signers = ["--allow-any-signer"]
    args = [
        "--tokens",
        str(tokens),
        "--db",
        str(base / "deploy.sqlite"),
        "--host",
        host,
        "--port",
        str(port),
        *signers,
        *extra_args,
    ]
    proc = start_service_process("services.deploy", args, log, lambda: _answers(url), timeout_s)
    return LocalDeployService(url, token, proc, log)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v1/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
