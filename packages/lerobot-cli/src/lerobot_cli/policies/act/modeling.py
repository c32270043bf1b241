"""``ACTPolicy``: the trainable ACT module behind ``--policy.type=act``.

It works on batches that the pre-processor already normalised (as in current LeRobot): ``forward``
returns the training loss, ``predict_action_chunk`` / ``select_action`` return normalised actions for the
post-processor to map back. The parameter tree lives under ``model`` so that ``state_dict`` keys equal
LeRobot's (``model.encoder.layers.0.self_attn.in_proj_weight``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lerobot_cli.policies.act.config import ACTConfig
from lerobot_cli.policies.act.ensemble import ACTTemporalEnsembler
from lerobot_cli.policies.act.model import ACT, ACTION, ACTION_IS_PAD, OBS_IMAGES


class ACTPolicy(nn.Module):
    name: ClassVar[str] = "act"
    config_class: ClassVar[type[ACTConfig]] = ACTConfig
    # lerobot-parallel's own reading of a bare model (build_plan without defaults); the spec is the source.
    _fsdp_wrap_modules: ClassVar[list[str]] = list(ACTConfig.spec.wrap_units)

    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        config.validate_features()
        self.config = config
        self.model = ACT(config)
        self.temporal_ensembler = (
            ACTTemporalEnsembler(config.temporal_ensemble_coeff, config.chunk_size)
            if config.temporal_ensemble_coeff is not None
            else None
        )
        self.reset()

    def get_optim_params(self) -> list[dict[str, Any]]:
        """Parameter groups: the backbone at ``optimizer_lr_backbone``, the rest at the optimizer's lr."""
        backbone, rest = [], []
        for name, param in self.named_parameters():
            if param.requires_grad:
                (backbone if name.startswith("model.backbone") else rest).append(param)
        groups: list[dict[str, Any]] = [{"params": rest}]
        if backbone:
            groups.append({"params": backbone, "lr": self.config.optimizer_lr_backbone})
        return groups

    def reset(self) -> None:
        """Drop queued or ensembled actions; call when an episode starts."""
        if self.temporal_ensembler is not None:
            self.temporal_ensembler.reset()
        self._action_queue: deque[Tensor] = deque(maxlen=self.config.n_action_steps)

    def _with_image_list(self, batch: dict[str, Any]) -> dict[str, Any]:
        if not self.config.image_features:
            return batch
        missing = [key for key in self.config.image_features if key not in batch]
        if missing:
            raise KeyError(f"ACT batch lacks camera(s) {missing}; it has {sorted(batch)}")
        return {**batch, OBS_IMAGES: [batch[key] for key in self.config.image_features]}

    def forward(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor | float]]:
        """L1 over the non-padded action steps, plus ``kl_weight`` × KL(latent ‖ N(0, I)) with the VAE."""
        actions_hat, (mu, log_sigma_x2) = self.model(self._with_image_list(batch))
        error = F.l1_loss(actions_hat, batch[ACTION], reduction="none")
        if ACTION_IS_PAD in batch:
            # Steps past the episode end are padding (repeated last frame): they must not teach anything,
            # and (as in LeRobot 0.6) they do not dilute the mean either.
            valid = ~batch[ACTION_IS_PAD].to(torch.bool).unsqueeze(-1)
            l1_loss = (error * valid).sum() / (valid.sum() * error.shape[-1]).clamp_min(1)
        else:
            l1_loss = error.mean()
        # The parts are detached 0-d tensors, not LeRobot's .item() floats: a float read here would make
        # every training step wait for the device; the loop reads them at log steps only.
        if (
            mu is None and self.config.use_vae
        ):  # eval mode: the encoder did not run, so there is no KL to report
            return l1_loss, {"l1_loss": l1_loss.detach()}
        if mu is None:
            return l1_loss, {"l1_loss": l1_loss.detach(), "kld_loss": 0.0}
        # KL per latent dimension, summed over dimensions, averaged over the batch.
        kld_loss = (-0.5 * (1 + log_sigma_x2 - mu.pow(2) - log_sigma_x2.exp())).sum(-1).mean()
        loss = l1_loss + self.config.kl_weight * kld_loss
        return loss, {"l1_loss": l1_loss.detach(), "kld_loss": kld_loss.detach()}

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Any]) -> Tensor:
        """``(B, chunk_size, A)`` normalised actions; puts the policy in eval mode (zero latent)."""
        self.eval()
        return self.model(self._with_image_list(batch))[0]

    @torch.no_grad()
    def select_action(self, batch: dict[str, Any]) -> Tensor:
        """The ``(B, A)`` action for this step: from the queue (refilled with ``n_action_steps`` of a
        fresh chunk when empty) or, with ``temporal_ensemble_coeff``, from the ensemble."""
        self.eval()
        if self.temporal_ensembler is not None:
            return self.temporal_ensembler.update(self.predict_action_chunk(batch))
        if not self._action_queue:
            chunk = self.predict_action_chunk(batch)[:, : self.config.n_action_steps]
            self._action_queue.extend(chunk.transpose(0, 1))
        return self._action_queue.popleft()
