"""Several LeRobot datasets read as one map-style dataset (what they are: ``lerobot_cli.datasets.mixing``).

Features only later datasets have are left out of the items, so every item has the same keys and batches
collate. Each dataset keeps its own fps: its windows
(``delta_timestamps``) are the policy's frame offsets at that dataset's rate, so a 50-step action chunk is
50 of its own control steps. Items carry ``dataset_index`` (LeRobot's name for it) and a ``task_index`` into
the union of the datasets' tasks.

``MixtureLabels`` turns a part's item into the mixture's; ``MixtureDataset`` is the map-style dataset over
the parts, concatenated in order (a streamed mixture, ``lerobot_cli.datasets.streamed``, labels its items
the same way).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np
import torch

from lerobot_cli.datasets import layout as L
from lerobot_cli.datasets.config import DatasetSource
from lerobot_cli.datasets.errors import DatasetError
from lerobot_cli.datasets.metadata import MetaView
from lerobot_cli.datasets.mixing import MixtureMeta


class MixtureLabels:
    """Part ``d``'s item as the mixture's: renamed, restricted to the mixture's features, with
    ``dataset_index`` and a ``task_index`` into the union of the parts' tasks."""

    def __init__(self, meta: MixtureMeta) -> None:
        keys = set(meta.features)
        self.keep = keys | {f"{k}_is_pad" for k in keys} | {"task"}
        self.renames = [source.rename for source in meta.sources]
        united = {text: i for i, text in meta.tasks.items()}
        self.task_maps = [{index: united[text] for index, text in part.tasks.items()} for part in meta.parts]

    def __call__(self, d: int, item: dict) -> dict:
        rename = self.renames[d]
        out: dict = {}
        for key, value in item.items():
            base, pad = (key[: -len("_is_pad")], "_is_pad") if key.endswith("_is_pad") else (key, "")
            name = rename.get(base, base) + pad
            if name in self.keep:
                out[name] = value
        out["task_index"] = torch.tensor(self.task_maps[d][int(item["task_index"])])
        out["dataset_index"] = torch.tensor(d)
        return out


class MixtureDataset(MetaView, torch.utils.data.Dataset):
    """The ``parts`` (each a ``LeRobotDataset``) concatenated: row ``offsets[d] + i`` is part ``d``'s row
    ``i``, renamed, restricted to the mixture's features, with ``dataset_index`` and a united
    ``task_index``."""

    def __init__(self, parts: Sequence, sources: Sequence[DatasetSource]) -> None:
        super().__init__()
        self.parts = list(parts)
        self.sources = list(sources)
        self.meta = MixtureMeta([p.meta for p in self.parts], self.sources)
        sizes = [len(p) for p in self.parts]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.labels = MixtureLabels(self.meta)
        self._task_maps = self.labels.task_maps

    @property
    def sizes(self) -> list[int]:
        return [len(p) for p in self.parts]

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    @property
    def num_frames(self) -> int:
        return int(self.offsets[-1])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}: {s}" for n, s in zip(self.names, self.sizes, strict=True))
        return f"MixtureDataset({parts})"

    def rows_without_last(self, n: int) -> np.ndarray:
        """Every part's rows that may start a sample (see ``LeRobotDataset.rows_without_last``)."""
        return np.concatenate(
            [off + p.rows_without_last(n) for off, p in zip(self.offsets[:-1], self.parts, strict=True)]
        )

    @property
    def task_index(self) -> np.ndarray:
        """Each frame's task index in the union of tasks, in mixture order (the held-out cap selects
        frames per task)."""
        out = []
        for part, mapping in zip(self.parts, self._task_maps, strict=True):
            own = part.task_index
            high = max(max(mapping, default=0), int(own.max()) if own.size else 0)
            lookup = np.full(high + 1, -1, dtype=np.int64)
            lookup[list(mapping)] = list(mapping.values())
            united = np.where(own >= 0, lookup[np.clip(own, 0, None)], -1)
            if (united < 0).any():
                raise DatasetError(
                    f"{part.root / L.TASKS_PATH} has no task_index {int(own[united < 0][0])}, which its "
                    "frames use"
                )
            out.append(united)
        return np.concatenate(out)

    def part_rows(self, rows: np.ndarray) -> list[np.ndarray]:
        """``rows`` (mixture rows, sorted) split by part."""
        cuts = np.searchsorted(rows, self.offsets[1:-1])
        return np.split(rows, cuts)

    def __getitem__(self, idx: int) -> dict:
        row = int(idx)
        if not 0 <= row < len(self):
            raise IndexError(f"index {idx} out of range for a mixture of {len(self)} frames")
        d = bisect.bisect_right(self.offsets, row) - 1
        return self.labels(d, self.parts[d][row - int(self.offsets[d])])
