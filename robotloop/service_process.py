"""Start one of robotloop's services (`python -m services.<name> ...`) as a local process and wait until it answers:
what the embedded bucket server and the loop's local deploy service share."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .errors import Unavailable


class ServiceStartError(Unavailable, RuntimeError):
    """The service exited or did not answer in time; the message ends with its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service_process(
    module: str, args: list[str], log: Path, answers: Callable[[], bool], timeout_s: float, detach: bool = False
) -> subprocess.Popen:
    """Run `python -m <module> <args>` with its output appended to `log`, polling `answers()` until it holds.

    `detach`: a new session, so the service outlives the terminal and the command that started it.

    Raises:
        ServiceStartError: the process exited, or `answers()` did not hold within `timeout_s` (it is killed).
    """
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=detach,
        )
    deadline = time.monotonic() + timeout_s
    while not answers():
        if proc.poll() is not None or time.monotonic() > deadline:
            why = (
                f"exited with code {proc.returncode}"
                if proc.returncode is not None
                else f"did not answer in {timeout_s:.0f} s"
            )
            proc.kill()
            tail = log.read_text(errors="replace")[-2000:]
            raise ServiceStartError(f"{module} {why}; {log} ends:\n{tail}")
        time.sleep(0.1)
    return proc
