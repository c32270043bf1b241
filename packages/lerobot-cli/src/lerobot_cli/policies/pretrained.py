"""Load any pretrained policy directory, ours or LeRobot's, plain or PEFT; and save plain ones.

The plain files live in :mod:`lerobot_cli.policies.weights`; a PEFT directory (``adapter_config.json``)
is its recorded base plus the adapter (:mod:`lerobot_cli.peft.adapters`). This module sits above both,
so neither imports the other back.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from lerobot_cli.peft.basefile import is_adapter_dir
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.weights import (
    MODEL_NAME,
    build_policy,
    dedupe_shared_tensors,
    load_policy,
    load_weights,
    save_pretrained,
    save_state_dict,
    without_init_only_fields,
)

__all__ = [
    "MODEL_NAME",
    "build_policy",
    "dedupe_shared_tensors",
    "load_policy",
    "load_pretrained",
    "load_weights",
    "save_pretrained",
    "save_state_dict",
    "without_init_only_fields",
]


def load_pretrained(
    directory: str | Path,
    *,
    config: PolicyConfig | None = None,
    device: str | torch.device = "cpu",
    strict: bool = True,
) -> tuple[PolicyConfig, nn.Module]:
    """Build the policy saved in ``directory`` (ours or LeRobot's) and load its weights.

    A PEFT directory (``adapter_config.json``) gives a ``peft.PeftModel``: the base policy recorded
    there, loaded from its path or Hub id, with the adapter applied.

    ``config`` overrides the directory's ``config.json`` (e.g. with CLI flags applied). The policy comes
    back in eval mode, like LeRobot's ``from_pretrained``; call ``.train()`` to fine-tune it.
    """
    directory = Path(directory)
    if is_adapter_dir(directory):  # a PEFT run's output: its recorded base + the adapter
        from lerobot_cli.peft.adapters import load_adapter_policy

        config, model = load_adapter_policy(directory, config=config)
        return config, model.to(device).eval()
    return load_policy(directory, config=config, device=device, strict=strict)
