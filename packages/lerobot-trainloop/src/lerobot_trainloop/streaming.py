"""Rank- and worker-aware, exactly resumable streaming of episode frames read on demand.

A streamed dataset is a list of episodes (``lengths[i]`` frames each) whose frames are fetched when
needed (LeRobot's reader will fetch parquet rows and mp4 frames remotely). The streaming readers around
do not fit a multi-GPU run that must resume: LeRobot's ``StreamingLeRobotDataset`` gives every rank and
worker the same stream (no rank/worker split), has no state to resume from and fixes its shuffle seed
at 42; Hugging Face ``datasets``' resumable ``IterableDataset`` drops its shuffle buffer on resume (the
buffered samples are skipped); torchtitan's stateful loader refuses a resume on another dp degree. This
module is the generic part of one that does all three:

* :class:`EpisodeStream` is pure index logic. ``R`` readers (``dp_world_size × max(1, num_workers)``;
  reader ``g = dp_rank × W + worker_id``) share each epoch: the episode order of epoch e is a
  permutation seeded by (seed, e), the same for every reader, and reader g takes ``order[g::R]``, so an
  epoch covers every frame exactly once across readers. A reader walks its episodes frame by frame into
  a bounded shuffle buffer and, once it is full (or its share is exhausted), emits a uniformly drawn
  entry. The draws are counter-based (block ``n // BLOCK`` of a generator seeded by (seed, epoch, g,
  block)), so a reader's whole state is a few integers plus the buffered (episode, frame) pairs.
* **Epoch boundaries.** A reader drains its buffer before it starts its next epoch, so its stream is
  epoch e's frames, then epoch e+1's: nothing crosses an epoch in a buffer. Batches are cut from that
  stream, so a batch may span a boundary (its head from epoch e, its tail from e+1), as with
  ``ShardedBatchSampler``. Readers are independent: shares of unequal frame counts put readers at
  different epochs at a given step (each still covers its epoch-e share exactly once).
* :class:`StreamingDataSource` is a ``DataSource`` over an ``IterableDataset`` whose worker w runs
  one reader and yields ``(batch, reader, reader_state_after_batch)``; the main process keeps, per
  reader, the state of the last batch it *handed out* (prefetched batches do not count), which is
  the checkpoint. A resume on the same readers continues bit for bit; a resume on another reader count
  deals the current epoch's remaining frames (buffered ones included) to the new readers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from lerobot_parallel.validators import is_integer, require_count
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from lerobot_trainloop.batch import HOST_KEYS, move_to_device
from lerobot_trainloop.mixture import mixed_seed
from lerobot_trainloop.worker_signals import ShieldedDataLoader, shutdown_loader

BLOCK = 1024  # buffer pops whose draws share one generator
_ORDER_TAG = 0x73747265616D3031  # "stream01": the episode order of an epoch
_POPS_TAG = 0x706F707331303031  # "pops1001": a reader's buffer draws

Segment = tuple[int, int, int]  # (episode, first frame, end frame): a run of one episode's frames


def episode_order(num_episodes: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The episode order of ``epoch`` (the same on every rank and worker)."""
    if not shuffle:
        return list(range(num_episodes))
    g = torch.Generator().manual_seed(mixed_seed(_ORDER_TAG, seed, epoch))
    return torch.randperm(num_episodes, generator=g).tolist()


def natural_share(lengths: Sequence[int], seed: int, epoch: int, reader: int, readers: int, shuffle: bool):
    """Reader ``reader``'s whole episodes of ``epoch`` (``order[reader::readers]``) as segments."""
    order = episode_order(len(lengths), seed, epoch, shuffle)
    return [(ep, 0, lengths[ep]) for ep in order[reader::readers]]


def initial_reader_state() -> dict:
    return {"epoch": 0, "index": 0, "frame": 0, "buffer": [], "pops": 0, "shares": []}


class EpisodeStream:
    """Reader ``reader`` of ``readers``: an endless stream of ``(episode, frame)`` pairs (see the module
    docstring). ``state``: a ``state_dict()`` to continue from (validated by :func:`check_reader_state`).

    State (JSON-able ints): ``epoch``; ``index`` into the epoch's share (a list of segments); ``frame``,
    the frames taken from the current segment; ``buffer``, the held (episode, frame) pairs in their
    order; ``pops``, the entries emitted in this epoch (the draw counter); ``shares``, explicit
    ``[epoch, segments]`` for epochs whose share is not the natural one (after a resume on another
    reader count), consumed as those epochs end."""

    def __init__(
        self,
        lengths: Sequence[int],
        *,
        reader: int,
        readers: int,
        seed: int,
        shuffle: bool = True,
        buffer_size: int = 1000,
        state: Mapping | None = None,
    ) -> None:
        self.lengths = tuple(lengths)
        self.reader, self.readers = reader, readers
        self.seed, self.shuffle, self.buffer_size = seed, shuffle, buffer_size
        if len(self.lengths) < readers:
            raise ValueError(
                f"{len(self.lengths)} episodes cannot be shared by {readers} readers (every reader needs an "
                "episode per epoch); use fewer ranks or workers"
            )
        state = check_reader_state(
            state if state is not None else initial_reader_state(), self.lengths, buffer_size, shuffle
        )
        self.epoch, self.index, self.frame = state["epoch"], state["index"], state["frame"]
        self.buffer: list[tuple[int, int]] = [tuple(p) for p in state["buffer"]]
        self.pops = state["pops"]
        self.shares: dict[int, list[Segment]] = {e: [tuple(s) for s in segs] for e, segs in state["shares"]}
        self._share = self._share_of(self.epoch)
        if self.index > len(self._share) or self.frame >= (
            _size(self._share[self.index]) if self.index < len(self._share) else 1
        ):
            raise ValueError(f"reader {reader}'s state points past its share of epoch {self.epoch}")
        self._draws: tuple[int, torch.Tensor] | None = None

    def _share_of(self, epoch: int) -> list[Segment]:
        if epoch in self.shares:
            return self.shares[epoch]
        return natural_share(self.lengths, self.seed, epoch, self.reader, self.readers, self.shuffle)

    def _draw(self, n: int) -> int:
        """The pops-th draw of this epoch, as an index into a buffer of ``n`` entries."""
        block, off = divmod(self.pops, BLOCK)
        if self._draws is None or self._draws[0] != block:
            seed = mixed_seed(_POPS_TAG, self.seed, self.epoch, self.reader, block)
            u = torch.rand(BLOCK, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            self._draws = (block, u)
        self.pops += 1
        return min(int(float(self._draws[1][off]) * n), n - 1)

    def _read_frame(self) -> tuple[int, int] | None:
        """The next frame of the share, or None when it is exhausted."""
        if self.index >= len(self._share):
            return None
        ep, start, stop = self._share[self.index]
        pair = (ep, start + self.frame)
        self.frame += 1
        if start + self.frame >= stop:
            self.index, self.frame = self.index + 1, 0
        return pair

    def _next_epoch(self) -> None:
        self.shares.pop(self.epoch, None)
        self.epoch, self.index, self.frame, self.pops, self._draws = self.epoch + 1, 0, 0, 0, None
        self._share = self._share_of(self.epoch)

    def next_pair(self) -> tuple[int, int]:
        while True:
            if not self.shuffle:
                pair = self._read_frame()
                if pair is not None:
                    return pair
            else:
                while len(self.buffer) < self.buffer_size:
                    pair = self._read_frame()
                    if pair is None:
                        break
                    self.buffer.append(pair)
                if self.buffer:
                    i = self._draw(len(self.buffer))
                    self.buffer[i], self.buffer[-1] = self.buffer[-1], self.buffer[i]
                    return self.buffer.pop()
            self._next_epoch()  # the share is exhausted and the buffer drained

    def take(self, n: int) -> list[tuple[int, int]]:
        return [self.next_pair() for _ in range(n)]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        while True:
            yield self.next_pair()

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "index": self.index,
            "frame": self.frame,
            "buffer": [list(p) for p in self.buffer],
            "pops": self.pops,
            "shares": [[e, [list(s) for s in segs]] for e, segs in sorted(self.shares.items())],
        }

    def remaining(self, epoch: int) -> list[Segment]:
        """What this reader has still to emit of ``epoch``, as segments: the rest of the current
        segment and share, and the buffer (one-frame segments); nothing for an epoch already done."""
        if epoch < self.epoch:
            return []
        if epoch > self.epoch:
            return list(self._share_of(epoch))
        rest = [(ep, f, f + 1) for ep, f in self.buffer]
        for i in range(self.index, len(self._share)):
            ep, start, stop = self._share[i]
            rest.append((ep, start + (self.frame if i == self.index else 0), stop))
        return rest


def _size(segment: Segment) -> int:
    return segment[2] - segment[1]


def _is_int_list(value: object, n: int) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == n and all(is_integer(v) for v in value)


def check_reader_state(state: object, lengths: Sequence[int], buffer_size: int, shuffle: bool) -> dict:
    """``state`` if it is a well-formed reader state for episodes of ``lengths`` (untrusted input: the
    types, ranges and every buffered pair are checked), else ValueError."""
    if not isinstance(state, Mapping):
        raise ValueError(f"a reader state must be a mapping, got {type(state).__name__}")  # noqa: TRY004 (a malformed checkpoint: ValueError like any)
    keys = {"epoch", "index", "frame", "buffer", "pops", "shares"}
    if set(state) != keys:
        raise ValueError(f"a reader state has the keys {sorted(keys)}, got {sorted(state)}")
    for key in ("epoch", "index", "frame", "pops"):
        if not is_integer(state[key]) or state[key] < 0:
            raise ValueError(f"reader state {key}={state[key]!r} is not a whole number >= 0")
    n = len(lengths)

    def valid_pair(p: object) -> bool:
        return _is_int_list(p, 2) and 0 <= p[0] < n and 0 <= p[1] < lengths[p[0]]

    buffer = state["buffer"]
    if not isinstance(buffer, (list, tuple)) or not all(valid_pair(p) for p in buffer):
        raise ValueError("reader state buffer must hold [episode, frame] pairs of existing frames")
    if len(buffer) > (buffer_size if shuffle else 0):
        raise ValueError(f"reader state buffer holds {len(buffer)} entries, more than the buffer's size")
    if len({tuple(p) for p in buffer}) != len(buffer):
        raise ValueError("reader state buffer holds a frame twice")
    shares = state["shares"]
    if not isinstance(shares, (list, tuple)):
        raise ValueError("reader state shares must be a list of [epoch, segments]")  # noqa: TRY004 (a malformed checkpoint: ValueError like any)
    seen = set()
    for entry in shares:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2 or not is_integer(entry[0]):
            raise ValueError("reader state shares must be a list of [epoch, segments]")
        if entry[0] < state["epoch"] or entry[0] in seen:
            raise ValueError(f"reader state share for epoch {entry[0]} is past or repeated")
        seen.add(entry[0])
        if not isinstance(entry[1], (list, tuple)) or not all(
            _is_int_list(s, 3) and 0 <= s[0] < n and 0 <= s[1] < s[2] <= lengths[s[0]] for s in entry[1]
        ):
            raise ValueError("reader state segments must be [episode, start, stop] runs of existing frames")
    return dict(state)


def lengths_digest(lengths: Sequence[int]) -> str:
    return hashlib.sha256(",".join(str(int(n)) for n in lengths).encode()).hexdigest()[:16]


_PER_RANK = ("reader_states", "handed_out", "group_counts")  # the entries each rank holds its own part of


def merge_states(states: Sequence[Mapping]) -> dict:
    """One state from every rank's ``StreamingDataSource.state_dict()`` (e.g. ``all_gather_object``):
    the reader states and per-rank batch counts united; the rest must agree. Loading it on any rank of
    any topology works (a rank's own state alone resumes only the same readers)."""
    if not states:
        raise ValueError("merge_states needs at least one state")
    merged = dict(states[0])
    per_rank = [k for k in _PER_RANK if k in merged]
    for key in per_rank:
        merged[key] = {}
    for state in states:
        for key, value in state.items():
            if key not in per_rank and merged.get(key) != value:
                raise ValueError(f"the ranks' streaming states disagree on {key!r}: they are not of one run")
        for key in per_rank:
            part = state.get(key)
            if not isinstance(part, Mapping):
                raise ValueError(f"a streaming state's {key} must be a mapping")  # noqa: TRY004 (a malformed checkpoint: ValueError like any)
            overlap = set(part) & set(merged[key])
            if overlap:
                raise ValueError(f"two ranks' streaming states both hold {key} {sorted(overlap)}")
            merged[key].update(part)
    return merged


def gather_states(state: Mapping) -> dict:
    """``merge_states`` of every rank's ``state`` (collective over the default process group; call it
    on every rank at the same point, e.g. at a checkpoint save). Ranks of one data-parallel rank hold
    the same readers and count once. Without a process group: ``state`` as it is."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return dict(state)
    states: list = [None] * dist.get_world_size()
    dist.all_gather_object(states, dict(state))
    by_rank = {tuple(sorted(s["handed_out"])): s for s in states}  # one per data-parallel rank
    return merge_states(list(by_rank.values()))


def redistribute(
    states: Mapping[int, Mapping],
    lengths: Sequence[int],
    *,
    old_readers: int,
    new_readers: int,
    seed: int,
    shuffle: bool,
    buffer_size: int,
) -> dict[int, dict]:
    """New reader states for ``new_readers`` continuing ``old_readers``' states (all of them): for every
    epoch some old reader is still in, the frames no old reader has emitted yet (buffered ones included)
    are dealt to the new readers, whole runs at a time, each run to the reader with the fewest frames so
    far (in the epoch's episode order, so deterministic); later epochs follow the new reader count."""
    old = {
        g: EpisodeStream(
            lengths,
            reader=g,
            readers=old_readers,
            seed=seed,
            shuffle=shuffle,
            buffer_size=buffer_size,
            state=states[g],
        )
        for g in range(old_readers)
    }
    first = min(s.epoch for s in old.values())
    last = max(s.epoch for s in old.values())
    shares: list[list] = [[] for _ in range(new_readers)]
    for epoch in range(first, last + 1):
        rank = {ep: i for i, ep in enumerate(episode_order(len(lengths), seed, epoch, shuffle))}
        units = sorted(
            (seg for g in range(old_readers) for seg in old[g].remaining(epoch)),
            key=lambda s: (rank[s[0]], s[1]),
        )
        taken = [[] for _ in range(new_readers)]
        load = [0] * new_readers
        for seg in units:
            r = min(range(new_readers), key=lambda i: (load[i], i))
            taken[r].append(list(seg))
            load[r] += _size(seg)
        for r in range(new_readers):
            shares[r].append([epoch, taken[r]])
    return {
        r: {"epoch": first, "index": 0, "frame": 0, "buffer": [], "pops": 0, "shares": shares[r]}
        for r in range(new_readers)
    }


class _ReaderStreams(IterableDataset):
    """Worker w of a rank runs reader ``dp_rank × W + (w + rotation) % W`` from ``starts`` (its state at
    the last handed-out batch) and yields ``(batch, reader, state_after_batch)`` for ever."""

    def __init__(self, source: StreamingDataSource) -> None:
        super().__init__()
        self.reset(source)

    def reset(self, source: StreamingDataSource) -> None:
        """Take ``source``'s handed-out position (before the loader's iterator forks the workers)."""
        self.read = source.read
        self.collate = source.collate_fn
        self.lengths = source.lengths
        self.batch_size = source.batch_size
        self.readers, self.workers, self.dp_rank = source.readers, source.workers, source.dp_rank
        self.seed, self.shuffle, self.buffer_size = source.seed, source.shuffle, source.buffer_size
        self.starts = dict(source.reader_states)
        self.rotation = source.handed_out % source.workers
        self.groups, self.num_groups = source.groups, source.num_groups

    def __iter__(self):
        info = get_worker_info()
        worker = info.id if info is not None else 0
        reader = self.dp_rank * self.workers + (worker + self.rotation) % self.workers
        stream = EpisodeStream(
            self.lengths,
            reader=reader,
            readers=self.readers,
            seed=self.seed,
            shuffle=self.shuffle,
            buffer_size=self.buffer_size,
            state=self.starts.get(reader),
        )
        while True:
            pairs = stream.take(self.batch_size)
            counts = None
            if self.groups is not None:
                counts = [0] * self.num_groups
                for ep, _ in pairs:
                    counts[self.groups[ep]] += 1
            yield self.collate(read_pairs(self.read, pairs)), reader, stream.state_dict(), counts


def read_pairs(read: Callable[[int, list[int]], list], pairs: Sequence[tuple[int, int]]) -> list:
    """The items of ``pairs`` in their order, reading each episode's frames with one ``read`` call."""
    frames: dict[int, list[int]] = {}
    for ep, f in pairs:
        frames.setdefault(ep, []).append(f)
    items = {}
    for ep, fs in frames.items():
        got = list(read(ep, fs))
        if len(got) != len(fs):
            raise ValueError(f"read({ep}, <{len(fs)} frames>) returned {len(got)} items")
        items.update(((ep, f), item) for f, item in zip(fs, got))
    return [items[p] for p in pairs]


def _passthrough(batch: Any) -> Any:
    return batch


_LOADER_OWNED = (
    "batch_size",
    "batch_sampler",
    "sampler",
    "shuffle",
    "collate_fn",
    "generator",
    "num_workers",
)


class StreamingDataSource:
    """A ``DataSource`` streaming the frames of episodes of ``lengths`` frames, read by ``read(episode,
    frames) -> items`` in batches of ``batch_size`` per dp rank.

    ``num_workers`` DataLoader workers per rank, each one reader (``R = dp_world_size × max(1,
    num_workers)`` readers); ``buffer_size``: the shuffle buffer per reader; ``shuffle=False``: episodes
    in order, no buffer. ``collate_fn`` (default ``default_collate``) runs in the worker; ``prepare`` on
    the placed batch; ``groups``: each episode's group (a mixture's dataset), whose handed-out samples
    the source counts (:attr:`group_counts`, this rank's, kept in its state); ``loader_kwargs``: the
    other DataLoader arguments (``prefetch_factor``,
    ``pin_memory``, ``shielded``: a ``ShieldedDataLoader`` by default). Persistent workers are refused:
    a worker's reader restarts from the handed-out position at each ``iter()``.

    Saving: each rank's ``state_dict()`` holds its own readers (keyed by global reader id) and its
    handed-out count. A trainer gathers them (``all_gather_object``) and saves ``merge_states(...)``
    once, which every rank loads: that resumes on any topology. Per-rank files (rank r loads its own)
    resume only the same topology."""

    def __init__(
        self,
        read: Callable[[int, list[int]], list],
        lengths: Sequence[int],
        batch_size: int,
        *,
        device: torch.device,
        seed: int,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        num_workers: int = 0,
        buffer_size: int = 1000,
        shuffle: bool = True,
        prepare: Callable[[Any], Any] | None = None,
        collate_fn: Callable[[list], Any] | None = None,
        host_keys: frozenset[str] = HOST_KEYS,
        loader_kwargs: Mapping[str, Any] | None = None,
        groups: Sequence[int] | None = None,
    ) -> None:
        self.lengths = tuple(lengths)
        self.groups = None if groups is None else tuple(groups)
        if self.groups is not None and (
            len(self.groups) != len(self.lengths) or not all(is_integer(g) and g >= 0 for g in self.groups)
        ):
            raise ValueError("groups must give every episode a group: whole numbers >= 0, one per episode")
        self.num_groups = 0 if self.groups is None else max(self.groups, default=-1) + 1
        self.group_counts = [0] * self.num_groups  # this rank's handed-out samples per group
        for i, n in enumerate(self.lengths):
            require_count(f"lengths[{i}]", n, minimum=1)
        require_count("batch_size", batch_size, minimum=1)
        require_count("dp_world_size", dp_world_size, minimum=1)
        require_count("num_workers", num_workers, minimum=0)
        require_count("buffer_size", buffer_size, minimum=1)
        if not is_integer(seed):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        if not is_integer(dp_rank) or not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank must be in [0, {dp_world_size}), got {dp_rank!r}")
        kwargs = dict(loader_kwargs or {})
        for taken in _LOADER_OWNED:
            if taken in kwargs:
                raise TypeError(f"StreamingDataSource sets the DataLoader's {taken} itself")
        if kwargs.get("persistent_workers"):
            raise ValueError(
                "persistent_workers cannot resume a stream: a worker's reader must restart from the "
                "handed-out position at each iter()"
            )
        self.read = read
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.seed, self.shuffle, self.buffer_size = seed, shuffle, buffer_size
        self.dp_rank, self.dp_world_size, self.num_workers = dp_rank, dp_world_size, num_workers
        self.workers = max(1, num_workers)
        self.readers = dp_world_size * self.workers
        if len(self.lengths) < self.readers:
            raise ValueError(
                f"{len(self.lengths)} episodes cannot be shared by {self.readers} readers "
                f"({dp_world_size} ranks x {self.workers} workers); use fewer workers"
            )
        self.prepare = prepare
        self.collate_fn = collate_fn if collate_fn is not None else default_collate
        self.host_keys = host_keys
        self.handed_out = 0  # batches handed out by this rank, a resumed run's included
        self.reader_states = {g: initial_reader_state() for g in self._own_readers()}
        shielded = kwargs.pop("shielded", True)
        cls = ShieldedDataLoader if shielded else DataLoader
        self._dataset = _ReaderStreams(self)
        self.loader = cls(
            self._dataset,
            batch_size=None,
            collate_fn=_passthrough,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(seed),
            **kwargs,
        )

    def _own_readers(self) -> range:
        return range(self.dp_rank * self.workers, (self.dp_rank + 1) * self.workers)

    @property
    def num_samples(self) -> int:
        """The frames of all episodes."""
        return sum(self.lengths)

    @property
    def loaders(self) -> tuple[DataLoader, ...]:
        return (self.loader,)

    def __iter__(self) -> Iterator[Any]:
        # The workers are forked by the loader's iterator, after these are set: each reader restarts at
        # the last handed-out batch, and worker 0 runs the reader whose batch comes next.
        self._dataset.reset(self)
        for batch, reader, state, counts in self.loader:
            placed = move_to_device(batch, self.device, self.host_keys)
            prepared = self.prepare(placed) if self.prepare is not None else placed
            self.reader_states[reader] = state  # counted before it is returned, like MapDataSource
            self.handed_out += 1
            if counts is not None:
                self.group_counts = [a + b for a, b in zip(self.group_counts, counts, strict=True)]
            yield prepared

    def state_dict(self) -> dict:
        """This rank's position (JSON-able): its readers' states at their last handed-out batch, keyed by
        global reader id, and its handed-out count; see the class docstring and :func:`merge_states`."""
        return {
            "kind": "streaming",
            "readers": self.readers,
            "dp_world_size": self.dp_world_size,
            "num_workers": self.num_workers,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "buffer_size": self.buffer_size,
            "batch_size": self.batch_size,
            "num_samples": self.num_samples,
            "lengths_count": len(self.lengths),
            "lengths_digest": lengths_digest(self.lengths),
            "handed_out": {str(self.dp_rank): self.handed_out},
            "reader_states": {str(g): s for g, s in sorted(self.reader_states.items())},
        } | (
            {"group_counts": {str(self.dp_rank): list(self.group_counts)}} if self.groups is not None else {}
        )

    def load_state_dict(self, state: dict) -> list[str]:
        """Continue at ``state`` (this rank's own, or ``merge_states`` of all ranks'); returns notes.

        Same readers: every reader resumes at its last handed-out batch and the batches equal an
        uninterrupted run's. Another reader count (needs every old reader's state): the current epoch's
        remaining frames are dealt to the new readers. The saved seed, shuffle and buffer size win over
        the configured ones. Other episodes, or a malformed state, raise ValueError before anything
        changes."""
        if not isinstance(state, Mapping) or state.get("kind") != "streaming":
            kind = state.get("kind") if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"a state of kind {kind!r} is not a streaming source's, so it cannot resume it")
        if state.get("lengths_count") != len(self.lengths) or state.get("lengths_digest") != lengths_digest(
            self.lengths
        ):
            raise ValueError(
                f"the streaming state was saved for {state.get('lengths_count')!r} other episodes, not these "
                f"{len(self.lengths)}; its positions do not apply"
            )
        for key in ("readers", "dp_world_size", "buffer_size", "batch_size"):
            if not is_integer(state.get(key)) or state[key] < 1:
                raise ValueError(f"invalid streaming state {key}={state.get(key)!r} (a whole number >= 1)")
        if not is_integer(state.get("num_workers")) or state["num_workers"] < 0:
            raise ValueError(f"invalid streaming state num_workers={state.get('num_workers')!r}")
        old_readers = state["readers"]
        if old_readers != state["dp_world_size"] * max(1, state["num_workers"]):
            raise ValueError("invalid streaming state: readers is not dp_world_size x num_workers")
        seed, shuffle, buffer_size = state.get("seed"), state.get("shuffle"), state["buffer_size"]
        if not is_integer(seed) or not isinstance(shuffle, bool):
            raise ValueError(f"invalid streaming state seed={seed!r} shuffle={shuffle!r}")
        if old_readers > len(self.lengths):
            raise ValueError(
                f"invalid streaming state: {old_readers} readers for {len(self.lengths)} episodes"
            )
        raw_states, raw_counts = state.get("reader_states"), state.get("handed_out")
        if not isinstance(raw_states, Mapping) or not isinstance(raw_counts, Mapping):
            raise ValueError("invalid streaming state: reader_states and handed_out must be mappings")  # noqa: TRY004 (a malformed checkpoint: ValueError like any)
        states: dict[int, dict] = {}
        for key, value in raw_states.items():
            g = _reader_key(key, old_readers)
            states[g] = check_reader_state(value, self.lengths, buffer_size, shuffle)
            try:  # the position must lie within the reader's share
                EpisodeStream(
                    self.lengths,
                    reader=g,
                    readers=old_readers,
                    seed=seed,
                    shuffle=shuffle,
                    buffer_size=buffer_size,
                    state=value,
                )
            except ValueError as e:
                raise ValueError(f"invalid streaming state for reader {g}: {e}") from None
        counts = {_reader_key(k, state["dp_world_size"], "rank"): v for k, v in raw_counts.items()}
        if not all(is_integer(v) and v >= 0 for v in counts.values()):
            raise ValueError("invalid streaming state: handed_out counts must be whole numbers >= 0")
        group_counts = self._saved_group_counts(state)
        notes = []
        if (seed, shuffle, buffer_size) != (self.seed, self.shuffle, self.buffer_size):
            notes.append(
                f"the stream keeps the checkpoint's seed={seed} shuffle={shuffle} buffer_size={buffer_size} "
                f"(configured: {self.seed}, {self.shuffle}, {self.buffer_size}), which define its order"
            )
        same = (state["dp_world_size"], max(1, state["num_workers"])) == (self.dp_world_size, self.workers)
        if same:
            missing = [g for g in self._own_readers() if g not in states]
            if missing or self.dp_rank not in counts:
                raise ValueError(
                    f"the streaming state lacks rank {self.dp_rank}'s readers {missing}: load this rank's "
                    "own state or merge_states of every rank's"
                )
            new_states = {g: states[g] for g in self._own_readers()}
            handed_out = counts[self.dp_rank]
            own_counts = group_counts.get(self.dp_rank)
        else:
            if set(states) != set(range(old_readers)):
                raise ValueError(
                    f"resuming {old_readers} readers on {self.readers} needs every old reader's state "
                    f"(got {sorted(states)}): save merge_states of every rank's"
                )
            dealt = redistribute(
                states,
                self.lengths,
                old_readers=old_readers,
                new_readers=self.readers,
                seed=seed,
                shuffle=shuffle,
                buffer_size=buffer_size,
            )
            new_states = {g: dealt[g] for g in self._own_readers()}
            handed_out = 0
            # the counts are totals over ranks: all of them carry on with rank 0, the others' start at 0
            totals = [sum(c[i] for c in group_counts.values()) for i in range(self.num_groups)]
            own_counts = totals if self.dp_rank == 0 else None
            notes.append(
                f"the stream's {old_readers} readers continue as {self.readers} "
                f"({_count(self.dp_world_size, 'rank')} x {_count(self.workers, 'worker')}): the current "
                "epoch's remaining "
                "frames are dealt to them, so each is still seen once, but grouped into other batches "
                "than in an uninterrupted run"
            )
        if state["batch_size"] != self.batch_size:
            notes.append(
                f"batch_size {self.batch_size} (saved: {state['batch_size']}) groups the same streams into "
                "other batches than in an uninterrupted run"
            )
        self.seed, self.shuffle, self.buffer_size = seed, shuffle, buffer_size
        self.reader_states = new_states
        self.handed_out = handed_out
        self.group_counts = list(own_counts) if own_counts is not None else [0] * self.num_groups
        return notes

    def _saved_group_counts(self, state: Mapping) -> dict[int, list[int]]:
        """The saved per-rank group counts (none saved, or no groups now: empty), validated."""
        raw = state.get("group_counts")
        if raw is None or self.groups is None:
            return {}
        if not isinstance(raw, Mapping):
            raise ValueError("invalid streaming state: group_counts must be a mapping")  # noqa: TRY004 (a malformed checkpoint: ValueError like any)
        out = {}
        for key, value in raw.items():
            rank = _reader_key(key, state["dp_world_size"], "rank")
            if not _is_int_list(value, self.num_groups) or any(v < 0 for v in value):
                raise ValueError(
                    f"invalid streaming state: group_counts of rank {rank} must be {self.num_groups} whole "
                    "numbers >= 0"
                )
            out[rank] = [int(v) for v in value]
        return out

    def close(self) -> None:
        shutdown_loader(self.loader)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _reader_key(key: object, count: int, what: str = "reader") -> int:
    text = key if isinstance(key, str) else None
    if text is None or not text.isdigit() or not 0 <= int(text) < count:
        raise ValueError(f"invalid streaming state {what} id {key!r} (a number in [0, {count}) as a string)")
    return int(text)
