"""Worker processes (sim, decode, evaluation) that die with the process that started them, however it dies.

A pool's workers outlive a parent killed with SIGKILL: nothing runs in the parent to stop them, and a spawned
worker blocked on its job queue never notices (after `kill -9` of `robotloop record`, its sim workers stayed alive
for 90 minutes, ~280 MB each). Linux can deliver a signal to a process when its parent goes: each worker asks for
SIGKILL on its first line. Written here rather than taken from a library: it is one prctl call, and the
libraries that wrap it (python-prctl) build a C extension for it.

`start_worker` is a worker's first call: it dies with its parent, and it reports as the command that started it
does (`robotloop.output.log_to_console`). A worker spawned under `python -m <the CLI package>` imports only what
its job needs, never the CLI's set-up, so lerobot's first logging call would give it Python's `WARNING:name:`
format.

Example:
    ```python
    >>> ProcessPoolExecutor(4, mp_context=mp.get_context("spawn"), initializer=start_worker, initargs=(os.getpid(),))
    ```
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
from pathlib import Path

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent (`parent_pid`, the process that started it) dies.

    Exits at once when the parent is already gone (the kernel only signals deaths after the request). The signal
    follows the parent *thread* that started this process: start workers from a thread that outlives them (a pool
    used inside a `with` block in that thread does). A process forked by multiprocessing's fork server, which
    `parent_pid` started, has that server as its parent, and the server lives as long as any process it forked
    does: such a process watches `parent_pid` itself (a thread waiting on its pidfd) and kills itself when it goes.
    Elsewhere than Linux: a no-op.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    parent = os.getppid()
    if parent == parent_pid:
        return
    if _parent_of(parent) != parent_pid:
        os._exit(1)
    _die_with(parent_pid)


def _die_with(pid: int) -> None:
    """SIGKILL this process when process `pid` exits (Linux 5.3's pidfd: no polling, no pid reuse)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:  # gone already
        os._exit(1)

    def wait() -> None:
        select.select([pidfd], [], [])  # readable once `pid` has exited
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name=f"die-with-{pid}", daemon=True).start()


def _parent_of(pid: int) -> int | None:
    """The parent of process `pid` (Linux's /proc), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # "pid (comm) state ppid ...": comm may hold spaces


def start_worker(parent_pid: int) -> None:
    """A worker process's first call: die with the parent (`die_with_parent`), keep the libraries' bars and banners
    quiet and log as the parent does (`robotloop.output`: one-line notes, `--debug` inherited)."""
    from .output import log_to_console, quiet_libraries

    die_with_parent(parent_pid)
    quiet_libraries()
    log_to_console(debug=os.environ.get(DEBUG_ENV) == "1")


DEBUG_ENV = "ROBOTLOOP_DEBUG"  # set by `--debug`, so worker processes log as their parent
