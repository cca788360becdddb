"""Which of a fleet robot's imports starts CUDA, so that a process forked after it cannot use the GPU.

On an H100 machine (2026-12-06) the fleet's fork server, which imports `robotloop.rounds.fleet.ROBOT_IMPORTS`, left
its forked robots unable to load a policy onto the GPU ("Cannot re-initialize CUDA in forked subprocess"); on a CPU
machine it does not. The fleet now spawns its robots where that happens. This imports the modules one by one, as the
server does, and after each forks a child that says whether it could still use CUDA; the calls into torch's CUDA
module made while importing are printed with where they came from.

    source .gpu/env.sh && python3 benchmarks/fork_cuda_check.py
"""

import importlib
import os
import sys

import torch

from robotloop.rounds.fleet import ROBOT_IMPORTS

WATCHED = ("cuda", "lazy_init", "device_count", "device_capability", "device_properties", "getDeviceCount")


def forked_child_can_use_cuda() -> bool:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one byte, then gone without running the parent's exit handlers
        os.write(write, b"0" if torch.cuda._is_in_bad_fork() else b"1")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    return answer == b"1"


def watch(frame, event, arg) -> None:
    name = arg.__name__ if event == "c_call" else frame.f_code.co_name if event == "call" else ""
    module = getattr(arg, "__module__", None) if event == "c_call" else frame.f_globals.get("__name__", "")
    if any(w in name for w in WATCHED) and "torch" in str(module):
        caller = frame if event == "c_call" else frame.f_back
        print(f"  {module}.{name} from {caller.f_code.co_filename}:{caller.f_lineno}", flush=True)


def state() -> str:
    return f"CUDA initialized {torch.cuda.is_initialized()}, a forked child can use it {forked_child_can_use_cuda()}"


def main() -> None:
    print(f"after `import torch`: {state()}")
    for name in ROBOT_IMPORTS:
        sys.setprofile(watch)
        importlib.import_module(name)
        sys.setprofile(None)
        print(f"after {name}: {state()}")


if __name__ == "__main__":
    main()
