"""The plugin's model: state → action through ``depth`` residual units (its FSDP wrap units)."""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tiny_resmlp.config import TinyResMLPConfig


class ResidualUnit(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        return x + F.gelu(self.fc(self.norm(x)))


class TinyResMLPPolicy(nn.Module):
    def __init__(self, config: TinyResMLPConfig) -> None:
        super().__init__()
        self.config = config
        state, action = config.robot_state_feature, config.action_feature
        self.inp = nn.Linear(state.shape[0], config.width)
        self.units = nn.ModuleList(ResidualUnit(config.width) for _ in range(config.depth))
        self.out = nn.Linear(config.width, action.shape[0])

    def _predict(self, batch: dict[str, Tensor]) -> Tensor:
        x = self.inp(batch["observation.state"].flatten(1))
        for unit in self.units:
            x = unit(x)
        return self.out(x)

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        if self.config.record_dir and self.training:
            rank = os.environ.get("RANK", "0")
            with open(os.path.join(self.config.record_dir, f"rank{rank}.jsonl"), "a") as f:
                f.write(json.dumps(batch["index"].tolist()) + "\n")
        target = batch["action"]
        loss = F.mse_loss(self._predict(batch), target[:, 0] if target.dim() == 3 else target)
        return loss, {"mse_loss": loss.detach()}

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        return self._predict(batch)

    def reset(self) -> None:
        """Stateless."""

    def get_optim_params(self):
        return [{"params": [p for p in self.parameters() if p.requires_grad]}]
