"""The embedded default: a robotloop bucket server on localhost, started on demand and shared.

With no endpoint configured, every robotloop process (recorder, trainer, deploy service, robots) uses the
same server: the first one starts it, the others find it through `server.json` in the data root. It is a
separate process, so it outlives the command that started it, as a local database server would.

The server has auth like any other: a write token is made once, kept in `<root>/tokens` (mode 0600),
and read back by every local client. Only processes that can read that file can write.

Shared means one process can pull it from under another: every checkout and every run of one user (one HOME) reach
the same server, so `robotloop bucket server stop` in one would break a recording or a training in another. Each
process that finds or starts the server (`ensure_embedded_server`) therefore holds a lease on it for as long as it
lives: a file `<root>/clients/<pid>` it keeps an exclusive flock on. The kernel drops the lock when the process
ends however it ends (kill -9 too), so a lease never outlives its holder, and a pid reused by another process cannot
pass for one (as it could with a bare pid file). `stop_embedded_server` refuses, naming the pids, while another
process holds one, unless forced. Tools that reach the server through `robotloop bucket server env` (hf, curl,
lerobot) hold none.

Layout of `<root>`: `tokens`, `server.json` (endpoint and pid), `server.log`, `clients/` (the leases), and `data/`,
the server's data root (`data_root`: what `robotloop bucket serve --root` and `robotloop bucket scrub --root` take).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..auth import token_proof
from ..errors import Conflict, Unavailable
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


class EmbeddedServerInUse(Conflict, RuntimeError):
    """The embedded bucket server was not stopped: other processes hold a lease on it (the message names them)."""


def data_root(root: Path) -> Path:
    """The data root of the embedded server of `root` (its buckets and CAS): what `bucket scrub --root` takes."""
    return Path(root).expanduser().absolute() / "data"


def ensure_embedded_server(root: Path, port: int = 0) -> LocalServer:
    """Reuse the embedded server of `root` if it answers, else start it. Safe to call from many processes. The
    calling process holds a lease on the server from then on, until it ends (see the module docstring).

    Raises:
        EmbeddedServerError: it did not answer within a minute (its log is `<root>/server.log`).
    """
    root = private_dir(Path(root).expanduser())
    with _Locked(root / ".lock"):
        token = _local_token(root)
        _hold_lease(root)  # under the lock: a `stop` either sees this lease or ran before it (the server restarts)
        running = _running_server(root, token)
        if running:
            return running
        return _start(root, token, port or free_port())


# The lease this process holds on each root's server: (pid, fd of `<root>/clients/<pid>`, flocked). The pid tells a
# forked child, which inherits the dict and the fd, that the lease is its parent's.
_LEASES: dict[Path, tuple[int, int]] = {}


def _hold_lease(root: Path) -> None:
    held = _LEASES.get(root)
    if held is not None and held[0] == os.getpid():
        return
    fd = os.open(private_dir(root / "clients") / str(os.getpid()), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the file is ours alone (by pid), so this does not wait
    _LEASES[root] = (os.getpid(), fd)


def server_clients(root: Path, forget_ended: bool = False) -> list[int]:
    """The pids of the other processes holding a lease on the embedded server of `root` (not this one's).
    `forget_ended`: remove the leases of processes that ended (only under `<root>/.lock`, where no process takes
    one meanwhile)."""
    folder = Path(root).expanduser() / "clients"
    pids = []
    for lease in sorted(folder.iterdir()) if folder.is_dir() else []:
        try:
            fd = os.open(lease, os.O_RDONLY)
        except FileNotFoundError:  # forgotten by another `stop` meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another file description: fails while its holder lives
        except BlockingIOError:
            if lease.name.isdigit() and int(lease.name) != os.getpid():
                pids.append(int(lease.name))
        else:
            if forget_ended:
                lease.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return sorted(pids)


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
    data, tokens = str(data_root(root)), str(root / "tokens")
    args = ["--root", data, "--host", "127.0.0.1", "--port", str(port), "--tokens", tokens]
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


def stop_embedded_server(root: Path, force: bool = False) -> bool:
    """Stop the embedded server of `root` if one runs. Returns whether one was stopped. Leases of this process do
    not count.

    Raises:
        EmbeddedServerInUse: other processes hold a lease on it and not `force` (with `force` they lose their server
            mid-run; the next one to call `ensure_embedded_server` starts it again).
    """
    root = Path(root).expanduser()
    if not (root / "server.json").exists():
        return False
    with _Locked(root / ".lock"):
        try:
            state = json.loads((root / "server.json").read_text())
            pid = int(state["pid"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return False
        users = server_clients(root, forget_ended=True)
        if users and not force and _is_our_server(root, pid):
            raise EmbeddedServerInUse(
                f"the embedded bucket server at {state.get('endpoint')} is in use by pid {', '.join(map(str, users))}"
                f" (see `ps -p {','.join(map(str, users))}`): stop those first, or stop it anyway with "
                "`robotloop bucket server stop --force`"
            )
        (root / "server.json").unlink(missing_ok=True)
        if not _is_our_server(root, pid):
            return False  # it ended already; the pid may be another process's by now
        os.kill(pid, signal.SIGTERM)
        return True


def _is_our_server(root: Path, pid: int) -> bool:
    """Whether process `pid` is the embedded server of `root`: its command line names the data root (where there
    is no /proc: whether that server answers, proving it holds the token)."""
    try:
        return str(data_root(root)).encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return False  # no such process
        server = embedded_server(root)
        return server is not None and server.pid == pid
    except PermissionError:
        return False


class _Locked:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
