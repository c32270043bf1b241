"""Deterministic, resumable batch sampler sharded over data-parallel ranks.

The data order is a *stream*: the concatenation of one permutation per epoch, each drawn
from a generator seeded by (seed, epoch), identical on every rank. Loop step k consumes the
global batch at stream positions ``[start + k·G, start + (k+1)·G)`` with ``G = batch_size ×
dp_world_size``; dp rank r takes the contiguous slice ``[r·B, (r+1)·B)`` of it.

Why a stream rather than per-epoch batches:

* **Tail handling.** When the dataset size is not a multiple of G, the last global batch of
  an epoch is completed with the head of the next epoch's permutation. Nothing is dropped,
  nothing is padded: every sample is used exactly once per epoch, and ranks never share a
  sample within an epoch. (The one global batch that straddles two epochs may hold a sample
  once from each epoch — exactly what a single process reading the same stream would see.)
* **Resume across topologies.** The state is the stream position (epoch, offset) in samples,
  independent of B and W, so a run resumed with another world or batch size continues at the
  same offset of the same permutation (sample-exact; only the grouping into batches differs,
  which is logged).
* **Step-count training.** ``--steps`` counts loop steps, not epochs; iteration never ends
  unless ``max_batches`` is given.

Consumption is explicit: a DataLoader with workers pulls batches ahead of training, so what
was *yielded* is not what was *trained on*. Call :meth:`consume` once per trained batch (the
step loop does it for you); :meth:`state_dict` reports the consumed position, and a new
``iter()`` resumes there.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from lerobot_parallel.validators import require_count
from torch.utils.data import Sampler

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def epoch_seed(seed: int, epoch: int) -> int:
    """Generator seed for one epoch; mixed so (seed, epoch+1) never equals (seed+1, epoch)."""
    return (seed * _GOLDEN + epoch) & _MASK64


def epoch_permutation(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    if not shuffle:
        return torch.arange(num_samples)
    g = torch.Generator()
    g.manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(num_samples, generator=g)


def regrouping_notes(state: dict, batch_size: int, dp_world_size: int, where: str) -> list[str]:
    """The note a resume with another batch or world size gets (none when both are as saved):
    the order continues at the same global sample ``where``, grouped into other batches."""
    saved = (state.get("batch_size"), state.get("dp_world_size"))
    if None in saved or tuple(saved) == (batch_size, dp_world_size):
        return []
    note = (
        f"the data order continues at the same global sample {where}, but with "
        f"batch_size={batch_size} x dp_world_size={dp_world_size} (saved: {saved[0]} x "
        f"{saved[1]}) samples are grouped into different batches than in an uninterrupted run, so "
        "per-rank sample-exactness is lost"
    )
    return [note]


class ShardedBatchSampler(Sampler[list[int]]):
    """Per-rank micro-batches of dataset indices; use as ``DataLoader(batch_sampler=...)``.

    For ``DataLoader(sampler=..., batch_size=B)`` use :meth:`index_sampler` instead.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        position: int = 0,
        max_batches: int | None = None,
    ) -> None:
        for name, value, low in (
            ("num_samples", num_samples, 1),
            ("batch_size", batch_size, 1),
            ("dp_world_size", dp_world_size, 1),
            ("position", position, 0),
        ):
            require_count(name, value, minimum=low)
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank must be in [0, {dp_world_size}), got {dp_rank}")
        if batch_size * dp_world_size > num_samples:
            raise ValueError(
                f"a global batch of {batch_size} x {dp_world_size} = {batch_size * dp_world_size} samples is "
                f"larger than the dataset ({num_samples} samples)"
            )
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.seed = seed
        self.shuffle = shuffle
        self.max_batches = max_batches
        self._position = position  # consumed stream position, in samples (epoch × num_samples + offset)
        self._perms: dict[int, torch.Tensor] = {}

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.dp_world_size

    @property
    def batches_per_epoch(self) -> int:
        """Whole global batches per epoch (the remainder spills into the next epoch)."""
        return self.num_samples // self.global_batch_size

    @property
    def epoch(self) -> int:
        return self._position // self.num_samples

    @property
    def offset(self) -> int:
        return self._position % self.num_samples

    def _perm(self, epoch: int) -> torch.Tensor:
        perm = self._perms.get(epoch)
        if perm is None:
            if len(self._perms) >= 2:  # at most two epochs are live at a boundary
                self._perms.pop(min(self._perms))
            perm = self._perms[epoch] = epoch_permutation(self.num_samples, self.seed, epoch, self.shuffle)
        return perm

    def indices_at(self, position: int, count: int) -> list[int]:
        """Dataset indices at stream positions ``[position, position + count)``."""
        out: list[int] = []
        while count > 0:
            epoch, off = divmod(position, self.num_samples)
            take = min(count, self.num_samples - off)
            out.extend(self._perm(epoch)[off : off + take].tolist())
            position += take
            count -= take
        return out

    def _batch_starts(self) -> Iterator[int]:
        """The stream position of this rank's first sample in each batch, from the consumed position."""
        start, k = self._position, 0
        while self.max_batches is None or k < self.max_batches:
            yield start + k * self.global_batch_size + self.dp_rank * self.batch_size
            k += 1

    def __iter__(self) -> Iterator[list[int]]:
        for position in self._batch_starts():
            yield self.indices_at(position, self.batch_size)

    def keyed_batches(self) -> Iterator[list[tuple[int, tuple[int, int]]]]:
        """The batches of ``iter()``, each index paired with its sample key ``(epoch, index)``: which
        epoch's permutation drew it. A key names one sample of the run whatever the rank, batch size or
        resume (an index appears once per epoch), for per-sample randomness such as augmentation."""
        for position in self._batch_starts():
            batch = self.indices_at(position, self.batch_size)
            yield [(i, ((position + j) // self.num_samples, i)) for j, i in enumerate(batch)]

    def __len__(self) -> int:
        if self.max_batches is None:
            raise TypeError("ShardedBatchSampler is endless unless max_batches is given")
        return self.max_batches

    def consume(self, num_batches: int = 1) -> None:
        """Record that ``num_batches`` loop steps were trained on (every rank calls it alike)."""
        self._position += num_batches * self.global_batch_size

    def set_epoch(self, epoch: int) -> None:
        """Jump to the start of ``epoch`` (for epoch-style trainers; drops the unfinished rest)."""
        self._position = epoch * self.num_samples

    def index_sampler(self) -> Sampler[int]:
        """The same order one index at a time, for ``DataLoader(sampler=..., batch_size=batch_size)``."""
        return _FlatSampler(self)

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "dp_world_size": self.dp_world_size,
        }

    def load_state_dict(self, state: dict) -> list[str]:
        """Continue at the saved (epoch, offset) of the saved permutation; returns what changed.

        The seed and shuffle flag are taken from the state (they define the permutation); a
        different dataset size cannot be resumed, a different batch or world size can. Nothing is
        logged here: the caller folds the returned notes into its one resume message.
        """
        if state.get("kind") is not None:  # another sampler's state (a MixtureBatchSampler's)
            raise ValueError(
                f"sampler state of kind {state['kind']!r} is not a ShardedBatchSampler's, so it cannot "
                "resume one"
            )
        if int(state["num_samples"]) != self.num_samples:
            raise ValueError(
                f"sampler state was saved for {state['num_samples']} samples, but the dataset has "
                f"{self.num_samples}; the saved position does not apply to this dataset"
            )
        notes = []
        if (state.get("seed", self.seed), state.get("shuffle", self.shuffle)) != (self.seed, self.shuffle):
            notes.append(
                f"the data order keeps the checkpoint's seed={state.get('seed')} "
                f"shuffle={state.get('shuffle')} (configured: seed={self.seed} shuffle={self.shuffle}), "
                "so the epoch permutation is the same"
            )
            self.seed = int(state.get("seed", self.seed))
            self.shuffle = bool(state.get("shuffle", self.shuffle))
            self._perms.clear()
        notes += regrouping_notes(state, self.batch_size, self.dp_world_size, "offset of the same epoch")
        epoch, offset = int(state["epoch"]), int(state["offset"])
        if epoch < 0 or not 0 <= offset < self.num_samples:
            raise ValueError(f"invalid sampler position epoch={epoch} offset={offset}")
        self._position = epoch * self.num_samples + offset
        return notes


class _FlatSampler(Sampler[int]):
    def __init__(self, batches: ShardedBatchSampler) -> None:
        self._batches = batches

    def __iter__(self) -> Iterator[int]:
        for batch in self._batches:
            yield from batch

    def __len__(self) -> int:
        return len(self._batches) * self._batches.batch_size


class SubsetBatches(Sampler[list[int]]):
    """``batches`` (positions ``0..len(rows)-1``) as dataset rows: ``rows[p]`` for each position.

    For a training set that samples only some frames of its dataset (LeRobot's ``drop_n_last_frames``:
    no episode's last frames start a sample): the sampler, its state and its resume work on the
    positions, the DataLoader reads the rows.
    """

    def __init__(self, batches: Sampler[list[int]], rows) -> None:
        self.batches = batches
        self.rows = [int(r) for r in rows]

    def __iter__(self) -> Iterator[list[int]]:
        rows = self.rows
        for batch in self.batches:
            yield [rows[i] for i in batch]

    def keyed_batches(self) -> Iterator[list[tuple[int, tuple[int, ...]]]]:
        """``batches.keyed_batches()`` with each position as its row (the keys stay the order's)."""
        rows = self.rows
        for batch in self.batches.keyed_batches():
            yield [(rows[i], key) for i, key in batch]

    def __len__(self) -> int:
        return len(self.batches)
