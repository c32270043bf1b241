"""A tiny pi0 and one fixed batch, shared by the multi-process check and the test comparing with it."""

from __future__ import annotations

import torch
from lerobot_cli.features import FeatureType, PolicyFeature
from lerobot_cli.policies.pi0.config import PI0Config
from lerobot_cli.policies.pi0.modeling import PI0Policy


def tiny_pi0() -> PI0Policy:
    config = PI0Config(
        paligemma_variant="gemma_tiny",
        action_expert_variant="gemma_tiny",
        vision_variant="tiny",
        image_resolution=(56, 56),
        chunk_size=4,
        n_action_steps=4,
        tokenizer_max_length=8,
        input_features={
            "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 56, 56)),
            "observation.state": PolicyFeature(FeatureType.STATE, (6,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (6,))},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return PI0Policy(config)


def pi0_batch() -> tuple[dict, torch.Tensor, torch.Tensor]:
    """(batch, noise, time) for ``PI0Policy.forward``."""
    g = torch.Generator().manual_seed(1)
    batch = {
        "observation.images.top": torch.rand(4, 3, 56, 56, generator=g),
        "observation.state": torch.randn(4, 6, generator=g),
        "action": torch.randn(4, 4, 6, generator=g),
        "observation.language.tokens": torch.randint(0, 300, (4, 8), generator=g),
        "observation.language.attention_mask": torch.arange(8)[None] < torch.tensor([[8], [5], [3], [8]]),
    }
    return batch, torch.randn(4, 4, 32, generator=g), torch.rand(4, generator=g)
