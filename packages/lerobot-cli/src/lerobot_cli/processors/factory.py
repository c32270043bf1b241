"""A policy's pre/post-processor pair, built from its config and the dataset statistics.

The step lists equal LeRobot's default policy pipelines (ACT's among them), so the saved files have the
names and indices LeRobot expects:

- ``policy_preprocessor``: rename → add batch dim → device → normalizer (step 3, stats of all features);
- ``policy_postprocessor``: unnormalizer (step 0, action stats) → device("cpu").
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lerobot_ckpt.layout import POSTPROCESSOR_CONFIG, PREPROCESSOR_CONFIG

from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.processors.normalize import NormalizerStep, UnnormalizerStep
from lerobot_cli.processors.pipeline import ProcessorPipeline
from lerobot_cli.processors.steps import AddBatchDimensionStep, DeviceStep, RenameObservationsStep

# Pipeline names are LeRobot's file stems (policy_preprocessor.json, policy_preprocessor_step_*.safetensors).
PREPROCESSOR_NAME = Path(PREPROCESSOR_CONFIG).stem
POSTPROCESSOR_NAME = Path(POSTPROCESSOR_CONFIG).stem


class MissingStatsError(ValueError):
    """Statistics lack what the policy's normalization needs; the fields let a caller that knows where
    the statistics came from (the dataset's ``meta/stats.json``) name that file and the fix."""

    def __init__(self, missing: list[tuple[str, str]], *, absent: list[str], mapping: dict[str, str],
                 feature_types: dict[str, str]) -> None:
        self.missing = missing  # (feature, stat) pairs
        self.absent = absent  # features with no statistics at all
        self.mapping = mapping  # feature type -> normalization mode
        self.feature_types = feature_types  # feature -> feature type
        super().__init__(
            f"dataset statistics lack {', '.join(f'{k}.{s}' for k, s in missing)}, needed by the policy's "
            f"normalization_mapping ({mapping}); use IDENTITY for that feature type or recompute the dataset's "
            "meta/stats.json"
        )


def make_pre_post_processors(
    config: PolicyConfig,
    dataset_stats: Mapping[str, Mapping[str, Any]] | None,
    *,
    device: str | None = None,
    rename_map: Mapping[str, str] | None = None,
) -> tuple[ProcessorPipeline, ProcessorPipeline]:
    """Build both pipelines. ``dataset_stats``: ``{key: {"mean"|"std"|"min"|"max": array-like}}`` (the
    dataset's ``meta/stats.json``); every feature whose mode is not IDENTITY must have its statistics.
    ``device`` (default ``config.device``, else ``"cpu"``) is where the pre-processor puts the batch.
    """
    features = {**config.input_features, **config.output_features}
    stats = {k: v for k, v in (dataset_stats or {}).items() if k in features}
    normalizer = NormalizerStep(features=features, norm_map=config.normalization_mapping, stats=stats)
    missing = normalizer.missing_stats()
    if missing:
        raise MissingStatsError(
            [tuple(m.rsplit(".", 1)) for m in missing], absent=[k for k in features if k not in stats],
            mapping={k: v.value for k, v in config.normalization_mapping.items()},
            feature_types={k: f.type.value for k, f in features.items()},
        )
    unnormalizer = UnnormalizerStep(
        features=dict(config.output_features), norm_map=config.normalization_mapping,
        stats={k: v for k, v in stats.items() if k in config.output_features},
    )
    pre = ProcessorPipeline(
        [RenameObservationsStep(rename_map), AddBatchDimensionStep(),
         DeviceStep(device or config.device or "cpu"), normalizer],
        name=PREPROCESSOR_NAME,
    )
    post = ProcessorPipeline([unnormalizer, DeviceStep("cpu")], name=POSTPROCESSOR_NAME)
    return pre, post


def save_processors(preprocessor: ProcessorPipeline, postprocessor: ProcessorPipeline,
                    directory: str | Path) -> list[Path]:
    """Write both pipelines next to the weights; returns every file written."""
    return [*preprocessor.save_pretrained(directory), *postprocessor.save_pretrained(directory)]


def load_processors(directory: str | Path, *, device: str | None = None) -> tuple[ProcessorPipeline, ProcessorPipeline]:
    """Read ``policy_preprocessor.json`` / ``policy_postprocessor.json`` (ours or LeRobot's).

    ``device`` overrides where the pre-processor puts batches (the saved value is the training device).
    """
    pre = ProcessorPipeline.from_pretrained(directory, PREPROCESSOR_CONFIG)
    post = ProcessorPipeline.from_pretrained(directory, POSTPROCESSOR_CONFIG)
    if device is not None:
        for step in pre.steps:
            if isinstance(step, DeviceStep):
                step.device = str(device)
    return pre, post
