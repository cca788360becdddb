"""`python -m robotloop.train ...` is `robotloop train ...` (the same command, `robotloop.train.command`, without
the CLI); under torchrun it trains data parallel:

    torchrun --nproc-per-node 2 -m robotloop.train --dataset hf://buckets/lab/d/datasets/cube \\
        --output hf://buckets/lab/d/models/run1 --steps 5000 --device cuda

Settings come from robotloop.toml and ROBOTLOOP_* variables (the training service passes the storage endpoint and
token as ROBOTLOOP_STORAGE__*).
"""

import faulthandler
import sys

import typer

from ..output import log_to_console, quiet_libraries

quiet_libraries()
log_to_console("--debug" in sys.argv)  # as `robotloop`'s: before lerobot logs anything
from .command import train  # noqa: E402 - after the libraries are told to be quiet

if __name__ == "__main__":
    faulthandler.enable()  # as `robotloop`: a crash in native code (CUDA, a codec) prints every thread's stack
    app = typer.Typer(add_completion=False)
    app.command()(train)
    app(prog_name="python -m robotloop.train")
