"""A policy's pre/post-processor pair, built from its config and the dataset statistics.

The default step lists equal LeRobot's default policy pipelines (ACT's among them), so the saved files
have the names and indices LeRobot expects:

- ``policy_preprocessor``: rename → add batch dim → device → normalizer (step 3);
- ``policy_postprocessor``: unnormalizer (step 0) → device("cpu").

Both normalizer steps hold every statistic they are given, as LeRobot's do (its ``lerobot-train`` passes
the dataset's whole ``meta/stats.json``, ``timestamp`` and ``index`` included), and use those of their
features.

A policy whose LeRobot pipelines differ (pi0, pi05: language steps) names a step-list function in its
``PolicySpec.processors`` (``"module:function"``, imported only here, so configs stay
torch-free). The function gets the config and these default steps (``DefaultSteps``) and returns the
pre- and post-processor step lists; it places and adds steps, while the statistics check and the
pipeline names stay here.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from attrs import frozen
from lerobot_ckpt.layout import POSTPROCESSOR_CONFIG, PREPROCESSOR_CONFIG

from lerobot_cli.features import NormalizationMode, PolicyFeature
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.registry import spec_of
from lerobot_cli.processors.normalize import REQUIRED_STATS, NormalizerStep, UnnormalizerStep
from lerobot_cli.processors.pipeline import ProcessorPipeline
from lerobot_cli.processors.relative import AbsoluteActionsStep, RelativeActionsStep
from lerobot_cli.processors.steps import (
    AddBatchDimensionStep,
    DeviceStep,
    ProcessorStep,
    RenameObservationsStep,
)

# Pipeline names are LeRobot's file stems (policy_preprocessor.json, policy_preprocessor_step_*.safetensors).
PREPROCESSOR_NAME = Path(PREPROCESSOR_CONFIG).stem
POSTPROCESSOR_NAME = Path(POSTPROCESSOR_CONFIG).stem

StepLists = tuple[list[ProcessorStep], list[ProcessorStep]]  # (pre-processor steps, post-processor steps)


@frozen
class DefaultSteps:
    """The steps every policy pipeline is made of (LeRobot's ``DefaultPolicyProcessorSteps``), built
    once from the config and statistics and handed to a policy's ``processor_steps`` function."""

    rename_observations: RenameObservationsStep
    add_batch_dim: AddBatchDimensionStep
    to_device: DeviceStep
    normalize: NormalizerStep
    unnormalize: UnnormalizerStep
    to_cpu: DeviceStep

    def default_lists(self) -> StepLists:
        """The default pipelines: what a policy without ``processor_steps`` gets."""
        return (
            [self.rename_observations, self.add_batch_dim, self.to_device, self.normalize],
            [self.unnormalize, self.to_cpu],
        )


class ProcessorStepsError(ValueError):
    """A spec's ``processors`` names no importable step-list function."""


def _steps_function(config: PolicyConfig) -> Callable[[PolicyConfig, DefaultSteps], StepLists] | None:
    target = spec_of(config).processors
    if not target:
        return None
    module, _, name = target.partition(":")
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ProcessorStepsError(
            f"{type(config).__name__}.spec.processors names {target!r}, which cannot be "
            f"imported ({exc}); it must be 'module:function'"
        ) from exc
    if not callable(function):
        raise ProcessorStepsError(
            f"{type(config).__name__}.spec.processors names {target!r}, which is not a function"
        )
    return function


# Modes tried, in this order, for a feature type whose configured mode lacks statistics
_FALLBACK_MODES = (
    NormalizationMode.MEAN_STD,
    NormalizationMode.MIN_MAX,
    NormalizationMode.QUANTILES,
    NormalizationMode.QUANTILE10,
)
QUANTILE_STATS_FIX = (
    "q01-q99 are written by lerobot_cli.datasets.writer (the demo: uv run python tools/make_demo_dataset.py "
    "--output <root> --overwrite); LeRobot 0.6.1's `lerobot-edit-dataset --operation.type=recompute_stats` "
    "adds them to a LeRobot dataset"
)


class MissingStatsError(ValueError):
    """Statistics lack what the policy's normalization needs; the fields let a caller that knows where
    the statistics came from (the dataset's ``meta/stats.json``) name that file and the fix.
    ``supported_mapping``: the configured mapping with each lacking type replaced by the first mode the
    statistics do have (MEAN_STD, MIN_MAX, QUANTILES, QUANTILE10, else IDENTITY): a run that works as is."""

    def __init__(
        self,
        missing: list[tuple[str, str]],
        *,
        absent: list[str],
        mapping: dict[str, str],
        feature_types: dict[str, str],
        supported_mapping: dict[str, str] | None = None,
    ) -> None:
        self.missing = missing  # (feature, stat) pairs
        self.absent = absent  # features with no statistics at all
        self.mapping = mapping  # feature type -> normalization mode
        self.feature_types = feature_types  # feature -> feature type
        self.supported_mapping = supported_mapping or {
            t: ("IDENTITY" if t in {feature_types[k] for k, _ in missing} else m) for t, m in mapping.items()
        }
        quantiles = any(stat.startswith("q") for _, stat in missing)
        super().__init__(
            f"dataset statistics lack {', '.join(f'{k}.{s}' for k, s in missing)}, needed by the policy's "
            f"normalization_mapping ({mapping}); normalize with modes the statistics have, "
            f"--policy.normalization_mapping='{json.dumps(self.supported_mapping)}', or recompute the "
            f"dataset's meta/stats.json{f': {QUANTILE_STATS_FIX}' if quantiles else ''}"
        )


def supported_mapping(
    mapping: Mapping[str, NormalizationMode],
    features: Mapping[str, PolicyFeature],
    stats: Mapping[str, Mapping[str, Any]],
    lacking: set[str],
) -> dict[str, str]:
    """``mapping`` with each feature type in ``lacking`` set to the first mode whose statistics every
    feature of that type has (see :class:`MissingStatsError`)."""
    out = {}
    for kind, mode in mapping.items():
        mode = NormalizationMode(mode)
        keys = [k for k, f in features.items() if f.type.value == kind]
        if kind in lacking:
            mode = next(
                (
                    m
                    for m in _FALLBACK_MODES
                    if all(s in stats.get(k, {}) for k in keys for s in REQUIRED_STATS[m])
                ),
                NormalizationMode.IDENTITY,
            )
        out[kind] = mode.value
    return out


def require_stats(step: NormalizerStep | UnnormalizerStep, config: PolicyConfig, stats: Mapping) -> None:
    """:class:`MissingStatsError` when ``step`` lacks a statistic its features' modes need (``stats``: what
    it was built from, for the mapping that would work as is)."""
    missing = step.missing_stats()
    if missing:
        features = step.features
        pairs = [tuple(m.rsplit(".", 1)) for m in missing]
        raise MissingStatsError(
            pairs,
            absent=[k for k in features if k not in stats],
            mapping={k: v.value for k, v in config.normalization_mapping.items()},
            feature_types={k: f.type.value for k, f in features.items()},
            supported_mapping=supported_mapping(
                config.normalization_mapping, features, stats, {features[k].type.value for k, _ in pairs}
            ),
        )


def make_pre_post_processors(
    config: PolicyConfig,
    dataset_stats: Mapping[str, Mapping[str, Any]] | None,
    *,
    device: str | None = None,
    rename_map: Mapping[str, str] | None = None,
) -> tuple[ProcessorPipeline, ProcessorPipeline]:
    """Build both pipelines. ``dataset_stats``: ``{key: {"mean"|"std"|"min"|"max"|"q01"|…: array-like}}``
    (the dataset's ``meta/stats.json``); every feature whose mode is not IDENTITY must have its statistics.
    ``device`` (default ``config.device``, else ``"cpu"``) is where the pre-processor puts the batch.
    """
    features = {**config.input_features, **config.output_features}
    # Both steps keep every key of the statistics, features or not (timestamp, index …), as LeRobot's
    # steps do: the saved files then hold the same tensors; only the features' statistics are used.
    stats = dict(dataset_stats or {})
    normalizer = NormalizerStep(features=features, norm_map=config.normalization_mapping, stats=stats)
    require_stats(normalizer, config, stats)
    unnormalizer = UnnormalizerStep(
        features=dict(config.output_features),
        norm_map=config.normalization_mapping,
        stats=stats,
    )
    defaults = DefaultSteps(
        rename_observations=RenameObservationsStep(rename_map),
        add_batch_dim=AddBatchDimensionStep(),
        to_device=DeviceStep(device or config.device or "cpu"),
        normalize=normalizer,
        unnormalize=unnormalizer,
        to_cpu=DeviceStep("cpu"),
    )
    function = _steps_function(config)
    pre_steps, post_steps = defaults.default_lists() if function is None else function(config, defaults)
    return ProcessorPipeline(pre_steps, name=PREPROCESSOR_NAME), ProcessorPipeline(
        post_steps, name=POSTPROCESSOR_NAME
    )


def save_processors(
    preprocessor: ProcessorPipeline, postprocessor: ProcessorPipeline, directory: str | Path
) -> list[Path]:
    """Write both pipelines next to the weights; returns every file written."""
    return [*preprocessor.save_pretrained(directory), *postprocessor.save_pretrained(directory)]


def load_processors(
    directory: str | Path, *, device: str | None = None
) -> tuple[ProcessorPipeline, ProcessorPipeline]:
    """Read ``policy_preprocessor.json`` / ``policy_postprocessor.json`` (ours or LeRobot's).

    ``device`` overrides where the pre-processor puts batches (the saved value is the training device).
    """
    pre = ProcessorPipeline.from_pretrained(directory, PREPROCESSOR_CONFIG)
    post = ProcessorPipeline.from_pretrained(directory, POSTPROCESSOR_CONFIG)
    if device is not None:
        for step in pre.steps:
            if isinstance(step, DeviceStep):
                step.device = str(device)
    pair_relative_actions(pre, post)
    return pre, post


def pair_relative_actions(pre: ProcessorPipeline, post: ProcessorPipeline) -> None:
    """Give each unpaired absolute-actions step of ``post`` the relative-actions step of ``pre`` (the link
    is an object reference, which a pipeline file cannot hold; LeRobot reconnects them the same way)."""
    relative = next((s for s in pre.steps if isinstance(s, RelativeActionsStep)), None)
    if relative is None:
        return
    for step in post.steps:
        if isinstance(step, AbsoluteActionsStep) and step.relative_step is None:
            step.relative_step = relative
