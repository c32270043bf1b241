"""The index logic of streaming, apart from any loader: who reads which frames of an epoch, in what order.

A streamed dataset is a list of episodes (``lengths[i]`` frames each). ``R`` readers (``dp_world_size ×
max(1, num_workers)``; reader ``g = dp_rank × W + worker_id``) share each epoch: the episode order of
epoch e is a permutation seeded by (seed, e), the same for every reader, and reader g takes
``order[g::R]``, so an epoch covers every frame exactly once across readers. A reader walks its episodes
frame by frame into a bounded shuffle buffer and, once it is full (or its share is exhausted), emits a
uniformly drawn entry. The draws are counter-based (block ``n // BLOCK`` of a generator seeded by (seed,
epoch, g, block)), so a reader's whole state is a few integers plus the buffered (episode, frame) pairs.

* **Epoch boundaries.** A reader drains its buffer before it starts its next epoch, so its stream is
  epoch e's frames, then epoch e+1's: nothing crosses an epoch in a buffer. Readers are independent:
  shares of unequal frame counts put readers at different epochs at a given step (each still covers its
  epoch-e share exactly once).
* **Another reader count.** :func:`redistribute` deals the frames the old readers have not emitted yet
  (buffered ones included) of the epochs they are in to the new readers; later epochs follow the new
  count.

:mod:`lerobot_trainloop.streaming` runs these readers in DataLoader workers as a ``DataSource``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence

import torch
from lerobot_parallel.validators import is_integer

from lerobot_trainloop.mixture import mixed_seed

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


def is_int_list(value: object, n: int) -> bool:
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
        return is_int_list(p, 2) and 0 <= p[0] < n and 0 <= p[1] < lengths[p[0]]

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
            is_int_list(s, 3) and 0 <= s[0] < n and 0 <= s[1] < s[2] <= lengths[s[0]] for s in entry[1]
        ):
            raise ValueError("reader state segments must be [episode, start, stop] runs of existing frames")
    return dict(state)


def lengths_digest(lengths: Sequence[int]) -> str:
    return hashlib.sha256(",".join(str(int(n)) for n in lengths).encode()).hexdigest()[:16]


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
