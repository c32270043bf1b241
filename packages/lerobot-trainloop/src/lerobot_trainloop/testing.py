"""A tiny model and synthetic dataset that follow the loop's contracts.

Shipped (not hidden in a test folder) because tests of several packages, the benchmarks and
the README example all need the same deterministic workload: ``loss, info = model(batch)``
with float ``info``, and samples that carry their own dataset ``index`` so a test can tell
exactly which samples each rank trained on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset


class TinyRegressor(nn.Module):
    """Two-layer MLP regressing ``batch["y"]`` from ``batch["x"]``; init depends only on ``seed``."""

    def __init__(self, in_dim: int = 8, hidden: int = 32, out_dim: int = 4, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, out_dim))

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        pred = self.net(batch["x"]).float()  # loss in fp32 under autocast
        mse = F.mse_loss(pred, batch["y"].float())
        l1 = F.l1_loss(pred.detach(), batch["y"].float())
        return mse, {"mse": float(mse.detach()), "l1": float(l1)}


class SyntheticRegression(Dataset):
    """``num_samples`` fixed (x, y) pairs from a random linear map plus noise."""

    def __init__(self, num_samples: int = 64, in_dim: int = 8, out_dim: int = 4, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(num_samples, in_dim, generator=g)
        w = torch.randn(in_dim, out_dim, generator=g)
        self.y = self.x @ w + 0.1 * torch.randn(num_samples, out_dim, generator=g)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i], "index": torch.tensor(i)}

    def batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """The collated batch of ``indices`` without a DataLoader (reference computations)."""
        idx = torch.as_tensor(indices)
        return {"x": self.x[idx], "y": self.y[idx], "index": idx}
