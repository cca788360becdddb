"""Worker processes die with the process that started them, however it dies (robotloop.workers)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PARENT = """
import multiprocessing as mp, os, time
from concurrent.futures import ProcessPoolExecutor
from robotloop.workers import die_with_parent

def worker_pid(_):
    return os.getpid()

if __name__ == "__main__":
    pool = ProcessPoolExecutor(2, mp_context=mp.get_context("{method}"), initializer=die_with_parent,
                               initargs=(os.getpid(),))
    print(" ".join(str(pid) for pid in set(pool.map(worker_pid, range(8)))), flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("method", ["spawn", "forkserver"])  # forkserver: the fleet robots', forked by a server
def test_pool_workers_go_when_their_parent_is_killed(tmp_path, method):
    script = tmp_path / "parent.py"
    script.write_text(PARENT.replace("{method}", method))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    assert workers and all(_alive(pid) for pid in workers)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers), "pool workers outlived their killed parent"


def test_a_worker_whose_parent_is_already_gone_exits_at_once():
    code = "from robotloop.workers import die_with_parent; die_with_parent(1); print('still here')"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "still here" not in run.stdout  # its parent is this test, not pid 1
    assert os.getpid() != 1
