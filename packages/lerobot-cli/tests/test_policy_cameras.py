"""ACT and Diffusion take their cameras as LeRobot does: every VISUAL input feature
(``config.image_features``), in the config's order, whatever the keys are called.

A camera of a LeRobot dataset is any ``image``/``video`` feature; ``observation.wrist_rgb`` and
``observation.top`` are as valid as ``observation.images.top``. Selecting by a key prefix such as
``observation.image`` would drop such cameras and take a tensor that only looks like one (the decoy below).
``tools/interop/{act,diffusion}_lerobot_interop.py`` compare the outputs with LeRobot's on such cameras.
"""

from __future__ import annotations

import torch
from lerobot_cli.features import PolicyFeature
from lerobot_cli.policies.act.config import ACTConfig
from lerobot_cli.policies.act.modeling import ACTPolicy
from lerobot_cli.policies.diffusion.config import DiffusionConfig
from lerobot_cli.policies.diffusion.modeling import DiffusionPolicy

B = 2
STATE = {"observation.state": PolicyFeature("STATE", (4,))}
ACTION = {"action": PolicyFeature("ACTION", (2,))}
DECOY = "observation.images.decoy"  # in the batch, named like a camera, but not an input feature
# ACT takes cameras of different sizes; Diffusion needs one size (LeRobot's rule).
ACT_CAMERAS = {"observation.wrist_rgb": (3, 32, 48), "observation.top": (3, 64, 64)}
DIFFUSION_CAMERAS = {"observation.wrist_rgb": (3, 40, 48), "observation.top": (3, 40, 48)}
ACT_SMALL = {
    "pretrained_backbone_weights": None,
    "chunk_size": 4,
    "n_action_steps": 4,
    "dim_model": 32,
    "n_heads": 4,
    "dim_feedforward": 64,
    "n_encoder_layers": 1,
    "n_decoder_layers": 1,
    "n_vae_encoder_layers": 1,
    "latent_dim": 8,
}
DIFFUSION_SMALL = {
    "down_dims": (16, 32),
    "horizon": 8,
    "n_action_steps": 4,
    "spatial_softmax_num_keypoints": 4,
    "diffusion_step_embed_dim": 8,
    "num_train_timesteps": 10,
    "pretrained_backbone_weights": None,
    "use_separate_rgb_encoder_per_camera": True,
}


def _features(cameras: dict[str, tuple[int, ...]]) -> dict[str, PolicyFeature]:
    return {**STATE, **{key: PolicyFeature("VISUAL", shape) for key, shape in cameras.items()}}


def _batch(config, steps: tuple[int, ...], horizon: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    batch = {
        key: (torch.rand if f.type.value == "VISUAL" else torch.randn)((B, *steps, *f.shape), generator=g)
        for key, f in config.input_features.items()
    }
    batch["action"] = torch.randn(B, horizon, 2, generator=g)
    batch["action_is_pad"] = torch.zeros(B, horizon, dtype=torch.bool)
    batch[DECOY] = torch.rand(B, *steps, 3, 32, 48, generator=g)
    return batch


def _each_camera_matters_and_the_decoy_does_not(loss, batch: dict[str, torch.Tensor], cameras) -> None:
    base = loss(batch)
    for key in cameras:
        assert not torch.equal(loss({**batch, key: torch.rand_like(batch[key])}), base), f"{key} was not read"
    assert torch.equal(loss({**batch, DECOY: torch.rand_like(batch[DECOY])}), base), "the decoy was read"


def test_act_reads_every_visual_feature_in_config_order_whatever_its_name():
    torch.manual_seed(0)
    config = ACTConfig(input_features=_features(ACT_CAMERAS), output_features=ACTION, **ACT_SMALL)
    assert list(config.image_features) == ["observation.wrist_rgb", "observation.top"]
    policy = ACTPolicy(
        config
    ).eval()  # eval: no VAE sample, no dropout, so the loss is a function of the batch
    batch = _batch(config, (), config.chunk_size)
    images = policy._with_image_list(batch)["observation.images"]
    assert [t.data_ptr() for t in images] == [
        batch[k].data_ptr() for k in ACT_CAMERAS
    ]  # config order, sizes kept
    with torch.no_grad():
        _each_camera_matters_and_the_decoy_does_not(lambda b: policy(b)[0], batch, ACT_CAMERAS)
        chunk = policy.predict_action_chunk({k: v for k, v in batch.items() if k != "action"})
    assert chunk.shape == (B, config.chunk_size, 2)


def test_diffusion_reads_every_visual_feature_in_config_order_whatever_its_name():
    torch.manual_seed(0)
    config = DiffusionConfig(
        input_features=_features(DIFFUSION_CAMERAS), output_features=ACTION, **DIFFUSION_SMALL
    )
    assert list(config.image_features) == ["observation.wrist_rgb", "observation.top"]
    policy = DiffusionPolicy(config).eval()
    batch = _batch(config, (config.n_obs_steps,), config.horizon)
    stacked = policy._with_image_stack(batch, add_time=False)["observation.images"]  # (B, S, camera, C, H, W)
    for i, key in enumerate(
        DIFFUSION_CAMERAS
    ):  # one RGB encoder per camera: the order decides which reads which
        assert torch.equal(stacked[:, :, i], batch[key])
    noise = torch.randn(B, config.horizon, 2, generator=torch.Generator().manual_seed(1))
    timesteps = torch.tensor([3, 7])
    with torch.no_grad():
        _each_camera_matters_and_the_decoy_does_not(
            lambda b: policy(b, noise=noise, timesteps=timesteps)[0], batch, DIFFUSION_CAMERAS
        )
