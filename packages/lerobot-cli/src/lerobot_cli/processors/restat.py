"""A ``--policy.path`` fine-tune normalises with the new dataset's statistics, as LeRobot does.

LeRobot 0.6.1's ``lerobot-train`` loads a pretrained policy's pipelines and, unless it resumes, overrides
its normaliser and unnormaliser with the training dataset's statistics (after its dataset factory applied
``use_imagenet_stats``) and with the policy's current features and normalisation mapping; a resume keeps
the checkpoint's own statistics. Fine-tuning ``pi0``/``lerobot/smolvla_base`` on one's own robot with the
pretraining data's statistics would feed the model inputs scaled for another robot, silently, so this
follows LeRobot. The other steps (tokenizer, prompts, relative actions) keep their saved settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lerobot_cli.processors.factory import require_stats
from lerobot_cli.processors.normalize import NormalizerStep, UnnormalizerStep, to_stat_tensors
from lerobot_cli.processors.pipeline import ProcessorPipeline


def use_dataset_stats(
    pre: ProcessorPipeline,
    post: ProcessorPipeline,
    config: Any,
    dataset_stats: Mapping[str, Mapping[str, Any]],
) -> None:
    """Give the loaded pipelines' (un)normalisers ``dataset_stats`` and ``config``'s features and mapping
    (in place). :class:`MissingStatsError` when a normalised feature has no statistics in the dataset."""
    stats = to_stat_tensors(dict(dataset_stats))
    features = {**config.input_features, **config.output_features}
    for pipeline, kind, wanted in (
        (pre, NormalizerStep, features),
        (post, UnnormalizerStep, dict(config.output_features)),
    ):
        for step in pipeline.steps:
            if type(step) is not kind:
                continue
            fresh = kind(
                features=wanted,
                norm_map=config.normalization_mapping,
                stats=stats,
                eps=step.eps,
                normalize_observation_keys=step.normalize_observation_keys,
            )
            require_stats(fresh, config, stats)
            step.features, step.norm_map = fresh.features, fresh.norm_map
            step.set_stats(fresh.stats)
            step._cast.clear()  # cached device copies of the old statistics
