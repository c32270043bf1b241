"""How a FastWAM policy holds its frozen Wan2.2 VAE and UMT5 text encoder: beside its module tree, not in it.

LeRobot 0.6.1's ``FastWAM`` sets ``vae`` and ``text_encoder`` with ``object.__setattr__`` so that
``nn.Module`` does not register them: they are in no ``state_dict()`` (checkpoints hold only the trainable
policy, the frozen parts come from the Wan2.2 repository), no ``parameters()`` (so no optimizer, no DDP
gradient sync) and no ``named_modules()`` (so no FSDP unit or wrap-policy walk ever sees them).
``FrozenParts`` gets the same by being a plain object: an ``nn.Module`` attribute that is neither a
module, a parameter nor a buffer is kept as an ordinary attribute.

What differs from LeRobot, and why:

- device moves are explicit (``FrozenParts.to``) instead of riding on the policy's ``_apply``: our sharded
  runs build the policy on the meta device and materialise it with ``to_empty`` (an ``_apply``), which
  would empty the frozen weights too, and FSDP moves the parameters it manages without ``_apply`` at all.
  The wiring puts the frozen parts on the rank's device once, where it builds them;
- ``copy.deepcopy`` of the policy (an EMA shadow) shares them instead of copying 11 GB of UMT5: they are
  read-only.
"""

from __future__ import annotations

import torch

from lerobot_cli.policies.fastwam.text import PromptEncoder
from lerobot_cli.policies.fastwam.vae import WanVAE


class FrozenParts:
    """The frozen VAE and, unless the task contexts are precomputed, the prompt encoder of one policy."""

    def __init__(self, vae: WanVAE, prompts: PromptEncoder | None = None) -> None:
        self.vae = vae
        self.prompts = prompts

    def modules(self) -> list[torch.nn.Module]:
        return [self.vae] if self.prompts is None else [self.vae, self.prompts.encoder]

    def to(self, device: str | torch.device) -> FrozenParts:
        for module in self.modules():
            module.to(device)
        return self

    def nbytes(self) -> int:
        """Bytes of their parameters and buffers, as held now (per rank: every rank holds a full copy)."""
        return sum(
            t.numel() * t.element_size() for m in self.modules() for t in (*m.parameters(), *m.buffers())
        )

    def __deepcopy__(self, memo: dict) -> FrozenParts:
        return self
