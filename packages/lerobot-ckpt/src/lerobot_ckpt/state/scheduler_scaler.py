"""Schedulers and loss scalers: objects with ``state_dict()`` whose state is a small JSON file.

Save and load must agree on one thing besides the file format: when a scaler counts. A disabled
``GradScaler`` (``enabled=False``, the non-fp16 default) has nothing to resume, so it is treated
like no scaler at all on both sides; :func:`scaler_enabled` is that rule, in one place. Reading
checks the saved keys against the live object's, so a checkpoint of another scheduler class is
refused by name instead of being half-applied.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from lerobot_ckpt.errors import CorruptCheckpointError, StateMismatchError
from lerobot_ckpt.state import json_codec
from lerobot_ckpt.state.model import few

Stateful = Any  # anything with state_dict()/load_state_dict(): LR schedulers, GradScaler


def scaler_enabled(scaler: Stateful | None) -> bool:
    """A scaler that has state worth saving (``GradScaler.is_enabled()``; objects without it count as on)."""
    return scaler is not None and bool(getattr(scaler, "is_enabled", lambda: True)())


def write_state(path: Path, obj: Stateful, what: str) -> None:
    """``obj.state_dict()`` as JSON; ``what`` names the object in errors (``scheduler``, ``scaler``)."""
    json_codec.write(path, obj.state_dict(), what)


def read_state(path: Path, obj: Stateful, what: str) -> dict[str, Any]:
    """A saved ``state_dict`` typed like ``obj``'s, refused when its public keys differ (another class)."""
    saved = json_codec.read(path)
    if not isinstance(saved, dict) or not saved:
        raise CorruptCheckpointError(path, f"expected a non-empty JSON object of {what} state")
    current = obj.state_dict()

    def public(keys) -> set[str]:
        return {k for k in keys if not str(k).startswith("_")}

    missing, extra = public(current) - public(saved), public(saved) - public(current)
    if missing or extra:
        raise StateMismatchError(
            f"{path} does not match this {type(obj).__name__}: "
            + "; ".join(
                p for p in (missing and f"missing {few(missing)}", extra and f"unknown {few(extra)}") if p
            )
        )
    typed = json_codec.like(saved, current)
    _check_counters(path, typed, current)
    return typed


def _check_counters(path: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """An LR scheduler's position and base rates, typed and in range before any change: a string or
    negative ``last_epoch`` would fail (or divide by zero) inside the schedule after the weights are
    loaded, and a NaN base rate would train silently with NaN."""
    for key in ("last_epoch", "_step_count"):
        if key in current and key in saved:
            value = saved[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise CorruptCheckpointError(path, f"{key} is {value!r}, not a whole number >= 0")
    for key in ("base_lrs", "_last_lr"):
        if key not in current or key not in saved:
            continue
        value, live = saved[key], current[key]
        if not isinstance(value, list | tuple) or len(value) != len(live):
            raise CorruptCheckpointError(
                path, f"{key} is {value!r}, not a list of {len(live)} rates (one per param group)"
            )
        for g, rate in enumerate(value):
            number = (isinstance(rate, int | float) and not isinstance(rate, bool)) or (
                isinstance(rate, torch.Tensor) and rate.ndim == 0 and rate.is_floating_point()
            )
            if not number or not math.isfinite(float(rate)) or float(rate) < 0:
                raise CorruptCheckpointError(path, f"{key}[{g}] is {rate!r}, not a finite number >= 0")
