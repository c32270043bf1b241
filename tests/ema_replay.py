"""The EMA of a ``lerobot-train`` run recomputed from the weights its checkpoints recorded, one update at a
time, independently of ``lerobot_trainloop.ModelEma``: the tests that compare a layout's shadow with
another layout's would also pass if the update did nothing (every layout would keep its start weights),
so each of them also replays its own run.

A run that saves after every optimizer update records, at step n, the live weights ``w_n`` and the shadow
``s_n`` (``pretrained_model/`` and ``pretrained_model_ema/``; a sharded run's DCP shards merged first).
The update is diffusers' ``EMAModel.step`` arithmetic in fp32,
``s_n = s_{n-1} - (1 - d_n) * (s_{n-1} - w_n)``, with the warmup decay
``d_n = clamp(1 - (1 + t / inv_gamma) ** -power, min_decay, max_decay)`` for
``t = n - update_after_step - 1 > 0`` and 0 before (or the constant ``ema.decay``), the values read from the
run's ``train_config.json``. So ``s_n`` follows bitwise from ``s_{n-1}`` and ``w_n`` (elementwise ops:
sharding changes nothing), and the first update makes the shadow the live weights up to rounding. Frozen
parameters and constant buffers satisfy the same recurrence (``s = w`` stays ``s``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path


def decay(update: int, ema: dict) -> float:
    """The decay of the ``update``-th update (1-based), written out here rather than taken from EmaConfig."""
    t = update - ema["update_after_step"] - 1
    if t <= 0:
        return 0.0
    if ema["decay"] is not None:
        return float(ema["decay"])
    return max(min(1 - (1 + t / ema["inv_gamma"]) ** -ema["power"], ema["max_decay"]), ema["min_decay"])


def _state(step_dir: Path) -> tuple[int, dict, dict]:
    """``(EMA updates, live weights, shadow)`` of a step directory; DCP shards only (a sharded run's
    checkpoint before its last) are merged by ``lerobot-convert-dcp`` in a copy, the run left as it was."""
    from safetensors.torch import load_file

    updates = json.loads((step_dir / "training_state" / "training_step.json").read_text())["loop"][
        "ema_updates"
    ]
    if (step_dir / "pretrained_model" / "model.safetensors").is_file():
        return (
            updates,
            load_file(step_dir / "pretrained_model" / "model.safetensors"),
            load_file(step_dir / "pretrained_model_ema" / "model.safetensors"),
        )
    from lerobot_ckpt import convert_dcp

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / step_dir.name
        shutil.copytree(step_dir, copy)
        merged = convert_dcp(copy)
        return updates, load_file(merged.output), load_file(merged.ema.output)


def assert_ema_replays(run: Path, steps: list[int]) -> None:
    """Every checkpoint of ``run`` at ``steps`` (consecutive optimizer updates) after the first holds the
    shadow the recurrence gives from the one before it and its live weights, bitwise; if the first is
    the run's first update, its shadow is its live weights up to rounding."""
    import torch

    ema = json.loads(
        (run / "checkpoints" / f"{steps[-1]:06d}" / "pretrained_model" / "train_config.json").read_text()
    )["ema"]
    assert ema["enable"], run
    previous = None
    for step in steps:
        updates, live, shadow = _state(run / "checkpoints" / f"{step:06d}")
        assert shadow.keys() == live.keys(), step
        if previous is None:
            if updates == 1:  # the first update: decay 0, a copy up to rounding
                gap = max((shadow[k] - live[k]).abs().max().item() for k in live)
                assert gap <= 1e-6, (step, gap)
        else:
            assert updates == previous[0] + 1, (step, updates, previous[0])
            c = 1 - decay(updates, ema)
            assert 0 < c < 1, (step, c)
            for key, s in previous[1].items():
                expected = s - (s - live[key]) * c  # product, then difference, as EMAModel.step rounds it
                assert torch.equal(shadow[key], expected), (
                    step,
                    key,
                    (shadow[key] - expected).abs().max().item(),
                )
        previous = (updates, shadow)
    # and the shadow averages: it is neither the live weights nor anything one update away from them
    assert max((previous[1][k] - live[k]).abs().max().item() for k in live) > 1e-5
