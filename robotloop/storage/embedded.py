"""The embedded default: a robotloop bucket server on localhost, started on demand and shared.

With no endpoint configured, every robotloop process (recorder, trainer, deploy service, robots) uses the
same server: the first one starts it, the others find it through `server.json` in the data root. It is a
separate process, so it outlives the command that started it, as a local database server would.

The server has auth like any other: a write token is made once, kept in `<root>/tokens` (mode 0600),
and read back by every local client. Only processes that can read that file can write.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..auth import token_proof
from ..errors import Unavailable
from ..service_process import ServiceStartError, free_port, start_service_process
from .private import private_dir

START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class LocalServer:
    endpoint: str
    token: str
    pid: int | None


class EmbeddedServerError(Unavailable, RuntimeError):
    """The embedded bucket server could not be started; the message points to its log."""


def ensure_embedded_server(root: Path, port: int = 0) -> LocalServer:
    """Reuse the embedded server of `root` if it answers, else start it. Safe to call from many processes.

    Raises:
        EmbeddedServerError: it did not answer within a minute (its log is `<root>/server.log`).
    """
    root = private_dir(Path(root).expanduser())
    with _Locked(root / ".lock"):
        token = _local_token(root)
        running = _running_server(root, token)
        if running:
            return running
        return _start(root, token, port or free_port())


def _local_token(root: Path) -> str:
    tokens = root / "tokens"
    if not tokens.exists():
        token = "rl_" + secrets.token_urlsafe(32)
        fd = os.open(tokens, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("# robotloop embedded bucket server: <token> <read|write> <namespace|*>\n")
            f.write(f"{token} write *\n")
    for line in tokens.read_text().splitlines():
        fields = line.split()
        if len(fields) == 3 and not line.startswith("#") and fields[1] == "write" and fields[2] == "*":
            return fields[0]
    raise EmbeddedServerError(f"{tokens} holds no '<token> write *' line for local clients; add one.")


def _running_server(root: Path, token: str) -> LocalServer | None:
    try:
        state = json.loads((root / "server.json").read_text())
    except (FileNotFoundError, ValueError):
        return None
    server = LocalServer(state["endpoint"], token, state.get("pid"))
    return server if _answers(server) else None


def _answers(server: LocalServer) -> bool:
    """Whether our server answers there. It must first prove it holds our token (`TokenStore.prove`): the token
    goes only to it, not to another process that took the port of a server that died."""
    nonce = secrets.token_bytes(16)
    try:
        r = httpx.get(f"{server.endpoint}/api/robotloop/proof", params={"nonce": nonce.hex()}, timeout=2)
        if r.status_code != 200 or token_proof(server.token, nonce) not in r.json().get("proofs", []):
            return False
        r = httpx.get(
            f"{server.endpoint}/api/robotloop/stats", headers={"authorization": f"Bearer {server.token}"}, timeout=2
        )
        return r.status_code == 200
    except (httpx.HTTPError, ValueError, AttributeError):  # no answer, or not JSON of the expected shape
        return False


def _start(root: Path, token: str, port: int) -> LocalServer:
    server = LocalServer(f"http://127.0.0.1:{port}", token, None)
    args = ["--root", str(root / "data"), "--host", "127.0.0.1", "--port", str(port), "--tokens", str(root / "tokens")]
    try:  # detached: the server must not die with the terminal or the command that started it
        proc = start_service_process(
            "services.bucket", args, root / "server.log", lambda: _answers(server), START_TIMEOUT_S, detach=True
        )
    except ServiceStartError as error:
        raise EmbeddedServerError(f"the embedded bucket server did not start: {error}") from None
    (root / "server.json").write_text(json.dumps({"endpoint": server.endpoint, "pid": proc.pid}))
    return LocalServer(server.endpoint, token, proc.pid)


def embedded_server(root: Path) -> LocalServer | None:
    """The embedded server of `root` when one runs and answers (proving it holds the local token), else None.
    Starts nothing (`ensure_embedded_server` does)."""
    root = Path(root).expanduser()
    if not (root / "tokens").exists():
        return None
    try:
        return _running_server(root, _local_token(root))
    except EmbeddedServerError:
        return None


def stop_embedded_server(root: Path) -> bool:
    """Stop the embedded server of `root` if one runs. Returns whether one was stopped."""
    try:
        pid = json.loads((Path(root).expanduser() / "server.json").read_text())["pid"]
        os.kill(pid, 15)
    except (FileNotFoundError, ValueError, KeyError, ProcessLookupError):
        return False
    (Path(root).expanduser() / "server.json").unlink(missing_ok=True)
    return True


class _Locked:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
