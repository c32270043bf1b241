"""ACTPolicy: training forward/backward for each input combination, inference queue, optimizer groups."""

from __future__ import annotations

import pytest
import torch
from lerobot_cli.features import PolicyFeature
from lerobot_cli.policies import policy_class
from lerobot_cli.policies.act.config import ACTConfig
from lerobot_cli.policies.act.ensemble import ACTTemporalEnsembler
from lerobot_cli.policies.act.modeling import ACTPolicy

CHUNK, B = 5, 2
SMALL = {
    "pretrained_backbone_weights": None,
    "chunk_size": CHUNK,
    "n_action_steps": CHUNK,
    "dim_model": 32,
    "n_heads": 4,
    "dim_feedforward": 64,
    "n_encoder_layers": 2,
    "n_decoder_layers": 1,
    "n_vae_encoder_layers": 2,
    "latent_dim": 8,
}
CAM = (3, 32, 32)


def make_config(state=True, env=True, cameras=1, **overrides) -> ACTConfig:
    inputs = {}
    if state:
        inputs["observation.state"] = PolicyFeature("STATE", (4,))
    if env:
        inputs["observation.environment_state"] = PolicyFeature("ENV", (3,))
    for i in range(cameras):
        inputs[f"observation.images.cam{i}"] = PolicyFeature("VISUAL", CAM)
    return ACTConfig(
        input_features=inputs,
        output_features={"action": PolicyFeature("ACTION", (2,))},
        **{**SMALL, **overrides},
    )


def make_batch(cfg: ACTConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    batch = {
        k: (torch.rand if f.type.value == "VISUAL" else torch.randn)((B, *f.shape), generator=g)
        for k, f in cfg.input_features.items()
    }
    batch["action"] = torch.randn(B, cfg.chunk_size, 2, generator=g)
    batch["action_is_pad"] = torch.zeros(B, cfg.chunk_size, dtype=torch.bool)
    batch["action_is_pad"][0, -2:] = True
    return batch


@pytest.mark.parametrize(
    ("state", "env", "cameras", "use_vae", "pre_norm"),
    [
        (True, True, 1, True, False),  # everything
        (True, False, 2, False, True),  # cameras + state, no VAE, pre-norm
        (False, True, 0, True, False),  # env only, VAE without robot state
        (True, True, 0, False, False),  # no camera, no VAE
    ],
)
def test_forward_backward(state, env, cameras, use_vae, pre_norm):
    torch.manual_seed(0)
    cfg = make_config(state, env, cameras, use_vae=use_vae, pre_norm=pre_norm)
    policy = ACTPolicy(cfg).train()
    loss, info = policy(make_batch(cfg))
    assert loss.dim() == 0 and torch.isfinite(loss)
    # the parts stay on the device (detached 0-d tensors; the loop reads them at log steps only)
    assert set(info) == {"l1_loss", "kld_loss"} and isinstance(info["l1_loss"], torch.Tensor)
    assert all(v.dim() == 0 and not v.requires_grad for v in info.values() if isinstance(v, torch.Tensor))
    parts = {k: float(v) for k, v in info.items()}
    assert (parts["kld_loss"] > 0) == use_vae
    assert loss.item() == pytest.approx(parts["l1_loss"] + cfg.kl_weight * parts["kld_loss"], rel=1e-5)
    loss.backward()
    grads = {n: p.grad for n, p in policy.named_parameters()}
    assert grads["model.action_head.weight"].abs().sum() > 0
    # Every parameter takes part in a training step: DDP needs no find_unused_parameters.
    assert [n for n, g in grads.items() if g is None] == []
    if cameras:
        assert grads["model.backbone.conv1.weight"].abs().sum() > 0
        assert "model.backbone.bn1.running_mean" in dict(policy.named_buffers())  # frozen BN: buffers
    if use_vae:
        assert grads["model.vae_encoder_latent_output_proj.weight"].abs().sum() > 0


def test_the_eval_loss_is_the_l1_alone_and_the_banner_says_so():
    """In eval mode the VAE encoder does not run: the loss is the L1 alone and no KL part is reported (an
    eval/kld_loss of 0 would read as a perfect KL). The banner of a run with --eval_steps says what
    eval/loss is, since ACT's training loss adds kl_weight x KL."""
    from lerobot_cli.banner import banner_lines
    from lerobot_cli.config import TrainConfig
    from lerobot_cli.datasets.config import DatasetConfig
    from lerobot_parallel.runtime import ParallelRuntime

    torch.manual_seed(0)
    cfg = make_config(use_vae=True)
    policy = ACTPolicy(cfg).eval()
    loss, info = policy(make_batch(cfg))
    assert set(info) == {"l1_loss"} and torch.equal(loss, info["l1_loss"])

    def banner(policy_cfg, eval_steps):
        run = TrainConfig(
            dataset=DatasetConfig(repo_id="a/b", eval_split=0.1),
            policy=policy_cfg,
            eval_steps=eval_steps,
            job_name="j",
            output_dir="o",
        )
        lines = banner_lines(run, ParallelRuntime.single("cpu"), policy, 10, 2)
        return [ln for ln in lines if ln.startswith("Eval loss")]

    assert banner(cfg, 5) == [
        (
            "Eval loss: eval/loss is the L1 action loss alone (= eval/l1_loss): the training loss "
            "adds kl_weight (10) x the KL of the VAE encoder, which runs in training only (eval "
            "mode predicts from a zero latent), so compare eval/loss with the training l1_loss, not "
            "with the training loss"
        )
    ]
    assert banner(make_config(use_vae=False), 5) == [
        "Eval loss: eval/loss is the training loss and its parts, computed in eval mode (no dropout)"
    ]
    assert banner(cfg, 0) == []


def test_padded_steps_do_not_affect_the_loss():
    torch.manual_seed(0)
    cfg = make_config(cameras=0, use_vae=False, dropout=0.0)
    policy = ACTPolicy(cfg).train()
    batch = make_batch(cfg)
    other = {**batch, "action": batch["action"].clone()}
    other["action"][0, -2:] += 100.0  # only padded positions change
    assert policy(batch)[0].item() == pytest.approx(policy(other)[0].item(), abs=1e-6)
    other["action"][1, 0] += 100.0  # a real position changes
    assert policy(other)[0].item() > policy(batch)[0].item() + 1.0


def test_vae_training_requires_actions():
    cfg = make_config(cameras=0)
    batch = make_batch(cfg)
    del batch["action"]
    with pytest.raises(ValueError, match="action"):
        ACTPolicy(cfg).train().model({**batch})


def test_predict_and_select_action_queue():
    torch.manual_seed(0)
    cfg = make_config(cameras=1, n_action_steps=3)
    policy = ACTPolicy(cfg)
    obs = {k: v for k, v in make_batch(cfg).items() if k.startswith("observation.")}
    policy.train()
    chunk = policy.predict_action_chunk(obs)
    assert chunk.shape == (B, CHUNK, 2) and not policy.training  # inference runs in eval mode
    steps = [policy.select_action(obs) for _ in range(4)]
    assert all(s.shape == (B, 2) for s in steps)
    for i in range(3):  # the first n_action_steps come from one chunk, in order
        torch.testing.assert_close(steps[i], chunk[:, i])
    torch.testing.assert_close(steps[3], chunk[:, 0])  # queue refilled from a new (identical) chunk
    policy.reset()
    assert len(policy._action_queue) == 0


def test_temporal_ensembling_equals_offline_weighted_average():
    coeff, chunk = 0.1, 4
    ens = ACTTemporalEnsembler(coeff, chunk)
    preds = [torch.randn(1, chunk, 2, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    outs = [ens.update(p) for p in preds]
    w = torch.exp(-coeff * torch.arange(chunk, dtype=torch.float64))
    for t, out in enumerate(outs):
        # predictions made at steps s ≤ t for step t, oldest first (at most chunk of them)
        contrib = [preds[s][0, t - s].double() for s in range(max(0, t - chunk + 1), t + 1)]
        expected = sum(w[i] * c for i, c in enumerate(contrib)) / w[: len(contrib)].sum()
        torch.testing.assert_close(out[0].double(), expected, rtol=1e-5, atol=1e-6)


def test_select_action_with_temporal_ensemble():
    cfg = make_config(cameras=0, n_action_steps=1, temporal_ensemble_coeff=0.01)
    policy = ACTPolicy(cfg)
    obs = {k: v for k, v in make_batch(cfg).items() if k.startswith("observation.")}
    first = policy.select_action(obs)
    torch.testing.assert_close(first, policy.predict_action_chunk(obs)[:, 0])


def test_optim_param_groups_put_backbone_at_its_lr():
    policy = ACTPolicy(make_config(cameras=1, optimizer_lr_backbone=3e-6))
    groups = policy.get_optim_params()
    assert len(groups) == 2 and "lr" not in groups[0] and groups[1]["lr"] == 3e-6
    names = {id(p): n for n, p in policy.named_parameters()}
    assert all(names[id(p)].startswith("model.backbone.") for p in groups[1]["params"])
    assert not any(names[id(p)].startswith("model.backbone.") for p in groups[0]["params"])
    assert sum(len(g["params"]) for g in groups) == len(list(policy.parameters()))
    optimizer = torch.optim.AdamW(groups, lr=1e-5)
    assert [g["lr"] for g in optimizer.param_groups] == [1e-5, 3e-6]
    assert len(ACTPolicy(make_config(cameras=0)).get_optim_params()) == 1  # no backbone, no empty group


def test_protocol_attributes_and_wrap_units_exist():
    assert policy_class(make_config()) is ACTPolicy
    assert ACTPolicy.name == "act" and ACTPolicy.config_class is ACTConfig
    policy = ACTPolicy(make_config(cameras=0))
    classes = {type(m).__name__ for m in policy.modules()}
    assert set(ACTPolicy._fsdp_wrap_modules) <= classes


def test_missing_camera_in_batch_is_named():
    cfg = make_config(cameras=1)
    batch = make_batch(cfg)
    del batch["observation.images.cam0"]
    with pytest.raises(KeyError, match="cam0"):
        ACTPolicy(cfg)(batch)
