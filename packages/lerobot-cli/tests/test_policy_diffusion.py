"""Diffusion Policy: LeRobot 0.6.1's config fields/defaults/rules, the full-size key and parameter counts,
the noise schedulers against diffusers' numbers, the model's loss/sampling semantics, save/load, and the
dataset's observation history and action horizon (copy-padding with ``*_is_pad``).

The bitwise comparisons with LeRobot itself (same weights, batch, noise and timesteps, both ways) are in
tools/interop/diffusion_lerobot_interop.py, which needs LeRobot's own environment.
"""

from __future__ import annotations

import json
import subprocess
import sys

import attrs
import pytest
import torch
from lerobot_cli.features import NormalizationMode, PolicyFeature
from lerobot_cli.policies import config_class
from lerobot_cli.policies.diffusion.config import DiffusionConfig

DEMO = "data/lerobot/demo_reach"

# LeRobot 0.6.1's DiffusionConfig defaults (configuration_diffusion.py).
LEROBOT_DEFAULTS = {
    "n_obs_steps": 2,
    "horizon": 64,
    "n_action_steps": 32,
    "drop_n_last_frames": 7,
    "vision_backbone": "resnet18",
    "resize_shape": None,
    "crop_ratio": 1.0,
    "crop_shape": None,
    "crop_is_random": True,
    "pretrained_backbone_weights": "ResNet18_Weights.IMAGENET1K_V1",
    "use_group_norm": False,
    "spatial_softmax_num_keypoints": 32,
    "use_separate_rgb_encoder_per_camera": True,
    "down_dims": (512, 1024, 2048),
    "kernel_size": 5,
    "n_groups": 8,
    "diffusion_step_embed_dim": 128,
    "use_film_scale_modulation": True,
    "gradient_checkpointing": False,
    "noise_scheduler_type": "DDPM",
    "num_train_timesteps": 100,
    "beta_schedule": "squaredcos_cap_v2",
    "beta_start": 0.0001,
    "beta_end": 0.02,
    "prediction_type": "epsilon",
    "clip_sample": True,
    "clip_sample_range": 1.0,
    "num_inference_steps": None,
    "compile_model": False,
    "compile_mode": "reduce-overhead",
    "do_mask_loss_for_padding": False,
    "optimizer_lr": 1e-4,
    "optimizer_betas": (0.95, 0.999),
    "optimizer_eps": 1e-8,
    "optimizer_weight_decay": 1e-6,
    "scheduler_name": "cosine",
    "scheduler_warmup_steps": 500,
}
# The keys of the config.json LeRobot 0.6.1 writes for a DiffusionPolicy.
LEROBOT_CONFIG_KEYS = [
    "type",
    "n_obs_steps",
    "input_features",
    "output_features",
    "device",
    "use_amp",
    "use_peft",
    "push_to_hub",
    "repo_id",
    "private",
    "tags",
    "license",
    "pretrained_path",
    "pretrained_revision",
    "horizon",
    "n_action_steps",
    "normalization_mapping",
    "drop_n_last_frames",
    "vision_backbone",
    "resize_shape",
    "crop_ratio",
    "crop_shape",
    "crop_is_random",
    "pretrained_backbone_weights",
    "use_group_norm",
    "spatial_softmax_num_keypoints",
    "use_separate_rgb_encoder_per_camera",
    "down_dims",
    "kernel_size",
    "n_groups",
    "diffusion_step_embed_dim",
    "use_film_scale_modulation",
    "gradient_checkpointing",
    "noise_scheduler_type",
    "num_train_timesteps",
    "beta_schedule",
    "beta_start",
    "beta_end",
    "prediction_type",
    "clip_sample",
    "clip_sample_range",
    "num_inference_steps",
    "compile_model",
    "compile_mode",
    "do_mask_loss_for_padding",
    "optimizer_lr",
    "optimizer_betas",
    "optimizer_eps",
    "optimizer_weight_decay",
    "scheduler_name",
    "scheduler_warmup_steps",
]
# LeRobot 0.6.1's full default DiffusionPolicy (state 2, one 3x96x96 camera, action 2; PushT's features),
# measured in its environment: `diffusion_lerobot_interop.py lerobot-sizes`.
LEROBOT_FULL_KEYS, LEROBOT_FULL_PARAMS = 273, 262_709_026

FEATURES = {
    "observation.state": PolicyFeature("STATE", (4,)),
    "observation.environment_state": PolicyFeature("ENV", (3,)),
    "observation.images.top": PolicyFeature("VISUAL", (3, 40, 48)),
}  # a 2x2 feature map
ACTION = {"action": PolicyFeature("ACTION", (2,))}
TINY = {
    "down_dims": (16, 32),
    "horizon": 8,
    "n_action_steps": 4,
    "spatial_softmax_num_keypoints": 4,
    "diffusion_step_embed_dim": 8,
    "num_train_timesteps": 10,
    "pretrained_backbone_weights": None,
}


def tiny_config(**overrides) -> DiffusionConfig:
    return DiffusionConfig(
        input_features=overrides.pop("input_features", FEATURES),
        output_features=ACTION,
        **{**TINY, **overrides},
    )


def tiny_batch(cfg: DiffusionConfig, b: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    s = cfg.n_obs_steps
    batch = {
        key: (
            torch.rand((b, s, *f.shape), generator=g)
            if f.type == "VISUAL"
            else torch.randn((b, s, *f.shape), generator=g)
        )
        for key, f in cfg.input_features.items()
    }
    batch["action"] = torch.randn((b, cfg.horizon, 2), generator=g)
    batch["action_is_pad"] = torch.zeros(b, cfg.horizon, dtype=torch.bool)
    return batch


# ---------------------------------------------------------------- config


def test_defaults_and_field_set_equal_lerobot():
    cfg = DiffusionConfig()
    assert {k: getattr(cfg, k) for k in LEROBOT_DEFAULTS} == LEROBOT_DEFAULTS
    assert cfg.normalization_mapping == {
        "VISUAL": NormalizationMode.MEAN_STD,
        "STATE": NormalizationMode.MIN_MAX,
        "ACTION": NormalizationMode.MIN_MAX,
    }
    names = {a.name for a in attrs.fields(DiffusionConfig)}
    assert names == set(LEROBOT_CONFIG_KEYS) - {
        "type"
    }  # an extra field would make LeRobot's parser refuse the file


def test_config_json_has_lerobot_keys_and_round_trips():
    from lerobot_cli.policies.serialization import policy_config_from_dict, policy_config_to_dict

    cfg = tiny_config(resize_shape=(20, 24), crop_ratio=0.5)
    data = json.loads(json.dumps(policy_config_to_dict(cfg)))
    assert data["type"] == "diffusion" and sorted(data) == sorted(
        LEROBOT_CONFIG_KEYS
    )  # (order is free in JSON)
    assert data["crop_shape"] == [10, 12] and data["down_dims"] == [16, 32]  # derived as LeRobot does
    assert policy_config_from_dict(data) == cfg


def test_registry_flags_presets_and_delta_indices():
    from lerobot_cli.cli.argv import split_argv
    from lerobot_cli.cli.build import build_train_config

    assert config_class("diffusion") is DiffusionConfig
    flags = split_argv(
        [
            "--policy.type=diffusion",
            "--dataset.repo_id=lerobot/demo_reach",
            "--policy.down_dims=[16,32]",
            "--policy.horizon=8",
            "--policy.n_action_steps=4",
            "--policy.pretrained_backbone_weights=null",
            "--policy.crop_shape=[30,30]",
        ]
    ).flags
    cfg = build_train_config(flags).config
    assert (cfg.policy.down_dims, cfg.policy.crop_shape, cfg.policy.pretrained_backbone_weights) == (
        (16, 32),
        (30, 30),
        None,
    )
    assert (
        cfg.optimizer.type,
        cfg.optimizer.lr,
        cfg.optimizer.betas,
        cfg.optimizer.eps,
        cfg.optimizer.weight_decay,
        cfg.optimizer.grad_clip_norm,
    ) == ("adam", 1e-4, (0.95, 0.999), 1e-8, 1e-6, 10.0)
    assert (cfg.scheduler.type, cfg.scheduler.num_warmup_steps, cfg.scheduler.decay_lr) == (
        "diffuser_cosine",
        500,
        0.0,
    )
    assert (
        DiffusionConfig(scheduler_name="constant_with_warmup").scheduler_preset().type
        == "constant_with_warmup"
    )
    d = DiffusionConfig(n_obs_steps=3, horizon=16, n_action_steps=8)
    assert d.observation_delta_indices == [-2, -1, 0]
    assert d.action_delta_indices == list(range(-2, 14))
    assert d.reward_delta_indices is None


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"vision_backbone": "vit_b"}, "--policy.vision_backbone: invalid choice 'vit_b'"),
        ({"prediction_type": "v_prediction"}, "--policy.prediction_type: invalid choice"),
        ({"noise_scheduler_type": "PNDM"}, "--policy.noise_scheduler_type: invalid choice"),
        ({"beta_schedule": "sigmoid"}, "--policy.beta_schedule: invalid choice"),
        ({"scheduler_name": "linear"}, "--policy.scheduler_name: invalid choice"),
        ({"resize_shape": (0, 10)}, "--policy.resize_shape must be two positive integers"),
        ({"crop_ratio": 0.0}, "--policy.crop_ratio must be in (0, 1]"),
        ({"crop_shape": (0, 84)}, "--policy.crop_shape must be two positive integers"),
        ({"horizon": 20}, "--policy.horizon (20) must be a multiple of 2**len(--policy.down_dims) = 8"),
        ({"n_action_steps": 64}, "--policy.n_action_steps (64) must be ≤ horizon - n_obs_steps + 1 = 63"),
        ({"use_group_norm": True}, "pass --policy.pretrained_backbone_weights=null"),
        ({"down_dims": ()}, "--policy.down_dims must be a non-empty list"),
        (
            {"down_dims": (12, 24, 48), "horizon": 8, "n_action_steps": 4},
            "multiples of --policy.n_groups (8)",
        ),
        (
            {"down_dims": (4, 8), "n_groups": 4, "horizon": 8, "n_action_steps": 4},
            "--policy.down_dims[0] must be a multiple of 8",
        ),
        ({"kernel_size": 4}, "--policy.kernel_size must be odd"),
        ({"diffusion_step_embed_dim": 7}, "--policy.diffusion_step_embed_dim must be an even integer"),
        (
            {"num_inference_steps": 101},
            "--policy.num_inference_steps (101) must be ≤ --policy.num_train_timesteps (100)",
        ),
        ({"num_inference_steps": 0}, "--policy.num_inference_steps must be an integer ≥ 1"),
        ({"drop_n_last_frames": -1}, "--policy.drop_n_last_frames must be an integer ≥ 0"),
        ({"beta_end": 1.5}, "--policy.beta_end must be in (0, 1)"),
        ({"clip_sample_range": 0.0}, "--policy.clip_sample_range must be > 0"),
        ({"compile_model": True}, "--accelerator.compile.enabled=true"),
        ({"optimizer_betas": (0.9,)}, "--policy.optimizer_betas must be two numbers"),
        ({"n_obs_steps": 0}, "--policy.n_obs_steps must be ≥ 1"),
        ({"horizon": 0}, "--policy.horizon must be an integer ≥ 1"),
    ],
)
def test_bad_values_name_the_flag_in_one_sentence(kwargs, needle):
    with pytest.raises(ValueError) as err:
        DiffusionConfig(**kwargs)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_resize_derives_crop_shape_as_lerobot():
    assert DiffusionConfig(resize_shape=(96, 96), crop_ratio=0.9).crop_shape == (86, 86)
    assert (
        DiffusionConfig(resize_shape=(96, 96), crop_shape=(50, 50)).crop_shape is None
    )  # ratio 1.0: no crop
    assert DiffusionConfig(crop_shape=(84, 84)).crop_shape == (84, 84)  # legacy crop-only


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"input_features": {"observation.state": PolicyFeature("STATE", (4,))}}, "at least one camera"),
        (
            {"input_features": {"observation.images.top": PolicyFeature("VISUAL", (3, 32, 32))}},
            "needs observation.state",
        ),
        (
            {"input_features": {**FEATURES, "observation.images.side": PolicyFeature("VISUAL", (3, 32, 48))}},
            "every camera at the same shape",
        ),
        ({"crop_shape": (50, 20)}, "does not fit inside observation.images.top (40x48)"),
    ],
)
def test_feature_rules(kwargs, needle):
    with pytest.raises(ValueError, match=None) as err:
        tiny_config(**kwargs).validate_features()
    assert needle in str(err.value)


def test_config_import_stays_torch_free():
    code = (
        "import sys; from lerobot_cli.policies import config_class; c = config_class('diffusion')(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ---------------------------------------------------------------- sizes and keys


def test_full_default_size_on_meta_equals_lerobot_counts():
    from lerobot_cli.policies.diffusion.modeling import DiffusionPolicy

    cfg = DiffusionConfig(
        input_features={
            "observation.state": PolicyFeature("STATE", (2,)),
            "observation.images.top": PolicyFeature("VISUAL", (3, 96, 96)),
        },
        output_features={"action": PolicyFeature("ACTION", (2,))},
        pretrained_backbone_weights=None,
    )
    with torch.device("meta"):
        policy = DiffusionPolicy(cfg)
    sd = policy.state_dict()
    assert len(sd) == LEROBOT_FULL_KEYS
    assert sum(p.numel() for p in policy.parameters()) == LEROBOT_FULL_PARAMS
    # LeRobot's names: a Sequential trunk with torchvision's children, trainable BN with its counter
    for key in (
        "diffusion.rgb_encoder.0.backbone.0.weight",
        "diffusion.rgb_encoder.0.backbone.1.running_var",
        "diffusion.rgb_encoder.0.backbone.1.num_batches_tracked",
        "diffusion.rgb_encoder.0.backbone.7.1.conv2.weight",
        "diffusion.rgb_encoder.0.backbone.5.0.downsample.1.weight",
        "diffusion.rgb_encoder.0.pool.pos_grid",
        "diffusion.rgb_encoder.0.pool.nets.weight",
        "diffusion.rgb_encoder.0.out.weight",
        "diffusion.unet.diffusion_step_encoder.1.weight",
        "diffusion.unet.down_modules.2.1.cond_encoder.1.weight",
        "diffusion.unet.down_modules.0.2.weight",
        "diffusion.unet.mid_modules.1.conv2.block.1.bias",
        "diffusion.unet.up_modules.1.0.residual_conv.weight",
        "diffusion.unet.up_modules.1.2.weight",
        "diffusion.unet.final_conv.0.block.0.weight",
        "diffusion.unet.final_conv.1.bias",
    ):
        assert key in sd, key
    assert tuple(sd["diffusion.unet.down_modules.2.1.cond_encoder.1.weight"].shape) == (
        4096,
        128 + 2 * (2 + 64),
    )
    assert tuple(sd["diffusion.rgb_encoder.0.pool.pos_grid"].shape) == (9, 2)  # 96 -> 3x3 feature map


def test_group_norm_and_shared_encoder_keys():
    from lerobot_cli.policies.diffusion.modeling import DiffusionPolicy

    two = {**FEATURES, "observation.images.side": PolicyFeature("VISUAL", (3, 40, 48))}
    sd = DiffusionPolicy(
        tiny_config(input_features=two, use_group_norm=True, use_separate_rgb_encoder_per_camera=False)
    ).state_dict()
    assert (
        "diffusion.rgb_encoder.backbone.1.weight" in sd
        and "diffusion.rgb_encoder.backbone.1.running_mean" not in sd
    )
    assert not any(".rgb_encoder.0." in k for k in sd)


# ---------------------------------------------------------------- schedulers


def test_betas_and_timesteps_equal_diffusers():
    from lerobot_cli.policies.diffusion.schedulers import DDIMScheduler, DDPMScheduler

    # diffusers 0.39's DDPMScheduler/DDIMScheduler values
    # (see diffusion_lerobot_interop.py lerobot-schedulers)
    ddpm = DDPMScheduler(num_train_timesteps=100, beta_schedule="squaredcos_cap_v2")
    got = [ddpm.alphas_cumprod[i].item() for i in (0, 10, 50, 99)]
    assert got == pytest.approx(
        [0.9993687272071838, 0.9667166471481323, 0.47826457023620605, 2.4285407107527135e-07],
        rel=1e-6,
        abs=1e-12,
    )
    ddim = DDIMScheduler(num_train_timesteps=100, beta_schedule="linear")
    assert [ddim.alphas_cumprod[i].item() for i in (0, 50, 99)] == pytest.approx(
        [0.9998999834060669, 0.7692912817001343, 0.3635632395744324], rel=1e-6
    )
    ddpm.set_timesteps(7)
    assert ddpm.timesteps.tolist() == [84, 70, 56, 42, 28, 14, 0]


def test_ddim_with_the_true_noise_recovers_the_clean_sample():
    from lerobot_cli.policies.diffusion.schedulers import DDIMScheduler

    for prediction in ("epsilon", "sample"):
        sched = DDIMScheduler(num_train_timesteps=50, clip_sample=False, prediction_type=prediction)
        x0, eps = torch.randn(2, 8, 3), torch.randn(2, 8, 3)
        sched.set_timesteps(5)
        t0 = int(sched.timesteps[0])
        sample = sched.add_noise(x0, eps, torch.full((2,), t0))
        for t in sched.timesteps.tolist():  # the oracle model: it knows x0 and hence the noise in the sample
            abar = sched.alphas_cumprod[t]
            true_eps = (sample - abar.sqrt() * x0) / (1 - abar).sqrt()
            sample = sched.step(true_eps if prediction == "epsilon" else x0, t, sample)
        torch.testing.assert_close(sample, x0, atol=1e-4, rtol=1e-4)


def test_ddpm_clips_the_predicted_sample_and_adds_noise_only_before_t0():
    from lerobot_cli.policies.diffusion.schedulers import DDPMScheduler

    sched = DDPMScheduler(num_train_timesteps=10, prediction_type="sample", clip_sample_range=0.5)
    sched.set_timesteps(10)
    x = torch.zeros(1, 4, 1)
    out = sched.step(torch.full((1, 4, 1), 3.0), 0, x)  # t=0: no noise, the clipped prediction
    torch.testing.assert_close(out, torch.full((1, 4, 1), 0.5))
    torch.manual_seed(0)
    a = sched.step(torch.zeros(1, 4, 1), 5, x)
    torch.manual_seed(0)
    assert torch.equal(a, sched.step(torch.zeros(1, 4, 1), 5, x))
    assert a.abs().sum() > 0


# ---------------------------------------------------------------- model


def test_loss_is_the_noise_mse_and_masking_excludes_padded_steps():
    from lerobot_cli.policies.diffusion.modeling import DiffusionPolicy

    torch.manual_seed(0)
    cfg = tiny_config()
    policy = DiffusionPolicy(cfg).train()
    batch = tiny_batch(cfg)
    noise, t = torch.randn(3, 8, 2), torch.tensor([0, 4, 9])
    loss, parts = policy(batch, noise=noise, timesteps=t)
    assert parts == {} and loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in policy.named_parameters() if p.grad is None]
    assert not missing, missing[:5]
    # deterministic given noise and timesteps (eval: batch norm uses running statistics)
    policy.eval()
    a, _ = policy(batch, noise=noise, timesteps=t)
    b, _ = policy(batch, noise=noise, timesteps=t)
    assert torch.equal(a, b)
    # the loss is the MSE between the U-Net's output on the noised trajectory and the noise; with
    # do_mask_loss_for_padding only the non-padded steps count
    batch["action_is_pad"][0, -3:] = True
    model = policy.diffusion
    with torch.no_grad():
        noisy = model.noise_scheduler.add_noise(batch["action"], noise, t)
        cond = model.global_conditioning(policy._with_image_stack(batch, add_time=False))
        err = (model.unet(noisy, t, global_cond=cond) - noise) ** 2
    torch.testing.assert_close(policy(batch, noise=noise, timesteps=t)[0], err.mean())
    masked = DiffusionPolicy(attrs.evolve(cfg, do_mask_loss_for_padding=True)).eval()
    masked.load_state_dict(policy.state_dict())
    valid = ~batch["action_is_pad"]
    torch.testing.assert_close(masked(batch, noise=noise, timesteps=t)[0], err[valid].mean())
    sample = DiffusionPolicy(attrs.evolve(cfg, prediction_type="sample")).eval()
    sample.load_state_dict(policy.state_dict())
    with torch.no_grad():
        err_x0 = (model.unet(noisy, t, global_cond=cond) - batch["action"]) ** 2
    torch.testing.assert_close(sample(batch, noise=noise, timesteps=t)[0], err_x0.mean())
    # every input conditions the U-Net (on a 1x1 feature map spatial softmax would make the camera constant)
    for key in FEATURES:
        changed = {**batch, key: torch.zeros_like(batch[key])}
        assert not torch.equal(policy(changed, noise=noise, timesteps=t)[0], a), key


def test_noise_follows_the_dataset_index_so_split_batches_draw_alike():
    from lerobot_cli.policies.diffusion.modeling import DiffusionPolicy

    torch.manual_seed(0)
    cfg = tiny_config(use_group_norm=True)  # no batch statistics: samples are independent
    policy = DiffusionPolicy(cfg).eval()
    batch = {**tiny_batch(cfg, b=4), "index": torch.tensor([7, 3, 11, 5])}
    halves = [{k: v[i : i + 2] for k, v in batch.items()} for i in (0, 2)]
    torch.manual_seed(5)
    whole, _ = policy(batch)
    parts = []
    for half in halves:  # two ranks: the same global RNG state, different samples
        torch.manual_seed(5)
        parts.append(policy(half)[0])
    torch.testing.assert_close(whole, sum(parts) / 2)
    torch.manual_seed(5)
    no_index, _ = policy({k: v for k, v in batch.items() if k != "index"})
    assert not torch.equal(no_index, whole)  # a foreign batch draws from the global RNG, as LeRobot


def test_sampling_shapes_queue_and_determinism():
    from lerobot_cli.policies.diffusion.modeling import DiffusionPolicy

    torch.manual_seed(0)
    cfg = tiny_config(noise_scheduler_type="DDIM", num_inference_steps=3)
    policy = DiffusionPolicy(cfg)
    obs = {k: v for k, v in tiny_batch(cfg, b=2).items() if k.startswith("observation.")}
    torch.manual_seed(1)
    chunk = policy.predict_action_chunk(obs)
    assert chunk.shape == (2, 4, 2)
    torch.manual_seed(1)
    assert torch.equal(chunk, policy.predict_action_chunk(obs))
    noise = torch.randn(2, 8, 2)
    # the executed actions start at the current (last) observation: index n_obs_steps - 1 of the horizon
    full = policy.diffusion.conditional_sample(
        2,
        policy.diffusion.global_conditioning(policy._with_image_stack(obs, add_time=True)),
        noise=noise.clone(),
    )
    torch.testing.assert_close(policy.predict_action_chunk(obs, noise=noise.clone()), full[:, 1:5])
    # select_action: one chunk serves n_action_steps calls, then it replans
    policy.reset()
    frame = {k: v[:, -1] for k, v in obs.items()}
    calls = []
    original = policy.predict_action_chunk
    policy.predict_action_chunk = lambda batch, noise=None: calls.append(1) or original(batch, noise)
    actions = [policy.select_action(frame) for _ in range(5)]
    assert [a.shape for a in actions] == [(2, 2)] * 5 and len(calls) == 2
    assert len(policy._queues["observation.state"]) == cfg.n_obs_steps


def test_camera_less_policy_trains_down_on_a_fixed_batch():
    from lerobot_cli.policies.diffusion.modeling import DiffusionPolicy

    torch.manual_seed(0)
    feats = {k: v for k, v in FEATURES.items() if v.type != "VISUAL"}
    cfg = tiny_config(input_features=feats, prediction_type="sample")
    policy = DiffusionPolicy(cfg).train()
    batch = tiny_batch(cfg, b=8)
    opt = torch.optim.Adam(policy.get_optim_params(), lr=3e-3)
    noise, t = torch.randn(8, 8, 2), torch.randint(0, 10, (8,))
    losses = []
    for _ in range(40):
        loss, _ = policy(batch, noise=noise, timesteps=t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses[::8]


def test_resize_crop_train_and_eval():
    from lerobot_cli.policies.diffusion.vision import center_crop, random_crop

    x = torch.arange(2 * 3 * 6 * 7, dtype=torch.float32).reshape(2, 3, 6, 7)
    assert torch.equal(center_crop(x, (3, 4)), x[..., 2:5, 2:6])  # round(1.5) = 2, round(1.5) = 2
    assert torch.equal(center_crop(x, (4, 4)), x[..., 1:5, 2:6])
    torch.manual_seed(0)
    state = torch.get_rng_state()
    assert torch.equal(random_crop(x, (6, 7)), x) and torch.equal(torch.get_rng_state(), state)
    out = random_crop(x, (4, 5))
    assert out.shape == (2, 3, 4, 5)
    from lerobot_cli.policies.diffusion.modeling import DiffusionPolicy

    cfg = tiny_config(resize_shape=(24, 24), crop_ratio=0.75)
    policy = DiffusionPolicy(cfg)
    assert policy.diffusion.rgb_encoder[0].pool.pos_grid.shape == (1, 2)  # 18x18 -> 1x1 map
    loss, _ = policy.train()(tiny_batch(cfg))
    assert torch.isfinite(loss)


def test_batch_norm_is_torchs_and_normalises_in_fp32_when_fsdp_gathers_bf16_affine_terms():
    from lerobot_cli.policies.diffusion.vision import BatchNorm2d

    torch.manual_seed(0)
    ours, ref = BatchNorm2d(4), torch.nn.BatchNorm2d(4)
    assert set(ours.state_dict()) == set(ref.state_dict())
    x = torch.randn(3, 4, 5, 5)
    assert torch.equal(ours(x), ref(x)) and torch.equal(ours.running_mean, ref.running_mean)
    # FSDP2 bf16: affine terms arrive in bf16, the statistics stay fp32 (torch's kernel refuses the mix)
    ours.weight.data, ours.bias.data = ours.weight.data.bfloat16(), ours.bias.data.bfloat16()
    out = ours(x.bfloat16())
    expected = ref(x.bfloat16().float())
    assert out.dtype == torch.bfloat16 and int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 2
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(ours.running_mean, ref.running_mean)


def test_missing_backbone_weights_say_how_to_train_without_them(tmp_path, monkeypatch):
    from lerobot_cli.policies.diffusion.modeling import DiffusionPolicy

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        DiffusionPolicy(tiny_config(pretrained_backbone_weights="ResNet18_Weights.IMAGENET1K_V1"))
    assert "--policy.pretrained_backbone_weights=null" in str(err.value)
    from lerobot_cli.errors import ConfigError

    assert isinstance(err.value, ConfigError)  # lerobot-train prints one error line, no traceback


def test_backbone_loads_a_torchvision_state_dict(tmp_path):
    from lerobot_cli.policies.diffusion.modeling import DiffusionPolicy
    from lerobot_cli.policies.diffusion.vision import resnet_trunk

    trunk, _ = resnet_trunk("resnet18", group_norm=False)
    names = {"0": "conv1", "1": "bn1", "4": "layer1", "5": "layer2", "6": "layer3", "7": "layer4"}
    state = {
        f"{names[k.split('.')[0]]}.{k.partition('.')[2]}": torch.randn_like(v.float())
        if v.is_floating_point()
        else v
        for k, v in trunk.state_dict().items()
    }
    state["fc.weight"] = torch.zeros(1000, 512)
    torch.save(state, tmp_path / "r18.pth")
    policy = DiffusionPolicy(tiny_config(pretrained_backbone_weights=str(tmp_path / "r18.pth")))
    torch.testing.assert_close(
        policy.diffusion.rgb_encoder[0].backbone[7][1].conv2.weight, state["layer4.1.conv2.weight"]
    )


def test_save_and_load_round_trip(tmp_path):
    from lerobot_cli.policies.diffusion.modeling import DiffusionPolicy
    from lerobot_cli.policies.pretrained import load_pretrained, save_pretrained

    torch.manual_seed(0)
    cfg = tiny_config(device="cpu")
    policy = DiffusionPolicy(cfg).eval()
    save_pretrained(policy, cfg, tmp_path)
    loaded_cfg, loaded = load_pretrained(tmp_path)
    assert loaded_cfg == cfg and isinstance(loaded, DiffusionPolicy)
    batch = tiny_batch(cfg)
    noise, t = torch.randn(3, 8, 2), torch.tensor([1, 2, 3])
    assert torch.equal(policy(batch, noise=noise, timesteps=t)[0], loaded(batch, noise=noise, timesteps=t)[0])


# ---------------------------------------------------------------- dataset: observation history + horizon


def test_dataset_delivers_observation_history_and_horizon_with_copy_padding():
    from lerobot_cli.datasets import LeRobotDataset, load_meta, resolve_delta_timestamps

    meta = load_meta(DEMO)
    cfg = DiffusionConfig(n_obs_steps=2, horizon=16, n_action_steps=8)
    delta = resolve_delta_timestamps(
        meta.features,
        meta.fps,
        observation_delta_indices=cfg.observation_delta_indices,
        action_delta_indices=cfg.action_delta_indices,
    )
    ds = LeRobotDataset(DEMO, episodes=[0], delta_timestamps=delta)
    first, last = ds[0], ds[len(ds) - 1]
    assert first["observation.state"].shape == (2, meta.features["observation.state"]["shape"][0])
    assert first["observation.images.top"].shape == (2, 3, 64, 64)
    assert first["action"].shape == (16, meta.features["action"]["shape"][0])
    # episode start: the missing previous frame is a copy of the first, flagged as padding
    assert first["observation.state_is_pad"].tolist() == [True, False]
    assert torch.equal(first["observation.state"][0], first["observation.state"][1])
    assert torch.equal(first["observation.images.top"][0], first["observation.images.top"][1])
    assert first["action_is_pad"].tolist() == [True] + [False] * 15
    # episode end: actions past it repeat the last one
    assert last["action_is_pad"].tolist() == [False, False] + [True] * 14
    assert torch.equal(last["action"][2], last["action"][-1]) and torch.equal(
        last["action"][1], last["action"][2]
    )
