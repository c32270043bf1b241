"""A checkpoint whose fp32 masters were replaced by a ``--dtype`` cast resumes with a warning,
never silently."""

from __future__ import annotations

import torch
from lerobot_ckpt import RunInfo, TrainingObjects, load_checkpoint, save_checkpoint
from lerobot_cli.checkpointing import _warn_rounded_weights
from safetensors.torch import load_file, save_file


def _checkpoint(tmp_path):
    model = torch.nn.Linear(4, 3)
    step = save_checkpoint(
        tmp_path, 1, run=RunInfo(world_size=1, batch_size=2), objects=TrainingObjects(model=model)
    )
    return model, step


def test_fp32_weights_resume_quietly_and_cast_ones_warn(tmp_path):
    model, step = _checkpoint(tmp_path)
    warnings: list[str] = []
    _warn_rounded_weights(step, load_checkpoint(step, objects=TrainingObjects(model=model)), warnings.append)
    assert warnings == []
    weights = step / "pretrained_model" / "model.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(weights).items()}, weights)
    _warn_rounded_weights(step, load_checkpoint(step, objects=TrainingObjects(model=model)), warnings.append)
    assert len(warnings) == 1 and "holds bfloat16 weights" in warnings[0] and "rounded values" in warnings[0]


def test_a_cast_ema_file_warns_too(tmp_path):
    model = torch.nn.Linear(4, 3)
    shadow = {k: p.detach().clone() for k, p in model.named_parameters()}
    step = save_checkpoint(
        tmp_path, 1, run=RunInfo(world_size=1, batch_size=2), objects=TrainingObjects(model=model, ema=shadow)
    )
    weights = step / "pretrained_model_ema" / "model.safetensors"
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(weights).items()}, weights)
    warnings: list[str] = []
    _warn_rounded_weights(
        step, load_checkpoint(step, objects=TrainingObjects(model=model, ema=shadow)), warnings.append
    )
    assert len(warnings) == 1 and "holds bfloat16 EMA weights" in warnings[0]
    warnings.clear()  # a run without an EMA does not read that file: nothing to say
    _warn_rounded_weights(step, load_checkpoint(step, objects=TrainingObjects(model=model)), warnings.append)
    assert warnings == []
