"""Which dataset a run reads (torch-free): one, or a mixture of several.

A mixture is named the way LeRobot reserves for it: ``--dataset.repo_id`` holding a JSON list of repo ids
(LeRobot's field is a string and its factory refuses a list), with ``--dataset.root`` a list of the same
length (null entries: the LeRobot cache), ``--dataset.episodes`` a list of per-dataset selections (null:
all), ``--dataset.rename_map`` one ``{old: new}`` feature rename per dataset, and ``--dataset.weights``
the sampling weights (default: plain concatenation, i.e. proportional to frames). The string forms stay
what LeRobot would store, so ``train_config.json`` keeps LeRobot's types.
"""

from __future__ import annotations

import json
import math
from typing import Any

from attrs import define, field

from lerobot_cli.datasets.image_transforms import ImageTransformsConfig


def _episodes(value):
    if value is None:
        return None
    return tuple(tuple(v) if isinstance(v, list | tuple) else v for v in value)


def _floats(value):
    return None if value is None else tuple(value)


def _renames(value):
    return None if value is None else tuple(value)


@define(frozen=True)
class DatasetSource:
    """One dataset of the run: ``name`` (its repo id, else its root) keys it in metrics and messages."""

    repo_id: str | None
    root: str | None
    episodes: tuple[int, ...] | None
    rename: dict[str, str]
    position: int
    revision: str | None = None

    @property
    def name(self) -> str:
        return self.repo_id or str(self.root)


def _json_list(flag: str, text: str | None) -> list | None:
    """``text`` as a JSON list when it is written as one (starts with ``[``), else None."""
    if text is None or not text.lstrip().startswith("["):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{flag}={text!r} starts like a JSON list but is not one ({err.msg})") from None
    if not isinstance(value, list):
        raise ValueError(f"{flag}={text!r} is not a JSON list")  # noqa: TRY004 (the CLI's usage error)
    return value


@define(frozen=True)
class DatasetConfig:
    """``repo_id`` names the dataset; ``root`` (used as is) overrides ``$HF_LEROBOT_HOME/<repo_id>``."""

    repo_id: str | None = field(default=None, metadata={"help": "Dataset name, e.g. lerobot/demo_reach."})
    root: str | None = field(
        default=None,
        metadata={"help": "Local dataset directory, used as is (default $HF_LEROBOT_HOME/<repo_id>)."},
    )
    episodes: tuple[Any, ...] | None = field(
        default=None,
        converter=_episodes,
        metadata={
            "help": "Episode indices to train on, e.g. '[0,3,5]'; for a mixture one list (or null: all) "
            "per dataset, e.g. '[[0,1],null]'."
        },
    )
    weights: tuple[float, ...] | None = field(
        default=None,
        converter=_floats,
        metadata={
            "help": "A mixture's sampling weights, one per dataset, e.g. '[0.7,0.3]' (normalised; "
            "default: plain concatenation, each frame once per epoch)."
        },
    )
    rename_map: tuple[dict[str, str], ...] | None = field(
        default=None,
        converter=_renames,
        metadata={
            "help": "Per dataset, features to rename before mixing, e.g. "
            '\'[{"observation.images.cam_high":"observation.images.top"},{}]\'.'
        },
    )
    eval_split: float = field(
        default=0.0,
        metadata={
            "help": "Fraction of episodes held out per task for the eval loss (the last ones; 0: none); "
            "needs --eval_steps > 0."
        },
    )
    revision: str | None = field(
        default=None,
        metadata={
            "help": "Hub revision (branch, tag or commit) to download or stream; for a mixture one for all, "
            "or a JSON list with one per dataset (null: main)."
        },
    )
    use_imagenet_stats: bool = field(
        default=True,
        metadata={
            "help": "Normalise every camera (depth maps aside) with ImageNet's mean and std instead of the "
            "dataset's, as LeRobot does by default (the cameras' other statistics stay the dataset's); "
            "processors loaded from --policy.path or a resumed checkpoint keep theirs."
        },
    )
    video_backend: str = field(default="pyav", metadata={"help": "Video decoder.", "choices": ("pyav",)})
    return_uint8: bool = field(
        default=False,
        metadata={
            "help": "LeRobot's switch for uint8 camera frames: training here always moves cameras as uint8 "
            "and makes them float32 in [0, 1] on the device, which is bit-identical, so either value "
            "trains the same."
        },
    )
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Read episodes on demand instead of loading the dataset: each rank and DataLoader worker "
            "reads its own share of the episodes (from the Hub with range reads at a pinned revision, "
            "or from --dataset.root: a directory or any fsspec URL), shuffled through a buffer."
        },
    )
    streaming_buffer_size: int = field(
        default=1000,
        metadata={"help": "Frames each streaming reader (rank x worker) shuffles among."},
    )
    streaming_cache_mb: int = field(
        default=256,
        metadata={"help": "Bytes of remote files each streaming reader keeps in memory (MiB)."},
    )
    image_transforms: ImageTransformsConfig = field(
        factory=ImageTransformsConfig,
        metadata={"help": "LeRobot's image augmentation of the training frames (off by default)."},
    )

    def __attrs_post_init__(self) -> None:
        if self.episodes is not None and not self.episodes:
            raise ValueError(
                "--dataset.episodes=[] selects no episode: give a non-empty JSON list of episode "
                "indices, e.g. '[0,3,5]', or leave it unset to train on all episodes"
            )
        split = self.eval_split
        if isinstance(split, bool) or not isinstance(split, int | float) or not 0.0 <= split < 1.0:
            raise ValueError(
                f"--dataset.eval_split must be a fraction in [0, 1), got {split!r} (e.g. 0.1 holds out "
                "the last 10% of each task's episodes; 0 holds out none)"
            )
        self.sources()  # a mixture's lists: lengths, types, values
        self._check_streaming()
        if self.video_backend not in ("pyav",):
            raise ValueError(
                f"--dataset.video_backend: invalid choice {self.video_backend!r} (choose from pyav)"
            )

    def _check_streaming(self) -> None:
        for name in ("streaming_buffer_size", "streaming_cache_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--dataset.{name} must be a whole number >= 1, got {value!r}")
        if not self.streaming:
            return
        if self.eval_split:
            raise ValueError(
                f"--dataset.eval_split={self.eval_split} holds out episodes of a map-style dataset (as in "
                "LeRobot): with --dataset.streaming=true set it to 0, or train without streaming"
            )
        if self.weights is not None:
            raise ValueError(
                "--dataset.weights samples a mixture map-style: a streamed mixture is read as plain "
                "concatenation (each frame once per epoch); drop --dataset.weights, or set "
                "--dataset.streaming=false"
            )

    def sources(self) -> list[DatasetSource]:
        """The datasets of the run, in order (one unless ``repo_id`` is a JSON list); raises ValueError
        with one sentence naming the flag when the lists do not fit together."""
        ids = _json_list("--dataset.repo_id", self.repo_id)
        roots = _json_list("--dataset.root", self.root)
        mixture = ids is not None or roots is not None
        if ids is not None:
            if not ids or not all(isinstance(i, str) and i.strip() for i in ids):
                raise ValueError(
                    f"--dataset.repo_id={self.repo_id!r}: a mixture is a JSON list of repo ids, e.g. "
                    '\'["org/a","org/b"]\''
                )
            if len(set(ids)) != len(ids):
                raise ValueError(f"--dataset.repo_id={self.repo_id!r} names a dataset twice")
        count = len(ids) if ids is not None else len(roots) if roots is not None else 1
        if roots is not None:
            if len(roots) != count or not all(r is None or (isinstance(r, str) and r) for r in roots):
                raise ValueError(
                    f"--dataset.root={self.root!r}: for {count} datasets give a JSON list of {count} "
                    "directories (null: the LeRobot cache of that repo id)"
                )
        elif mixture is False and self.root is not None:
            roots = [self.root]
        if ids is None and roots is not None and count > 1 and self.repo_id is not None:
            raise ValueError(
                f"--dataset.root lists {count} directories but --dataset.repo_id={self.repo_id!r} is one "
                "name: give a JSON list of as many repo ids, or leave it unset"
            )
        if ids is None:
            ids = [self.repo_id] * count if count == 1 else [None] * count
        if roots is None:
            roots = [None] * count
        for i, (rid, root) in enumerate(zip(ids, roots, strict=True)):
            if rid is None and root is None and mixture:
                raise ValueError(f"--dataset.root: entry {i} is null and there is no repo id for it")
        episodes = self._episode_lists(count, mixture)
        renames = self._rename_lists(count)
        revisions = self._revision_list(count)
        self._check_weights(count)
        names = [rid or str(root) for rid, root in zip(ids, roots, strict=True)]
        if len(set(names)) != len(names):
            raise ValueError(f"--dataset.root={self.root!r} names a directory twice")
        return [
            DatasetSource(rid, root, eps, rename, i, rev)
            for i, (rid, root, eps, rename, rev) in enumerate(
                zip(ids, roots, episodes, renames, revisions, strict=True)
            )
        ]

    def source_config(self, source: DatasetSource) -> DatasetConfig:
        """The one-dataset config of a mixture's ``source`` (where its files are, which episodes)."""
        return DatasetConfig(
            repo_id=source.repo_id,
            root=source.root,
            episodes=source.episodes,
            revision=source.revision,
            streaming=self.streaming,
            streaming_buffer_size=self.streaming_buffer_size,
            streaming_cache_mb=self.streaming_cache_mb,
        )

    @property
    def is_mixture(self) -> bool:
        return len(self.sources()) > 1

    def _episode_lists(self, count: int, mixture: bool) -> list[tuple[int, ...] | None]:
        if self.episodes is None:
            return [None] * count
        nested = any(isinstance(e, tuple) or e is None for e in self.episodes)
        if nested and not mixture:
            raise ValueError(
                f"--dataset.episodes={_show(self.episodes)}: one list per dataset is for a mixture "
                "(--dataset.repo_id a JSON list); for one dataset give its episode indices, e.g. '[0,3,5]'"
            )
        if mixture:
            if len(self.episodes) != count or not all(
                e is None or isinstance(e, tuple) for e in self.episodes
            ):
                raise ValueError(
                    f"--dataset.episodes={_show(self.episodes)}: for a mixture of {count} datasets give one "
                    f"JSON list of episode indices (or null: all) per dataset, e.g. '[[0,3],null]'"
                )
            lists = list(self.episodes)
        else:
            lists = [self.episodes]
        for eps in lists:
            if eps is None:
                continue
            bad = [e for e in eps if isinstance(e, bool) or not isinstance(e, int) or e < 0]
            if not eps or bad or len(set(eps)) != len(eps):
                raise ValueError(
                    f"--dataset.episodes must be a JSON list of distinct episode indices ≥ 0, "
                    f"got {_show(self.episodes)}"
                )
        return lists

    def _revision_list(self, count: int) -> list[str | None]:
        revisions = _json_list("--dataset.revision", self.revision)
        if revisions is None:
            return [self.revision] * count
        if count == 1:
            raise ValueError(
                "--dataset.revision is a JSON list, which gives each dataset of a mixture its revision; "
                "one dataset takes one revision, e.g. --dataset.revision=main"
            )
        if len(revisions) != count or not all(r is None or (isinstance(r, str) and r) for r in revisions):
            raise ValueError(
                f"--dataset.revision={self.revision!r}: for {count} datasets give a JSON list of {count} "
                "revisions (null: main), or one revision for all"
            )
        return revisions

    def _rename_lists(self, count: int) -> list[dict[str, str]]:
        if self.rename_map is None:
            return [{} for _ in range(count)]
        if count == 1:
            raise ValueError(
                "--dataset.rename_map renames the datasets of a mixture (--dataset.repo_id a JSON list); "
                "one dataset is read under its own feature names: leave it unset"
            )
        maps = list(self.rename_map)
        ok = len(maps) == count and all(
            m is None
            or (isinstance(m, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()))
            for m in maps
        )
        if not ok:
            raise ValueError(
                f"--dataset.rename_map: give a JSON list of {count} objects {{old feature: new feature}} "
                f"(one per dataset, {{}} or null: none), got {_show(self.rename_map)}"
            )
        for m in maps:
            if m and len(set(m.values())) != len(m):
                raise ValueError(f"--dataset.rename_map: {m} renames two features to one name")
        return [dict(m or {}) for m in maps]

    def _check_weights(self, count: int) -> None:
        if self.weights is None:
            return
        w = list(self.weights)
        if count == 1:
            raise ValueError("--dataset.weights applies to a mixture: --dataset.repo_id is one dataset")
        if len(w) != count or not all(
            not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x) and x > 0 for x in w
        ):
            raise ValueError(
                f"--dataset.weights: give {count} positive numbers, one per dataset, e.g. "
                f"'{json.dumps([round(1 / count, 3)] * count)}', got {_show(self.weights)}"
            )


def _show(value: Any) -> str:
    return json.dumps(value, default=list)
