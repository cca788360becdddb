"""Shared fixtures: a real robotloop bucket server on 127.0.0.1, started as its own process."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from robotloop.config import cache_home
from robotloop.service_process import free_port
from robotloop.storage.embedded import stop_embedded_server

from .pgserver import PgServer, start_postgres

# The suite never touches the user's ~/.cache/robotloop (caches, the embedded bucket server's data). robotloop
# reads XDG_CACHE_HOME when it needs the folder, so setting it in each pytest process is enough; each test gets its
# own below. Not at import: a process a test starts that imports a test module (a committer killed mid-commit, a
# worker unpickling a test's function) keeps the folder its test gave it and leaves none behind.
SESSION_CACHE: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global SESSION_CACHE
    SESSION_CACHE = Path(tempfile.mkdtemp(prefix="robotloop-tests-"))
    os.environ["XDG_CACHE_HOME"] = str(SESSION_CACHE)


# What one run of the suite writes at its peak under the temporary folder (5.8 GB on 2026-12-05: the bucket servers'
# data, trained checkpoints, the robots' caches), with a margin. Below it, tests fail midway on ENOSPC, each with
# another message; the suite says so once, before it starts.
SUITE_DISK_BYTES = 7 * 2**30


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the controller checks, once
        return
    free = shutil.disk_usage(tempfile.gettempdir()).free
    if free < SUITE_DISK_BYTES:
        pytest.exit(
            f"{tempfile.gettempdir()} has {free / 2**30:.1f} GiB free; the suite needs about "
            f"{SUITE_DISK_BYTES / 2**30:.0f} GiB there (set TMPDIR to a folder with more room)",
            returncode=4,
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # A module fixture that used the embedded default started it; forced: whatever of the suite still holds a lease.
    stop_embedded_server(cache_home() / "buckets", force=True)
    if SESSION_CACHE is not None:
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)


WRITE_TOKEN = "rl_test_write"
READ_TOKEN = "rl_test_read"
OTHER_NS_TOKEN = "rl_test_other"


@dataclass
class Server:
    endpoint: str
    root: Path
    tokens_file: Path
    proc: subprocess.Popen

    def stats(self) -> dict:
        return httpx.get(
            f"{self.endpoint}/api/robotloop/stats", headers={"authorization": f"Bearer {WRITE_TOKEN}"}
        ).json()


def start_server(root: Path, tokens_file: Path, port: int | None = None, extra_args: tuple[str, ...] = ()) -> Server:
    """Start `python -m services.bucket` (with `extra_args`, e.g. ``--database URL``) and wait until it answers."""
    port = port or free_port()
    log = open(root.parent / f"server-{port}.log", "ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.bucket",
            "--root",
            str(root),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--tokens",
            str(tokens_file),
            *extra_args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = Server(f"http://127.0.0.1:{port}", root, tokens_file, proc)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"bucket server exited: {(root.parent / f'server-{port}.log').read_text()[-3000:]}"
        try:
            if server.stats() is not None:
                return server
        except (httpx.HTTPError, ValueError):
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("bucket server did not start")


@pytest.fixture(scope="session")
def tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "tokens"
    path.write_text(f"# test tokens\n{WRITE_TOKEN} write *\n{READ_TOKEN} read *\n{OTHER_NS_TOKEN} write other\n")
    return path


@pytest.fixture(scope="session")
def bucket_server(tmp_path_factory: pytest.TempPathFactory, tokens_file: Path) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("bucket-server")
    server = start_server(base / "root", tokens_file)
    yield server
    server.proc.terminate()
    server.proc.wait(10)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PgServer]:
    """A real PostgreSQL server for the session (tests/pgserver.py); fails with the install command without it."""
    server, base = start_postgres()
    yield server
    try:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped by a test that failed midway
            server.stop("immediate")  # nothing to keep: it goes with its folder
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Nothing may reach the public Hub; each test gets its own HF and robotloop caches."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    os.environ.setdefault("MUJOCO_GL", "egl")
    yield
    stop_embedded_server(tmp_path / "cache" / "robotloop" / "buckets", force=True)  # the test's own, if it used one
