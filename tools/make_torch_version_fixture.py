"""Write a small FSDP2 ×2 checkpoint with the torch of the running environment, for the cross-torch tests.

lerobot-ckpt supports torch 2.11 (LeRobot 0.6.1's) to 2.15 (the lock); checkpoints written by one are
read by the other, and DCP's pickled ``.metadata`` differs between them (``TensorProperties`` gained
``strides``; newer dtypes). The workspace tests write 2.15 files live; this script writes the files of
another torch once, under ``packages/lerobot-ckpt/tests/data/torch-<version>/``:

* ``checkpoints/000002/``: lerobot-ckpt's own save of a 2-layer MLP trained 2 AdamW steps on 2 gloo
  ranks (``checkpoint_format=dcp``: DCP model and optimizer shards with byte entries, RNG, record);
* ``expected.safetensors``: the full weights and the first parameter's ``exp_avg`` as torch had them.

Run from the repository root in an environment with that torch and lerobot-ckpt[torch]::

    <env>/bin/torchrun --nproc-per-node=2 tools/make_torch_version_fixture.py
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
from lerobot_ckpt import Parallelism, RunInfo, TrainingObjects, save_checkpoint, write_tensors
from torch import nn
from torch.distributed.fsdp import fully_shard

OUT = Path(__file__).resolve().parents[1] / "packages" / "lerobot-ckpt" / "tests" / "data"


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = model()
    for layer in (net[0], net[2]):
        fully_shard(layer)
    fully_shard(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(2):
        torch.manual_seed(100 + step)
        net(torch.randn(4, 6)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    out = OUT / f"torch-{torch.__version__.split('+')[0]}"
    if rank == 0 and out.exists():
        shutil.rmtree(out)
    dist.barrier()
    run = RunInfo(world_size=2, batch_size=4, parallelism=Parallelism(1, 2), checkpoint_format="dcp")
    save_checkpoint(
        out, 2, run=run, objects=TrainingObjects(model=net, optimizer=opt), sampler_state={"offset": 8}
    )
    full = {k: v.full_tensor() for k, v in net.state_dict().items()}
    exp_avg = opt.state[next(iter(net.parameters()))]["exp_avg"].full_tensor()
    if rank == 0:
        write_tensors(out / "expected.safetensors", {**full, "exp_avg.0.weight": exp_avg})
        (out / "README.md").write_text(
            f"Written by tools/make_torch_version_fixture.py with torch {torch.__version__}.\n"
        )
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(0.2)  # gloo may abort at exit while a peer is still tearing down (pytorch#190489)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
