"""The model, data and state comparisons shared by the sharded-checkpoint scenarios (ckpt_sharded.py).

A tiny transformer-ish net with the features a real policy's state has: uneven shards (11, 13
rows over 2 ranks), a tied embedding/head pair, a non-parameter buffer, several FSDP units.
Sharding uses torch's ``fully_shard`` on a ``DeviceMesh`` directly (1-D ``dp_shard`` or 2-D
``dp_replicate × dp_shard``), independent of lerobot-parallel.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

VOCAB, WIDTH, HIDDEN = 11, 6, 13


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc1 = nn.Linear(WIDTH, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, WIDTH)

    def forward(self, h):
        return h + self.fc2(F.gelu(self.fc1(self.norm(h))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.tensor([1.0, 0.5, 2.0, 1.5, 0.25, 1.0]))

    def forward(self, idx):
        h = self.emb(idx) * self.scale
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def build(kind: str, mesh=None):
    """``kind``: plain | ddp | fsdp | hsdp. Same initial weights everywhere (a load overwrites them)."""
    torch.manual_seed(1234)
    net = Net()
    model = net
    if kind in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import fully_shard

        for block in net.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(net, mesh=mesh)
    elif kind == "ddp":
        model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def batch(step: int, dp_rank: int):
    g = torch.Generator().manual_seed(step * 1000 + dp_rank)
    return torch.randint(0, VOCAB, (4, 5), generator=g), torch.randint(0, VOCAB, (4, 5), generator=g)


def train_step(model, opt, sched, step: int, dp_rank: int) -> float:
    idx, target = batch(step, dp_rank)
    loss = F.cross_entropy(model(idx).reshape(-1, VOCAB), target.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()
    return float(loss.detach())


def full_state(model, opt) -> dict:
    """Whole model and FQN-keyed optimizer state on CPU (rank 0 only under a process group)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {
        "model": get_model_state_dict(model, options=options),
        "optimizer": get_optimizer_state_dict(model, opt, options=options),
    }


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def diff(a, b, where: str = "state") -> list[str]:
    """Every place where ``a`` and ``b`` differ, bitwise for tensors, strictly typed elsewhere."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            got = f"{getattr(b, 'dtype', type(b))}{tuple(getattr(b, 'shape', ()))}"
            return [f"{where}: {got} vs {a.dtype}{tuple(a.shape)}"]
        return [] if torch.equal(_raw(a), _raw(b)) else [f"{where}: values differ"]
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            return [
                f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b)) if isinstance(b, dict) else b}"
            ]
        return [d for k in a for d in diff(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, list | tuple):
        if type(a) is not type(b) or len(a) != len(b):
            return [f"{where}: {a!r} vs {b!r}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in diff(x, y, f"{where}[{i}]")]
    if isinstance(a, float) and math.isnan(a):
        return [] if isinstance(b, float) and math.isnan(b) else [f"{where}: nan vs {b!r}"]
    return [] if type(a) is type(b) and a == b else [f"{where}: {a!r} vs {b!r}"]


def changed_params(before: dict, after: dict) -> int:
    return sum(not torch.equal(before[k], after[k]) for k in before)
