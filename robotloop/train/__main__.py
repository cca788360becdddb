"""`python -m robotloop.train ...` is `robotloop train ...`; under torchrun it trains data parallel:

    torchrun --nproc-per-node 2 -m robotloop.train --dataset hf://buckets/lab/d/datasets/cube \\
        --output hf://buckets/lab/d/models/run1 --steps 5000 --device cuda
"""

import sys

from ..cli import app

if __name__ == "__main__":
    app(["train", *sys.argv[1:]], prog_name="python -m robotloop.train")
