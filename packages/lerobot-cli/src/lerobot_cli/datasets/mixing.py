"""What a mixture of datasets is before any is opened (torch-free): its features, checked across the
datasets after their renames, its statistics (LeRobot's ``aggregate_stats`` of the datasets'), its
tasks' union; and the run's metadata, one dataset's or a mixture's, from ``--dataset.*``.

The first dataset defines the features the policy sees (after its renames); every other one must provide
each of them, with the same dtype kind and shape, or the run stops with one sentence naming the dataset,
the feature and the fix (``--dataset.rename_map``). The CLI builds the policy from these features before
any dataset is read (``lerobot_cli.datasets.mixture`` reads them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from lerobot_cli.datasets import layout as L
from lerobot_cli.datasets.config import DatasetConfig, DatasetSource
from lerobot_cli.datasets.errors import DatasetError
from lerobot_cli.datasets.metadata import DatasetMeta, FeatureKeys, load_meta
from lerobot_cli.datasets.stats import aggregate_stats

# Columns every LeRobot dataset has, whose values are per dataset (not features to match).
BOOKKEEPING = frozenset({"timestamp", "frame_index", "episode_index", "index", "task_index"})


def _kind(feature: Mapping) -> str:
    return "camera" if feature["dtype"] in L.VISUAL_DTYPES else str(feature["dtype"])


def renamed_features(meta: DatasetMeta, source: DatasetSource) -> dict[str, dict]:
    """``meta.features`` under ``source.rename``; a rename of a feature the dataset lacks is an error."""
    unknown = [old for old in source.rename if old not in meta.features]
    if unknown:
        raise DatasetError(
            f"--dataset.rename_map entry {source.position} renames {unknown[0]!r}, which dataset "
            f"{source.name!r} does not have (its features: {sorted(meta.features)})"
        )
    out = {source.rename.get(k, k): ft for k, ft in meta.features.items()}
    if len(out) != len(meta.features):
        raise DatasetError(
            f"--dataset.rename_map entry {source.position} gives dataset {source.name!r} two features of "
            "one name: rename to a name it does not already have"
        )
    return out


def mixture_features(metas: Sequence[DatasetMeta], sources: Sequence[DatasetSource]) -> dict[str, dict]:
    """The features of the mixture: the first dataset's (renamed), each checked in every other one."""
    first = renamed_features(metas[0], sources[0])
    for meta, source in zip(metas[1:], sources[1:], strict=True):
        have = renamed_features(meta, source)
        for key, ft in first.items():
            if key in BOOKKEEPING:
                continue
            if key not in have:
                raise DatasetError(
                    f"dataset {source.name!r} has no feature {key!r}, which {sources[0].name!r} has (its "
                    f"features: {sorted(set(have) - BOOKKEEPING)}); map one of them to it with "
                    f'--dataset.rename_map (entry {source.position}: {{"<its name>": "{key}"}})'
                )
            other = have[key]
            if _kind(other) != _kind(ft) or list(other["shape"]) != list(ft["shape"]):
                raise DatasetError(
                    f"feature {key!r} is {_kind(other)} {list(other['shape'])} in dataset {source.name!r} "
                    f"but {_kind(ft)} {list(ft['shape'])} in {sources[0].name!r}: every dataset of a "
                    "mixture must give it the same kind and shape (rename a different feature to it, "
                    "or leave that dataset out)"
                )
    return first


class MixtureMeta(FeatureKeys):
    """What the trainer reads of a dataset's metadata, for a mixture: the first dataset's features and
    fps, statistics aggregated over every dataset (LeRobot's ``aggregate_stats``), the tasks' union."""

    def __init__(self, parts: Sequence[DatasetMeta], sources: Sequence[DatasetSource]) -> None:
        self.parts = list(parts)
        self.sources = list(sources)
        self.features = mixture_features(self.parts, self.sources)
        keep = set(self.features)  # bookkeeping columns too, as LeRobot's aggregate_stats has them
        per_dataset = [
            {source.rename.get(k, k): v for k, v in meta.stats.items() if source.rename.get(k, k) in keep}
            for meta, source in zip(self.parts, self.sources, strict=True)
        ]
        self.stats = aggregate_stats(per_dataset)
        texts = dict.fromkeys(text for meta in self.parts for _, text in sorted(meta.tasks.items()))
        self.tasks: dict[int, str] = dict(enumerate(texts))
        self.root = self.parts[0].root

    @property
    def fps(self) -> float:
        return self.parts[0].fps

    @property
    def num_frames(self) -> int:
        return sum(meta.num_frames for meta in self.parts)

    @property
    def num_episodes(self) -> int:
        return sum(meta.num_episodes for meta in self.parts)


def run_meta(cfg: DatasetConfig, resolve: Callable[[DatasetConfig], Path]) -> DatasetMeta | MixtureMeta:
    """The metadata of the dataset(s) ``cfg`` names, each found by ``resolve`` (``resolve_dataset_root``,
    or a once-per-machine download around it): a ``DatasetMeta``, or a ``MixtureMeta`` for several."""
    sources = cfg.sources()
    if len(sources) == 1:
        return load_meta(resolve(cfg))
    return MixtureMeta([load_meta(resolve(cfg.source_config(s))) for s in sources], sources)
