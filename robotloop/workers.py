"""Worker processes (sim, decode, evaluation) that die with the process that started them, however it dies.

A pool's workers outlive a parent killed with SIGKILL: nothing runs in the parent to stop them, and a spawned
worker blocked on its job queue never notices (after `kill -9` of `robotloop record`, its sim workers stayed alive
for 90 minutes, ~280 MB each). Linux can deliver a signal to a process when its parent goes: each worker asks for
SIGKILL on its first line. Written here rather than taken from a library: it is one prctl call, and the
libraries that wrap it (python-prctl) build a C extension for it.

Example:
    ```python
    >>> ProcessPoolExecutor(4, mp_context=mp.get_context("spawn"), initializer=die_with_parent, initargs=(os.getpid(),))
    ```
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent (`parent_pid`, the process that started it) dies.

    Exits at once when the parent is already gone (the kernel only signals deaths after the request). The signal
    follows the parent *thread* that started this process: start workers from a thread that outlives them (a pool
    used inside a `with` block in that thread does). Elsewhere than Linux: a no-op.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(1)
