"""A tiny FastWAM (the guide's demo flags) and fixed live batches, shared by the multi-process inference
check (``fastwam_inference.py``) and the test comparing it with one process (test_fastwam_inference.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from lerobot_cli.features import FeatureType, PolicyFeature
from lerobot_cli.policies.fastwam.config import FastWAMConfig
from lerobot_cli.policies.fastwam.modeling import FastWAMPolicy

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "data" / "tokenizers" / "demo_bytes"
CAMERA = "observation.images.top"
ACTION_DIM, STATE_DIM, HORIZON, N_ACTION_STEPS = 2, 2, 8, 3
TASKS = ["reach the red target", "push the blue block", "reach the green target"]


def tiny_fastwam(inference_seed: int | None = 42) -> FastWAMPolicy:
    """The guide's tiny FastWAM (2 ``MoTLayer`` units), float32, 3 Euler steps; every constant-built parameter
    (norm scales, zero biases, Wan's zero heads) made random, so no action rests on a zero weight."""
    config = FastWAMConfig(
        variant="tiny",
        torch_dtype="float32",
        tokenizer_model_id=str(TOKENIZER),
        action_dim=ACTION_DIM,
        proprio_dim=STATE_DIM,
        num_video_frames=5,
        action_video_freq_ratio=1,
        action_horizon=HORIZON,
        n_action_steps=N_ACTION_STEPS,
        image_size=(32, 32),
        num_inference_steps=3,
        inference_seed=inference_seed,
        input_features={
            CAMERA: PolicyFeature(FeatureType.VISUAL, (3, 32, 32)),
            "observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        policy = FastWAMPolicy(config)
        with torch.no_grad():
            for p in policy.parameters():
                if bool((p == p.flatten()[0]).all()):
                    p.add_(0.1 * torch.randn_like(p))
    return policy


def live_batch(seed: int, size: int = 2) -> dict:
    """One inference step's observations (the camera at another size: the policy resizes it)."""
    g = torch.Generator().manual_seed(seed)
    return {
        CAMERA: torch.rand(size, 3, 40, 40, generator=g),
        "observation.state": torch.randn(size, STATE_DIM, generator=g),
        "task": [TASKS[(seed + i) % len(TASKS)] for i in range(size)],
    }


def training_batch(seed: int, size: int = 2) -> dict:
    """A training batch (5-frame video, 8-step actions) for one forward and backward."""
    g = torch.Generator().manual_seed(seed)
    return {
        CAMERA: torch.rand(size, 5, 3, 40, 40, generator=g),
        "observation.state": torch.randn(size, 5, STATE_DIM, generator=g),
        "action": torch.randn(size, HORIZON, ACTION_DIM, generator=g),
        "action_is_pad": torch.zeros(size, HORIZON, dtype=torch.bool),
        "task": [TASKS[(seed + i) % len(TASKS)] for i in range(size)],
    }
