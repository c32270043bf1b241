"""The live training objects a checkpoint is written from and restored into; torch-free.

A trainer has one model, optimizer, scheduler and loss scaler, and passes the same four to
:func:`~lerobot_ckpt.save_checkpoint` and :func:`~lerobot_ckpt.load_checkpoint`. They travel as one
value, built once, so the two calls name the same objects by construction and each signature lists
what is particular to it (the step, the sampler and loop state, the pretrained-files callback, the
PEFT selection) rather than the four objects again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from attrs import define

if TYPE_CHECKING:
    import torch
    from torch import nn

    from lerobot_ckpt.state.scheduler_scaler import Stateful


@define(frozen=True, kw_only=True, eq=False)
class TrainingObjects:
    """What a checkpoint saves and a resume restores; any of them may be ``None`` (not saved / not restored).

    ``model`` may be wrapped (DDP, ``torch.compile``) or ``fully_shard``-ed; a save also takes a plain
    state dict, a load needs the module (and so does ``ema``). ``scheduler`` and ``scaler`` are anything with
    ``state_dict()``/``load_state_dict()``; a disabled ``GradScaler`` counts as no scaler.
    """

    model: nn.Module | Mapping[str, torch.Tensor] | None = None
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Stateful | None = None
    scaler: Stateful | None = None
    # An EMA shadow: {parameter FQN: tensor}, the trainable parameters only (every name of a tied one),
    # aliasing the shadow's storage (DTensor shards of the same placements under FSDP2/HSDP). Saved
    # as ``pretrained_model_ema/`` (the model's state with these tensors in place of the live ones),
    # loaded back into these tensors in place.
    ema: Mapping[str, torch.Tensor] | None = None
