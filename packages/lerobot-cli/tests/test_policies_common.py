"""policies/common: the helpers pi0, pi05 and SmolVLA share (flow draws, Euler loop, masks, the newline
step's registry names, the AdamW/cosine presets), checked on their own."""

from __future__ import annotations

import pytest
import torch
from lerobot_cli.optim.config import OptimizerConfig, SchedulerConfig
from lerobot_cli.policies.common.flow_matching import (
    draw_noise_and_time,
    euler_integrate,
    sample_beta_time,
    sample_flow_noise,
    sinusoidal_time_embedding,
)
from lerobot_cli.policies.common.masks import attention_mask_2d
from lerobot_cli.policies.common.prompts import NewLineTaskStep
from lerobot_cli.policies.pi0.config import PI0Config
from lerobot_cli.policies.pi0.prompts import Pi0NewLineStep
from lerobot_cli.policies.pi05.config import PI05Config
from lerobot_cli.policies.smolvla.config import SmolVLAConfig
from lerobot_cli.policies.smolvla.processors import SmolVLANewLineStep
from lerobot_cli.processors.steps import STEP_REGISTRY


def _time(batch: int, device: torch.device) -> torch.Tensor:
    return sample_beta_time(batch, device, alpha=1.5, beta=1.0, scale=0.999, offset=0.001)


def _draw(index: list[int] | None, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    actions = torch.zeros(len(index or [0, 0]), 3, 2)
    batch = {} if index is None else {"index": torch.tensor(index)}
    return draw_noise_and_time(batch, actions, sample_flow_noise, _time)


def test_a_samples_draw_depends_on_its_index_not_its_place_in_the_batch():
    """What makes every DDP/FSDP split of a global batch compute one process's loss."""
    noise, time = _draw([3, 7, 11])
    for position, index in enumerate([3, 7, 11]):
        alone_noise, alone_time = _draw([index])
        assert torch.equal(noise[position], alone_noise[0]) and torch.equal(time[position], alone_time[0])
    swapped_noise, _ = _draw([11, 3, 7])
    assert torch.equal(swapped_noise[0], noise[2])
    assert not torch.equal(noise[0], noise[1])
    assert not torch.equal(_draw([3], seed=1)[0], _draw([3], seed=0)[0])  # the global RNG still counts


def test_without_an_index_the_draws_are_the_global_rngs():
    noise, time = _draw(None)
    torch.manual_seed(0)
    assert torch.equal(noise, sample_flow_noise((2, 3, 2), torch.device("cpu")))
    assert torch.equal(time, _time(2, torch.device("cpu")))
    assert ((time > 0.001) & (time <= 1.0)).all() and time.dtype == torch.float32


def test_euler_integrate_steps_from_one_down_to_zero():
    seen: list[float] = []

    def velocity(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        assert t.shape == (2,) and t.dtype == torch.float32
        seen.append(float(t[0]))
        return torch.ones_like(x_t)

    out = euler_integrate(torch.full((2, 3), 5.0), 4, velocity)
    assert seen == [1.0, 0.75, 0.5, 0.25]
    assert torch.allclose(out, torch.full((2, 3), 4.0))  # noise - velocity: the t=0 end


def test_time_embedding_is_sine_then_cosine_in_float64():
    emb = sinusoidal_time_embedding(torch.tensor([0.0, 0.5]), 8, 4e-3, 4.0)
    assert emb.shape == (2, 8) and emb.dtype == torch.float64
    assert torch.equal(emb[0], torch.tensor([0.0] * 4 + [1.0] * 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="even"):
        sinusoidal_time_embedding(torch.tensor([0.5]), 7, 4e-3, 4.0)


def test_block_mask_sees_earlier_blocks_and_real_tokens_only():
    pads = torch.tensor([[True, True, False, True, True]])
    starts = torch.tensor([[0, 0, 0, 1, 1]])
    mask = attention_mask_2d(pads, starts)[0]
    assert mask[0].tolist() == [True, True, False, False, False]  # the prefix never sees later blocks
    assert mask[3].tolist() == [True, True, False, True, False]
    assert mask[4].tolist() == [True, True, False, True, True]


def test_newline_steps_keep_lerobots_registry_names():
    """Saved policy_preprocessor.json files name these; the shared rule itself is never a step name."""
    assert STEP_REGISTRY["pi0_new_line_processor"] is Pi0NewLineStep
    assert STEP_REGISTRY["smolvla_new_line_processor"] is SmolVLANewLineStep
    assert NewLineTaskStep not in STEP_REGISTRY.values()
    for step in (Pi0NewLineStep(), SmolVLANewLineStep()):
        assert step({"task": ["pick", "place\n"]})["task"] == ["pick\n", "place\n"]
        assert step({"task": 3}) == {"task": 3}


@pytest.mark.parametrize(
    ("config", "weight_decay", "clip", "lr"),
    [
        (PI0Config(), 0.01, 1.0, 2.5e-5),
        (PI05Config(), 0.01, 1.0, 2.5e-5),
        (SmolVLAConfig(), 1e-10, 10.0, 1e-4),
    ],
)
def test_presets_are_adamw_and_cosine_decay_from_each_policys_fields(config, weight_decay, clip, lr):
    assert config.optimizer_preset() == OptimizerConfig(
        type="adamw", lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay, grad_clip_norm=clip
    )
    assert config.scheduler_preset() == SchedulerConfig(
        type="cosine_decay_with_warmup",
        num_warmup_steps=1000,
        num_decay_steps=30000,
        peak_lr=lr,
        decay_lr=2.5e-6,
    )
