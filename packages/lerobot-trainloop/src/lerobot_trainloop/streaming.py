"""Rank- and worker-aware, exactly resumable streaming of episode frames read on demand: the data source.

LeRobot's ``StreamingLeRobotDataset`` gives every rank and worker the same stream (no rank/worker split),
has no state to resume from and fixes its shuffle seed at 42; Hugging Face ``datasets``' resumable
``IterableDataset`` drops its shuffle buffer on resume (the buffered samples are skipped); torchtitan's
stateful loader refuses a resume on another dp degree. :class:`StreamingDataSource` does all three: a
``DataSource`` over an ``IterableDataset`` whose worker w runs one reader
(:class:`~lerobot_trainloop.episode_stream.EpisodeStream`, the index logic) and yields ``(batch, reader,
reader_state_after_batch, group_counts)``; the main process keeps, per reader, the state of the last
batch it *handed out* (prefetched batches do not count), which is the checkpoint. Batches are cut from a
reader's stream, so a batch may span an epoch boundary. A resume on the same readers continues bit for
bit; a resume on another reader count deals the current epoch's remaining frames (buffered ones
included) to the new readers (:func:`~lerobot_trainloop.episode_stream.redistribute`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from lerobot_parallel.validators import is_integer, require_count
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from lerobot_trainloop.batch import HOST_KEYS, move_to_device
from lerobot_trainloop.episode_stream import (
    BLOCK,
    EpisodeStream,
    check_reader_state,
    episode_order,
    initial_reader_state,
    is_int_list,
    lengths_digest,
    natural_share,
    redistribute,
)
from lerobot_trainloop.worker_signals import ShieldedDataLoader, shutdown_loader

__all__ = [  # the index logic is re-exported: callers of this module need not know the split
    "BLOCK",
    "EpisodeStream",
    "StreamingDataSource",
    "check_reader_state",
    "episode_order",
    "gather_states",
    "initial_reader_state",
    "lengths_digest",
    "merge_states",
    "natural_share",
    "read_pairs",
    "redistribute",
]

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
        self.augment = source.augment

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
            pairs, epochs = [], []
            for _ in range(self.batch_size):
                pairs.append(stream.next_pair())
                epochs.append(stream.epoch)  # the pair's epoch: a reader starts the next one when it is out
            counts = None
            if self.groups is not None:
                counts = [0] * self.num_groups
                for ep, _ in pairs:
                    counts[self.groups[ep]] += 1
            items = read_pairs(self.read, pairs)
            if self.augment is not None:
                items = [
                    self.augment(item, (epoch, ep, f))
                    for item, epoch, (ep, f) in zip(items, epochs, pairs, strict=True)
                ]
            yield self.collate(items), reader, stream.state_dict(), counts


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
    the source counts (:attr:`group_counts`, this rank's, kept in its state; ``num_groups``: how many,
    when the last ones may have no episode); ``augment``: ``augment(item, key) -> item`` in the worker
    for every item, ``key = (epoch, episode, frame)`` (one sample of the run, whatever the reader count
    or resume); ``loader_kwargs``: the
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
        num_groups: int | None = None,
        augment: Callable[[Any, tuple[int, ...]], Any] | None = None,
    ) -> None:
        self.augment = augment
        self.lengths = tuple(lengths)
        self.groups = None if groups is None else tuple(groups)
        if self.groups is not None and (
            len(self.groups) != len(self.lengths) or not all(is_integer(g) and g >= 0 for g in self.groups)
        ):
            raise ValueError("groups must give every episode a group: whole numbers >= 0, one per episode")
        self.num_groups = 0 if self.groups is None else max(self.groups, default=-1) + 1
        if self.groups is not None and num_groups is not None:  # groups with no episode count 0
            if not is_integer(num_groups) or num_groups < self.num_groups:
                raise ValueError(f"num_groups={num_groups!r} is fewer than the groups the episodes name")
            self.num_groups = num_groups
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
            if not is_int_list(value, self.num_groups) or any(v < 0 for v in value):
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
