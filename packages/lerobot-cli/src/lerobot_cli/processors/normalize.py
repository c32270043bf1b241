"""Normalizer / unnormalizer steps: dataset statistics applied per feature type, LeRobot's formulas.

``MEAN_STD``: ``(x - mean) / (std + eps)``; ``MIN_MAX``: ``2 (x - min) / (max - min) - 1``;
``QUANTILES`` / ``QUANTILE10``: the same map with ``q01``/``q99`` or ``q10``/``q90`` in place of min/max
(pi05's choice: a few outliers no longer squeeze the bulk of the data); a zero range uses ``eps``;
``IDENTITY``: unchanged. The operations are written in LeRobot's order, so both sides give the same
floats. The statistics are the step's state, saved as ``<feature>.<stat>`` tensors in its safetensors
file, exactly the keys LeRobot writes and reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from lerobot_cli.features import FeatureType, NormalizationMode, PolicyFeature
from lerobot_cli.processors.steps import Batch, ProcessorStep, register_step

REQUIRED_STATS = {
    NormalizationMode.MEAN_STD: ("mean", "std"),
    NormalizationMode.MIN_MAX: ("min", "max"),
    NormalizationMode.QUANTILES: ("q01", "q99"),
    NormalizationMode.QUANTILE10: ("q10", "q90"),
}


def to_stat_tensors(stats: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Tensor]]:
    """``{key: {stat: tensor | ndarray | list | number}}`` as float32 CPU tensors (non-numeric skipped)."""
    out: dict[str, dict[str, Tensor]] = {}
    for key, per_stat in (stats or {}).items():
        for name, value in per_stat.items():
            if isinstance(value, Tensor):
                tensor = value.detach().to("cpu", torch.float32)
            else:
                array = np.asarray(value)
                if not np.issubdtype(array.dtype, np.number) and array.dtype != np.bool_:
                    continue
                tensor = torch.as_tensor(array.astype(np.float32))
            out.setdefault(key, {})[name] = tensor
    return out


class _Normalization(ProcessorStep):
    inverse: ClassVar[bool] = False

    def __init__(
        self,
        features: Mapping[str, PolicyFeature | Mapping[str, Any]],
        norm_map: Mapping[str, NormalizationMode | str],
        stats: Mapping[str, Mapping[str, Any]] | None = None,
        eps: float = 1e-8,
        normalize_observation_keys: list[str] | set[str] | None = None,
    ) -> None:
        self.features = {
            k: f if isinstance(f, PolicyFeature) else PolicyFeature(type=f["type"], shape=f["shape"])
            for k, f in features.items()
        }
        self.norm_map = {FeatureType(k): NormalizationMode(v) for k, v in norm_map.items()}
        self.eps = float(eps)
        self.normalize_observation_keys = (
            None if normalize_observation_keys is None else set(normalize_observation_keys)
        )
        self._stats: dict[str, dict[str, Tensor]] = {}
        self._cast: dict[tuple[str, torch.device, torch.dtype], dict[str, Tensor]] = {}
        self.set_stats(to_stat_tensors(stats))

    def set_stats(self, stats: Mapping[str, Mapping[str, Tensor]]) -> None:
        """Replace the statistics; visual ``(C,)`` stats become ``(C, 1, 1)`` to broadcast over pixels."""
        self._stats = {}
        for key, per_stat in stats.items():
            visual = key in self.features and self.features[key].type == FeatureType.VISUAL
            self._stats[key] = {
                name: t.reshape(-1, 1, 1) if visual and t.dim() == 1 else t for name, t in per_stat.items()
            }
        self._cast.clear()

    @property
    def stats(self) -> dict[str, dict[str, Tensor]]:
        return self._stats

    def mode_of(self, key: str) -> NormalizationMode:
        return self.norm_map.get(self.features[key].type, NormalizationMode.IDENTITY)

    def missing_stats(self) -> list[str]:
        """``key.stat`` names the configured modes need but the statistics lack."""
        return [
            f"{key}.{stat}"
            for key in self.features
            for stat in REQUIRED_STATS.get(self.mode_of(key), ())
            if stat not in self._stats.get(key, {})
        ]

    def _stats_like(self, key: str, x: Tensor) -> dict[str, Tensor]:
        cache_key = (key, x.device, x.dtype)
        if cache_key not in self._cast:
            self._cast[cache_key] = {n: t.to(x.device, x.dtype) for n, t in self._stats[key].items()}
        return self._cast[cache_key]

    def _transform(self, key: str, x: Tensor) -> Tensor:
        mode = self.mode_of(key)
        if mode == NormalizationMode.IDENTITY or key not in self._stats:
            return x
        missing = [s for s in REQUIRED_STATS[mode] if s not in self._stats[key]]
        if missing:
            raise ValueError(f"{self.registry_name}: {mode.value} for {key!r} needs stats {missing}")
        if not x.is_floating_point():
            feature = self.features.get(key)
            if x.dtype == torch.uint8 and feature is not None and feature.type == FeatureType.VISUAL:
                # 0..255 against statistics of [0, 1] pixels: every value silently 255 times too large
                raise ValueError(
                    f"{self.registry_name}: camera {key!r} is uint8 (0..255), but its statistics are of "
                    "pixels in [0, 1]: make it float first (x.float() / 255, or "
                    "lerobot_cli.datasets.dataset.cameras_to_float)"
                )
            x = x.to(torch.float32)
        s = self._stats_like(key, x)
        if mode == NormalizationMode.MEAN_STD:
            return x * s["std"] + s["mean"] if self.inverse else (x - s["mean"]) / (s["std"] + self.eps)
        low_name, high_name = REQUIRED_STATS[mode]
        low = s[low_name]
        span = s[high_name] - low
        span = torch.where(span == 0, torch.full_like(span, self.eps), span)
        if mode == NormalizationMode.MIN_MAX:
            return (x + 1) / 2 * span + low if self.inverse else 2 * (x - low) / span - 1
        # quantiles: LeRobot multiplies before dividing on the way back (not the MIN_MAX order)
        return (x + 1.0) * span / 2.0 + low if self.inverse else 2.0 * (x - low) / span - 1.0

    def __call__(self, batch: Batch) -> Batch:
        out = dict(batch)
        for key, feature in self.features.items():
            if key not in batch or not isinstance(batch[key], Tensor):
                continue
            if (
                self.normalize_observation_keys is not None
                and feature.type != FeatureType.ACTION
                and key not in self.normalize_observation_keys
            ):
                continue
            out[key] = self._transform(key, batch[key])
        return out

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "eps": self.eps,
            "features": {k: {"type": f.type.value, "shape": list(f.shape)} for k, f in self.features.items()},
            "norm_map": {t.value: m.value for t, m in self.norm_map.items()},
        }
        if self.normalize_observation_keys is not None:
            config["normalize_observation_keys"] = sorted(self.normalize_observation_keys)
        return config

    def state_dict(self) -> dict[str, Tensor]:
        return {
            f"{key}.{name}": t.clone()
            for key, per_stat in self._stats.items()
            for name, t in per_stat.items()
        }

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        stats: dict[str, dict[str, Tensor]] = {}
        for flat, tensor in state.items():
            key, _, name = flat.rpartition(".")  # feature keys contain dots, stat names do not
            stats.setdefault(key, {})[name] = tensor.to("cpu", torch.float32)
        self.set_stats(stats)


@register_step
class NormalizerStep(_Normalization):
    """Pre-processor step: observations and (in training) the target actions into normalised space."""

    registry_name: ClassVar[str] = "normalizer_processor"
    inverse: ClassVar[bool] = False


@register_step
class UnnormalizerStep(_Normalization):
    """Post-processor step: the policy's normalised actions back to robot units."""

    registry_name: ClassVar[str] = "unnormalizer_processor"
    inverse: ClassVar[bool] = True
