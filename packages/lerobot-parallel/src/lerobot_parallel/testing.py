"""Small models with FSDP wrap units, for tests, benchmarks and the README example.

Shipped (not hidden in a test folder) because this package's tests, the multi-process tests
and foreign-trainer examples need the same models, and ``lerobot_parallel`` may not import
``lerobot_trainloop`` (whose ``testing`` has no block structure). They follow the loop's
contract ``loss, info = model(batch)`` on ``{"x", "y"}`` batches (``SyntheticRegression``'s), and
their widths are odd on purpose: dim 0 of most parameters does not divide by 2 or 4, so FSDP's
padded sharding is exercised.

``probe`` (a dict, empty unless a test fills it) records the dtypes each part saw, which is
how tests tell FSDP's parameter casting from autocast's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Residual MLP block: the repeated unit ``_fsdp_wrap_modules`` names."""

    def __init__(self, width: int, hidden: int, probe: dict) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)
        self._probe = probe

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        self._probe.setdefault("block_input", h.dtype)
        self._probe.setdefault("block_param", self.fc1.weight.dtype)
        out = h + self.fc2(torch.tanh(self.fc1(h)))
        self._probe.setdefault("block_output", out.dtype)
        return out


class Head(nn.Module):
    """Output projection; a separate class so a test can make it a unit or keep it in the root."""

    def __init__(self, width: int, out_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, out_dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(h))


class BlockRegressor(nn.Module):
    """``inp -> Block x depth -> Head`` regressing ``batch["y"]``; init depends only on ``seed``."""

    _fsdp_wrap_modules: ClassVar[list[str]] = ["Block"]

    def __init__(
        self,
        in_dim: int = 8,
        width: int = 13,
        hidden: int = 23,
        depth: int = 3,
        out_dim: int = 4,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.probe: dict = {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.inp = nn.Linear(in_dim, width)
            self.blocks = nn.ModuleList(Block(width, hidden, self.probe) for _ in range(depth))
            self.head = Head(width, out_dim)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        self.probe.setdefault("root_input", batch["x"].dtype)
        self.probe.setdefault("target", batch["y"].dtype)
        h = self.inp(batch["x"])
        for block in self.blocks:
            h = block(h)
        self.probe.setdefault("after_blocks", h.dtype)  # after FSDP's output cast, if any
        pred = self.head(h).float()  # loss in fp32 under autocast
        mse = F.mse_loss(pred, batch["y"].float())
        return mse, {"mse": float(mse.detach())}


class PlainRegressor(BlockRegressor):
    """The same network without a ``_fsdp_wrap_modules`` declaration (the fail-fast case)."""

    _fsdp_wrap_modules: ClassVar[list[str] | None] = None


class TiedTokenModel(nn.Module):
    """Token embedding whose weight is tied to the output head's, with ``Block`` units between.

    Declares ``Block`` and ``TokenHead`` as units, so the head (a unit) and the embedding (root)
    share one parameter: sharding must refuse it. With ``Block`` only, both stay in the root.
    """

    _fsdp_wrap_modules: ClassVar[list[str]] = ["Block", "TokenHead"]

    def __init__(self, vocab: int = 11, width: int = 6, depth: int = 2, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList(Block(width, 2 * width, {}) for _ in range(depth))
            self.head = TokenHead(width, vocab)
        self.head.proj.weight = self.embed.weight

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        h = self.embed(batch["tokens"])
        for block in self.blocks:
            h = block(h)
        loss = F.cross_entropy(self.head(h).float().flatten(0, 1), batch["tokens"].flatten())
        return loss, {}


class TokenHead(nn.Module):
    def __init__(self, width: int, vocab: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, vocab, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h)


class MainTowerLayer(nn.Module):
    """Layer i of the main tower of :class:`JointTowers`; :meth:`joint` also runs the side tower's layer i."""

    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("joint",)

    def __init__(self, width: int) -> None:
        super().__init__()
        self.mix = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def joint(
        self, side: SideTowerLayer, h_main: torch.Tensor, h_side: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both towers' tokens are mixed together (one softmax over the concatenation), then each tower
        projects its own slice: the partner's parameters are used, its ``forward`` never runs."""
        both = torch.cat([self.mix(h_main), side.mix(h_side)], dim=1)
        weights = torch.softmax(both @ both.transpose(1, 2) / both.shape[-1] ** 0.5, dim=-1)
        mixed = weights @ both
        n = h_main.shape[1]
        return h_main + self.out(mixed[:, :n]), h_side + side.out(mixed[:, n:])


class SideTowerLayer(MainTowerLayer):
    """Layer i of the side tower (a mixture-of-transformers "expert"); run by ``MainTowerLayer.joint``."""

    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ()

    def forward(self, *args, **kwargs):
        raise RuntimeError("SideTowerLayer only runs inside MainTowerLayer.joint")


class JointTowers(nn.Module):
    """Two towers whose i-th layers attend jointly (pi0's shape, MoT policies'), declared as grouped units.

    ``batch["x"]`` ``(B, T, in_dim)`` feeds the main tower, ``batch["z"]`` the side tower; the loss
    regresses ``batch["y"]`` from both towers' tokens.
    """

    _fsdp_wrap_modules: ClassVar[list[str]] = ["MainTowerLayer", "SideTowerLayer"]
    _fsdp_unit_groups: ClassVar[list[tuple[str, ...]]] = [("MainTowerLayer", "SideTowerLayer")]

    def __init__(
        self, in_dim: int = 5, width: int = 11, depth: int = 2, out_dim: int = 3, seed: int = 0
    ) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.inp = nn.Linear(in_dim, width)
            self.side_inp = nn.Linear(in_dim, width)
            self.main = nn.ModuleList(MainTowerLayer(width) for _ in range(depth))
            self.side = nn.ModuleList(SideTowerLayer(width) for _ in range(depth))
            self.head = nn.Linear(width, out_dim)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        h, z = self.inp(batch["x"]), self.side_inp(batch["z"])
        for main, side in zip(self.main, self.side, strict=True):
            h, z = main.joint(side, h, z)
        return F.mse_loss(self.head(torch.cat([h, z], dim=1)).mean(dim=1), batch["y"]), {}

    @staticmethod
    def batch(batch_size: int, seed: int, in_dim: int = 5, out_dim: int = 3) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return {
            "x": torch.randn(batch_size, 4, in_dim, generator=g),
            "z": torch.randn(batch_size, 3, in_dim, generator=g),
            "y": torch.randn(batch_size, out_dim, generator=g),
        }


def saved_tensor_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``(fn(), bytes)``: what ``fn`` returns and the bytes of the tensors autograd kept for backward while it
    ran (``saved_tensors_hooks``); what activation checkpointing tests and benchmarks compare."""
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, total[0]
