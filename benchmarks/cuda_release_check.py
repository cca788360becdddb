"""Does `release_cuda_memory` give a compiled, CUDA-graphed training's memory back? A quick GPU check.

python3 benchmarks/cuda_release_check.py
"""

import torch
from torch import nn

from robotloop.train.device import release_cuda_memory


def train_a_while() -> None:
    model = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(8)]).cuda()
    opt = torch.optim.AdamW(model.parameters())
    step = torch.compile(lambda x: model(x).square().mean(), mode="reduce-overhead", dynamic=False)
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(5):
        torch.compiler.cudagraph_mark_step_begin()
        step(x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


train_a_while()
gib = 2**30
held = torch.cuda.memory_reserved() / gib
print(f"after training returned: reserved {held:.2f} GiB, allocated {torch.cuda.memory_allocated() / gib:.2f} GiB")
release_cuda_memory()
print(f"after release_cuda_memory: reserved {torch.cuda.memory_reserved() / gib:.2f} GiB")
