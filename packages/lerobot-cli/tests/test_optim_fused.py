"""--optimizer.fused / --optimizer.foreach: torch's implementation choices for AdamW/Adam (and SGD).
Unset keeps torch's own choice; fused=true is refused at start-up, in one sentence naming the flag,
where the parameters' device has no fused kernel (torch would raise only at the first step)."""

from __future__ import annotations

import pytest
import torch
from lerobot_cli.cli.argv import split_argv
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.errors import ConfigError
from lerobot_cli.optim.config import OptimizerConfig
from lerobot_cli.optim.factory import build_optimizer


def params(device="cpu", dtype=torch.float32):
    return [torch.nn.Parameter(torch.zeros(3, device=device, dtype=dtype))]


def test_unset_keeps_torchs_choice_and_the_lerobot_defaults():
    cfg = OptimizerConfig()
    assert (cfg.fused, cfg.foreach) == (None, None)
    assert (cfg.type, cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay) == (
        "adamw",
        1e-4,
        (0.9, 0.999),
        1e-8,
        0.0,
    )
    opt = build_optimizer(cfg, params())
    assert opt.defaults["fused"] is None and opt.defaults["foreach"] is None


@pytest.mark.parametrize("kind", ["adamw", "adam"])
def test_fused_and_foreach_reach_torch_and_step(kind):
    for impl in ({"fused": True}, {"foreach": True}, {"fused": False, "foreach": False}):
        p = params()
        opt = build_optimizer(OptimizerConfig(type=kind, lr=0.1, **impl), p)
        assert all(opt.defaults[k] is v for k, v in impl.items())
        p[0].grad = torch.ones(3)
        opt.step()  # the CPU has fused Adam kernels in torch >= 2.4
        assert torch.all(p[0] < 0)


def test_fused_on_a_device_without_kernels_is_one_sentence_naming_the_flag():
    with pytest.raises(ConfigError) as exc:
        build_optimizer(OptimizerConfig(fused=True), params(device="meta"))
    message = str(exc.value)
    assert message.startswith("--optimizer.fused=true needs floating-point parameters on a device with fused")
    assert "torch.float32 on meta" in message and "cuda" in message and message.count(". ") == 0
    with pytest.raises(ConfigError, match="torch.int64 on cpu"):
        build_optimizer(
            OptimizerConfig(type="adam", fused=True), [{"params": [torch.zeros(2, dtype=torch.int64)]}]
        )
    build_optimizer(OptimizerConfig(fused=False), params(device="meta"))  # only true is checked


def test_flags_parse_and_both_true_is_refused():
    flags = ["--dataset.repo_id=x/y", "--policy.type=mlp", "--optimizer.fused=true"]
    cfg = build_train_config(split_argv(flags).flags).config
    assert cfg.optimizer.fused is True and cfg.optimizer.foreach is None
    with pytest.raises(ValueError, match="--optimizer.fused and --optimizer.foreach cannot both be true"):
        OptimizerConfig(fused=True, foreach=True)


def test_a_resume_that_changes_fused_keeps_training():
    """reapply_settings (resume with changed settings) switches the implementation and re-places the
    restored step counters for it (on CUDA: device counters for fused, host ones otherwise)."""
    from lerobot_cli.optim.factory import optimizer_settings, reapply_settings

    for saved, now in ((None, True), (True, False)):
        p = params()
        opt = build_optimizer(OptimizerConfig(lr=0.1, fused=saved), p)
        p[0].grad = torch.ones(3)
        opt.step()
        q = params()
        resumed = build_optimizer(OptimizerConfig(lr=0.1, fused=now), q)
        settings = optimizer_settings(resumed)
        resumed.load_state_dict(opt.state_dict())
        reapply_settings(resumed, None, settings)
        assert resumed.param_groups[0]["fused"] is now
        q[0].grad = torch.ones(3)
        resumed.step()
        assert float(resumed.state[q[0]]["step"]) == 2.0
