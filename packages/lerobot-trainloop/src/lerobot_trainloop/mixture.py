"""A weighted mixture of datasets as one deterministic, resumable batch order sharded over dp ranks.

Training on several datasets at once (robots, tasks, embodiments) wants each batch drawn from them in
chosen proportions, not in proportion to their sizes: a small, valuable dataset would otherwise be
drowned by a large one, and concatenating with duplication fixes the ratio at build time and makes an
epoch meaningless. :class:`MixtureBatchSampler` keeps
:class:`~lerobot_trainloop.sampler.ShardedBatchSampler`'s design (a *stream* of global positions; loop
step k consumes ``[start + k·G, start + (k+1)·G)`` with ``G = batch_size × dp_world_size``; dp rank r
takes the slice ``[r·B, (r+1)·B)``; consumption is explicit) and changes only what a stream position
holds:

* **Which source.** Position p draws its source i.i.d. from ``weights``, generated in fixed blocks of
  :data:`BLOCK` positions, each from a generator seeded by (seed, block). The draws are thus a function
  of the position alone: identical on every rank and independent of the batch and world size, so a
  run resumed on another topology continues the same stream, and a consumer can jump anywhere without
  replaying the draws before it.
* **Which sample.** Each source cycles through its own epochs: the n-th draw from source d takes
  element ``n % sizes[d]`` of its permutation for epoch ``n // sizes[d]`` (seeded by (seed, d, epoch)).
  Within one epoch of a source no sample repeats, so a small source is revisited in a fresh order
  rather than sampled with replacement, and ranks never share a sample (every position belongs to one
  rank). A global batch that holds more than an epoch of a small source, or straddles two of its
  epochs, may hold a sample once from each epoch, as a single process would.
* **State.** The n of each source at a position depends on every draw before it, so the state is the
  consumed position *and* the per-source counts there (``counts``, also what a trainer logs).
  :meth:`consume` keeps them current by counting the draws of the consumed range (a bincount over the
  cached block); an iterator starts from them and counts the other ranks' slices to know its own.
  Carrying the counts, rather than recomputing them from position 0, is also what lets a resume change
  the weights: each source continues where it stopped, and the draws from the saved position on follow
  the new weights.

Indices are in the concatenation space: source d's sample i is ``offsets[d] + i``, ``offsets`` the
cumulative sizes, so a ``ConcatDataset`` of the sources reads them.
"""

from __future__ import annotations

import math
import numbers
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from lerobot_parallel.validators import is_integer, require_count
from torch.utils.data import Sampler

from lerobot_trainloop.sampler import regrouping_notes

BLOCK = 4096  # stream positions whose source draws share one generator
_MASK64 = (1 << 64) - 1
# Domain tags: the draw blocks and the sources' permutations never share a generator seed.
_DRAWS_TAG = 0x6D69787475726531  # "mixture1"
_PERMS_TAG = 0x7065726D75746531  # "permute1"


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mixed_seed(tag: int, *parts: int) -> int:
    """A generator seed for ``parts`` in the domain ``tag``; unlike a linear mix (``epoch_seed``), no
    two tuples of small integers (or two domains) collide by arithmetic coincidence."""
    h = _splitmix64(tag)
    for part in parts:
        h = _splitmix64(h ^ (part & _MASK64))
    return h


class MixtureBatchSampler(Sampler[list[int]]):
    """Per-rank micro-batches drawn from several sources in the proportions ``weights``.

    ``sizes[d]``: the samples of source d; ``weights``: positive, normalised to sum 1. Use as
    ``DataLoader(ConcatDataset(sources), batch_sampler=...)`` or as a ``MapDataSource``'s order.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        weights: Sequence[float],
        batch_size: int,
        *,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        max_batches: int | None = None,
    ) -> None:
        sizes, weights = list(sizes), list(weights)
        if not sizes:
            raise ValueError("a mixture needs at least one source (sizes is empty)")
        if len(weights) != len(sizes):
            raise ValueError(
                f"got {len(weights)} weights for {len(sizes)} sources; give one weight per source"
            )
        for d, size in enumerate(sizes):
            require_count(f"sizes[{d}]", size, minimum=1)
        self.weights = _normalised(weights)
        require_count("batch_size", batch_size, minimum=1)
        require_count("dp_world_size", dp_world_size, minimum=1)
        if max_batches is not None:
            require_count("max_batches", max_batches, minimum=0)
        if not is_integer(seed):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank must be in [0, {dp_world_size}), got {dp_rank}")
        # A global batch larger than a source (or than all of them) is fine: sources cycle their epochs.
        self.sizes = tuple(sizes)
        self.offsets = tuple(sum(sizes[:d]) for d in range(len(sizes)))
        self.batch_size = batch_size
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.seed = seed
        self.shuffle = shuffle
        self.max_batches = max_batches
        self._position = 0  # consumed stream position, in samples
        self._counts = np.zeros(len(sizes), dtype=np.int64)  # draws per source before it
        self._reset_caches()

    def _reset_caches(self) -> None:
        self._boundaries = torch.tensor(self.weights, dtype=torch.float64).cumsum(0)[:-1]
        # numpy from here on: the draws and permutations come from torch generators, but indexing a few
        # samples a step with torch ops costs ~10x more (per-op overhead) than with numpy
        self._blocks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._perms: list[dict[int, np.ndarray]] = [{} for _ in self.sizes]

    @property
    def num_sources(self) -> int:
        return len(self.sizes)

    @property
    def num_samples(self) -> int:
        """The samples of all sources together (the concatenation space the indices live in)."""
        return sum(self.sizes)

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.dp_world_size

    @property
    def position(self) -> int:
        """The consumed stream position, in samples (the same on every rank)."""
        return self._position

    @property
    def counts(self) -> tuple[int, ...]:
        """Samples consumed from each source so far, over all ranks."""
        return tuple(self._counts.tolist())

    # -- the stream ----------------------------------------------------------------------------------

    def _block(self, block: int) -> np.ndarray:
        draws = self._blocks.get(block)
        if draws is None:
            if len(self._blocks) >= 4:  # the iterator's block, consume's, and their successors
                self._blocks.popitem(last=False)
            g = torch.Generator().manual_seed(mixed_seed(_DRAWS_TAG, self.seed, block))
            u = torch.rand(BLOCK, generator=g, dtype=torch.float64)
            # The source is the number of cumulative-weight boundaries at or below u (searchsorted's answer,
            # without its per-call cost on small inputs).
            draws = self._blocks[block] = (u.unsqueeze(1) >= self._boundaries).sum(1).numpy()
        else:
            self._blocks.move_to_end(block)
        return draws

    def sources_at(self, position: int, count: int) -> torch.Tensor:
        """The source drawn at each stream position in ``[position, position + count)``."""
        return torch.from_numpy(self._sources(position, count).copy())

    def _sources(self, position: int, count: int) -> np.ndarray:
        parts = []
        while count > 0:
            block, off = divmod(position, BLOCK)
            take = min(count, BLOCK - off)
            parts.append(self._block(block)[off : off + take])
            position += take
            count -= take
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def _count(self, position: int, count: int) -> np.ndarray:
        total = np.zeros(self.num_sources, dtype=np.int64)
        while count > 0:  # block by block: a long skip never materialises its whole range
            take = min(count, BLOCK - position % BLOCK)
            total += np.bincount(self._sources(position, take), minlength=self.num_sources)
            position += take
            count -= take
        return total

    def _perm(self, source: int, epoch: int) -> np.ndarray:
        perms = self._perms[source]
        perm = perms.get(epoch)
        if perm is None:
            if len(perms) >= 2:  # at most two epochs of a source are live at its boundary
                perms.pop(min(perms))
            g = torch.Generator().manual_seed(mixed_seed(_PERMS_TAG, self.seed, source, epoch))
            perm = perms[epoch] = torch.randperm(self.sizes[source], generator=g).numpy()
        return perm

    def _elements(self, source: int, draws: np.ndarray) -> np.ndarray:
        """Source-local samples of the draws numbered ``draws`` (ascending) from ``source``."""
        size = self.sizes[source]
        if not self.shuffle:
            return draws % size
        epochs = draws // size
        first, last = int(draws[0]) // size, int(draws[-1]) // size
        if first == last:
            return self._perm(source, first)[draws - first * size]
        out = np.empty_like(draws)
        for epoch in range(first, last + 1):
            sel = epochs == epoch
            out[sel] = self._perm(source, epoch)[draws[sel] - epoch * size]
        return out

    def _indices(self, sources: np.ndarray, counts: np.ndarray) -> list[int]:
        """Concatenation-space indices for the draws ``sources``, given the per-source ``counts`` before."""
        out = np.empty_like(sources)
        for d in np.unique(sources).tolist():
            sel = sources == d
            n = int(counts[d])
            draws = np.arange(n, n + int(sel.sum()), dtype=np.int64)
            out[sel] = self._elements(d, draws) + self.offsets[d]
        return out.tolist()

    def __iter__(self) -> Iterator[list[int]]:
        position, counts, k = self._position, self._counts.copy(), 0
        lo, hi = self.dp_rank * self.batch_size, (self.dp_rank + 1) * self.batch_size
        while self.max_batches is None or k < self.max_batches:
            sources = self._sources(position, self.global_batch_size)
            # The other ranks' draws before this rank's slice move the counts too.
            before = counts + np.bincount(sources[:lo], minlength=self.num_sources)
            yield self._indices(sources[lo:hi], before)
            counts += np.bincount(sources, minlength=self.num_sources)
            position += self.global_batch_size
            k += 1

    def keyed_batches(self) -> Iterator[list[tuple[int, tuple[int, int]]]]:
        """The batches of ``iter()``, each index paired with its sample key ``(pass, draw)``: the draw's
        stream position as whole passes of ``num_samples`` and the place in the pass (a weighted mixture
        may draw an index twice in a pass, so the key names the draw, not the index)."""
        position = self._position + self.dp_rank * self.batch_size
        for batch in self:
            yield [(i, divmod(position + j, self.num_samples)) for j, i in enumerate(batch)]
            position += self.global_batch_size

    def __len__(self) -> int:
        if self.max_batches is None:
            raise TypeError("MixtureBatchSampler is endless unless max_batches is given")
        return self.max_batches

    def consume(self, num_batches: int = 1) -> None:
        """Record that ``num_batches`` loop steps were trained on (every rank calls it alike)."""
        require_count("num_batches", num_batches, minimum=0)
        count = num_batches * self.global_batch_size
        self._counts += self._count(self._position, count)
        self._position += count

    # -- state ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "kind": "mixture",
            "position": self._position,
            "counts": list(self.counts),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "sizes": list(self.sizes),
            "weights": list(self.weights),
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "dp_world_size": self.dp_world_size,
        }

    def load_state_dict(self, state: dict) -> list[str]:
        """Continue at the saved position with the saved per-source counts; returns what changed.

        Another set of source sizes cannot be resumed; the saved seed and shuffle flag win over the
        configured ones (they define the draws and permutations); new weights apply from the saved
        position on; another batch or world size regroups the same stream. The state is checked
        (a checkpoint is untrusted input) before anything is changed.
        """
        if state.get("kind") != "mixture":
            raise ValueError(
                f"sampler state of kind {state.get('kind')!r} is not a mixture's, so it cannot resume "
                "a MixtureBatchSampler"
            )
        sizes = state.get("sizes")
        if not isinstance(sizes, (list, tuple)) or list(sizes) != list(self.sizes):
            raise ValueError(
                f"sampler state was saved for sources of sizes {sizes}, but this mixture's are "
                f"{list(self.sizes)}; the saved counts do not apply to these sources"
            )
        position, counts = state.get("position"), state.get("counts")
        if not is_integer(position) or position < 0:
            raise ValueError(f"invalid mixture sampler position {position!r} (a whole number >= 0)")
        if (
            not isinstance(counts, (list, tuple))
            or len(counts) != self.num_sources
            or not all(is_integer(c) and c >= 0 for c in counts)
        ):
            raise ValueError(
                f"invalid mixture sampler counts {counts!r} ({self.num_sources} whole numbers >= 0 expected)"
            )
        if sum(counts) != position:
            raise ValueError(
                f"invalid mixture sampler state: counts {list(counts)} sum to {sum(counts)}, not to the "
                f"position {position}"
            )
        seed, shuffle = state.get("seed", self.seed), state.get("shuffle", self.shuffle)
        if not is_integer(seed) or not isinstance(shuffle, bool):
            raise ValueError(f"invalid mixture sampler seed={seed!r} shuffle={shuffle!r}")
        saved_weights = state.get("weights")
        if saved_weights is not None:
            if not isinstance(saved_weights, (list, tuple)) or len(saved_weights) != self.num_sources:
                raise ValueError(f"invalid mixture sampler weights {saved_weights!r}")
            saved_weights = _normalised(list(saved_weights))

        notes = []
        if (seed, shuffle) != (self.seed, self.shuffle):
            notes.append(
                f"the data order keeps the checkpoint's seed={seed} shuffle={shuffle} (configured: "
                f"seed={self.seed} shuffle={self.shuffle}), so the source draws and permutations are the same"
            )
            self.seed, self.shuffle = seed, shuffle
        if saved_weights is not None and not all(
            math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(saved_weights, self.weights)
        ):
            notes.append(
                f"the mixture weights changed ({_fmt(saved_weights)} saved, {_fmt(self.weights)} now): each "
                f"source continues where it stopped (counts {list(counts)}), and the draws from sample "
                f"{position} on follow the new weights"
            )
        notes += regrouping_notes(state, self.batch_size, self.dp_world_size, "position")
        self._position = position
        self._counts = np.array(list(counts), dtype=np.int64)
        self._reset_caches()
        return notes


def _normalised(weights: list) -> tuple[float, ...]:
    for d, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"weights[{d}] must be a finite number > 0, got {w!r}")
    total = math.fsum(weights)
    return tuple(float(w) / total for w in weights)


def _fmt(weights: Sequence[float]) -> str:
    return "[" + ", ".join(f"{w:.4g}" for w in weights) + "]"
