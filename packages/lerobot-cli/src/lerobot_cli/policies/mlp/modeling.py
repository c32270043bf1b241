"""``MLPPolicy``: behaviour cloning of one action frame from the state vectors, nothing else.

The smallest real policy: it has the same protocol as ACT (``forward`` → loss + metrics, ``select_action``,
``get_optim_params``, ``_fsdp_wrap_modules``), trains in seconds on CPU, and is deterministic with
``dropout=0``, which makes it the model of choice for engine tests (DDP/FSDP equivalence, resume). Camera
inputs are ignored: it reads ``STATE`` and ``ENV`` features only.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lerobot_cli.features import FeatureType
from lerobot_cli.policies.mlp.config import MLPConfig

ACTION = "action"
ACTION_IS_PAD = "action_is_pad"


class MLPBlock(nn.Module):
    """Pre-norm residual block; the FSDP wrap unit of this policy."""

    def __init__(self, dim: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.linear = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.dropout(F.gelu(self.linear(self.norm(x))))


class MLPPolicy(nn.Module):
    name: ClassVar[str] = "mlp"
    config_class: ClassVar[type[MLPConfig]] = MLPConfig
    # lerobot-parallel's own reading of a bare model (build_plan without defaults); the spec is the source.
    _fsdp_wrap_modules: ClassVar[list[str]] = list(MLPConfig.spec.wrap_units)

    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        self.config = config
        self.input_keys = [
            key for key, f in config.input_features.items() if f.type in (FeatureType.STATE, FeatureType.ENV)
        ]
        if not self.input_keys:
            raise ValueError(
                "the mlp policy needs observation.state or observation.environment_state among its inputs; "
                f"got {sorted(config.input_features) or 'none'}"
            )
        if config.action_feature is None:
            raise ValueError(f"the mlp policy needs an 'action' output; got {sorted(config.output_features)}")
        in_dim = sum(math.prod(config.input_features[k].shape) for k in self.input_keys)
        self.input_proj = nn.Linear(in_dim, config.hidden_dim)
        self.blocks = nn.ModuleList(
            MLPBlock(config.hidden_dim, config.dropout) for _ in range(config.n_blocks)
        )
        self.norm = nn.LayerNorm(config.hidden_dim)
        self.action_head = nn.Linear(config.hidden_dim, config.action_feature.shape[0])

    def get_optim_params(self) -> list[dict[str, Any]]:
        return [{"params": [p for p in self.parameters() if p.requires_grad]}]

    def reset(self) -> None:
        """Stateless between steps; present for the policy protocol."""

    def _predict(self, batch: dict[str, Any]) -> Tensor:
        x = torch.cat([batch[k].flatten(1) for k in self.input_keys], dim=-1)
        x = self.input_proj(x.to(self.input_proj.weight.dtype))
        for block in self.blocks:
            x = block(x)
        return self.action_head(self.norm(x))

    def forward(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        """MSE against the current action frame (index 0 when the batch carries a chunk)."""
        target = batch[ACTION]
        valid = None
        if target.dim() == 3:
            target = target[:, 0]
            if ACTION_IS_PAD in batch:
                valid = ~batch[ACTION_IS_PAD][:, 0].to(torch.bool)
        error = F.mse_loss(self._predict(batch), target.to(self.action_head.weight.dtype), reduction="none")
        if valid is not None:
            error = error * valid.unsqueeze(-1)
        loss = error.mean()
        return loss, {"mse_loss": loss.detach()}  # a tensor: no host sync per step (read at log steps)

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Any]) -> Tensor:
        """``(B, 1, A)``: a chunk of one, so callers can treat every policy alike."""
        self.eval()
        return self._predict(batch).unsqueeze(1)

    @torch.no_grad()
    def select_action(self, batch: dict[str, Any]) -> Tensor:
        """Through ``predict_action_chunk``, as every chunking policy's: under FSDP2 that is the registered
        entry point that gathers the root's parameters (``lerobot_parallel.sharding``)."""
        return self.predict_action_chunk(batch)[:, 0]
