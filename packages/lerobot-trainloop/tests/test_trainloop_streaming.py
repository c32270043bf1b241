"""Streaming episode frames: the reader split, the shuffle buffer, and exact resume.

Every frame once per epoch across R readers (ranks and workers disjoint); the buffer never holds more
than its size and shuffles; the order is a function of the seed; a resume on the same readers continues
bit for bit (workers prefetching ahead, an odd batch count); a resume on another reader count sees the
rest of the epoch once; a malformed or foreign state is refused and changes nothing. Several dp ranks
are simulated by one source per rank in this process."""

from __future__ import annotations

import copy
import json
from collections import Counter

import pytest
import torch
from lerobot_trainloop import DataSource, EpisodeStream, StreamingDataSource, merge_states
from lerobot_trainloop.streaming import read_pairs

LENGTHS = [5, 3, 8, 1, 6, 4, 7]
FRAMES = Counter((ep, f) for ep, n in enumerate(LENGTHS) for f in range(n))
B = 3
CPU = torch.device("cpu")


def read(episode: int, frames: list[int]) -> list[dict]:
    return [{"ep": torch.tensor(episode), "frame": torch.tensor(f)} for f in frames]


def pairs_of(batch) -> list[tuple[int, int]]:
    return list(zip(batch["ep"].tolist(), batch["frame"].tolist()))


def source(dp_rank=0, dp_world_size=1, num_workers=0, **kw) -> StreamingDataSource:
    kw.setdefault("seed", 3)
    kw.setdefault("buffer_size", 4)
    loader_kwargs = {"prefetch_factor": 2} if num_workers else None
    return StreamingDataSource(
        read, LENGTHS, B, device=CPU, dp_rank=dp_rank, dp_world_size=dp_world_size,
        num_workers=num_workers, loader_kwargs=loader_kwargs, **kw,
    )  # fmt: skip


def take(src, n: int) -> list[list[tuple[int, int]]]:
    it = iter(src)
    return [pairs_of(next(it)) for _ in range(n)]


def by_epoch(stream: EpisodeStream, last: int) -> dict[int, list[tuple[int, int]]]:
    """The pairs ``stream`` emits in each epoch up to ``last``, from where it stands."""
    out: dict[int, list[tuple[int, int]]] = {}
    while True:
        pair = stream.next_pair()  # the epoch it moved to, if any, is the pair's
        if stream.epoch > last:
            return out
        out.setdefault(stream.epoch, []).append(pair)


def epoch_pairs(stream: EpisodeStream, epoch: int) -> list[tuple[int, int]]:
    return by_epoch(stream, epoch).get(epoch, [])


def reference(dp_rank: int, dp_world_size: int, num_workers: int, n: int, seed=3, buffer_size=4):
    """What an uninterrupted source yields: batches from its readers in turn."""
    workers = max(1, num_workers)
    streams = [
        EpisodeStream(
            LENGTHS, reader=dp_rank * workers + w, readers=dp_world_size * workers, seed=seed,
            buffer_size=buffer_size,
        )
        for w in range(workers)
    ]  # fmt: skip
    return [streams[k % workers].take(B) for k in range(n)]


def test_it_is_a_data_source():
    src = source()
    assert isinstance(src, DataSource)
    assert src.num_samples == sum(LENGTHS)
    assert src.loaders == (src.loader,)


@pytest.mark.parametrize("readers", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_frame_once_per_epoch_across_readers(readers, shuffle):
    for epoch in (0, 1, 2):
        seen = Counter()
        for g in range(readers):
            stream = EpisodeStream(LENGTHS, reader=g, readers=readers, seed=5, shuffle=shuffle, buffer_size=4)
            mine = epoch_pairs(stream, epoch)
            assert not set(mine) & set(seen), "two readers emitted the same frame"
            seen.update(mine)
        assert seen == FRAMES


@pytest.mark.parametrize("readers", [1, 3])
def test_without_shuffle_a_reader_walks_its_episodes_in_order(readers):
    for g in range(readers):
        stream = EpisodeStream(LENGTHS, reader=g, readers=readers, seed=5, shuffle=False)
        expected = [(ep, f) for ep in range(g, len(LENGTHS), readers) for f in range(LENGTHS[ep])]
        assert epoch_pairs(stream, 0) == expected


def test_the_buffer_holds_at_most_its_size_and_shuffles():
    stream = EpisodeStream(LENGTHS, reader=0, readers=1, seed=5, buffer_size=4)
    emitted, held = [], []
    while True:
        pair = stream.next_pair()
        held.append(len(stream.buffer) + 1)  # what it held when it drew
        if stream.epoch != 0:
            break
        emitted.append(pair)
    assert max(held) == 4, "the buffer never filled: the bound is untested"
    # the same episodes without a buffer: one frame after the other
    plain = EpisodeStream(LENGTHS, reader=0, readers=1, seed=5, buffer_size=1)
    unbuffered = epoch_pairs(plain, 0)
    assert Counter(emitted) == FRAMES
    assert emitted != unbuffered
    assert [ep for ep, _ in unbuffered] != sorted(ep for ep, _ in unbuffered), "episodes not permuted"


def test_the_order_is_a_function_of_the_seed():
    def run(seed):
        stream = EpisodeStream(LENGTHS, reader=1, readers=2, seed=seed, buffer_size=4)
        return stream.take(40)

    assert run(7) == run(7)
    assert run(7) != run(8)
    assert take(source(seed=7), 6) == take(source(seed=7), 6)
    assert take(source(seed=7), 6) != take(source(seed=8), 6)


@pytest.mark.parametrize(("dp_world_size", "num_workers"), [(1, 0), (1, 2), (2, 2)])
def test_the_source_hands_out_its_readers_batches_in_turn(dp_world_size, num_workers):
    for rank in range(dp_world_size):
        src = source(rank, dp_world_size, num_workers)
        try:
            assert take(src, 5) == reference(rank, dp_world_size, num_workers, 5)
        finally:
            src.close()


@pytest.mark.parametrize(("dp_world_size", "num_workers"), [(1, 0), (1, 2), (2, 2)])
@pytest.mark.parametrize("merged", [True, False])
def test_a_resume_continues_bit_for_bit(dp_world_size, num_workers, merged):
    before, after = 5, 6  # an odd count: the next batch comes from worker 1's reader
    states = []
    for rank in range(dp_world_size):
        src = source(rank, dp_world_size, num_workers)
        try:
            it = iter(src)
            got = [pairs_of(next(it)) for _ in range(before)]
            assert got == reference(rank, dp_world_size, num_workers, before)
            if num_workers:
                loader_it = src.loader.last_iterator()
                assert loader_it._send_idx > before, "no batch prefetched ahead: the test proves nothing"
            states.append(json.loads(json.dumps(src.state_dict())))
        finally:
            src.close()
    for rank in range(dp_world_size):
        resumed = source(rank, dp_world_size, num_workers)
        try:
            assert resumed.load_state_dict(merge_states(states) if merged else states[rank]) == []
            expected = reference(rank, dp_world_size, num_workers, before + after)[before:]
            assert take(resumed, after) == expected
        finally:
            resumed.close()


@pytest.mark.parametrize(
    ("old", "new"), [((2, 0), (3, 0)), ((2, 2), (1, 0)), ((1, 0), (2, 2)), ((2, 0), (1, 2))]
)
def test_a_resume_on_other_readers_sees_the_rest_of_the_epoch_once(old, new):
    old_ranks, old_workers = old
    emitted = Counter()
    states = []
    for rank in range(old_ranks):
        src = source(rank, old_ranks, old_workers)
        try:
            for batch in take(src, 3):
                emitted.update(batch)
            states.append(src.state_dict())
        finally:
            src.close()
    merged = merge_states(states)
    assert all(s["epoch"] == 0 for s in merged["reader_states"].values()), "the save is not mid-epoch 0"
    assert any(s["buffer"] for s in merged["reader_states"].values()), "nothing buffered: untested"
    new_ranks, new_workers = new
    new_readers = new_ranks * max(1, new_workers)
    rest = Counter()
    following = Counter()
    for rank in range(new_ranks):
        resumed = source(rank, new_ranks, new_workers)
        notes = resumed.load_state_dict(merged)
        assert len(notes) == 1 and "grouped" in notes[0]
        for g, state in resumed.reader_states.items():
            stream = EpisodeStream(LENGTHS, reader=g, readers=new_readers, seed=3, buffer_size=4, state=state)
            pairs = by_epoch(stream, 1)
            rest.update(pairs.get(0, []))
            following.update(pairs.get(1, []))
            assert stream.state_dict()["shares"] == [], "the dealt shares outlive their epochs"
        # the source continues from those states
        first = [
            EpisodeStream(
                LENGTHS, reader=g, readers=new_readers, seed=3, buffer_size=4, state=resumed.reader_states[g]
            ).take(B)
            for g in sorted(resumed.reader_states)
        ]
        assert take(resumed, len(first)) == first
        resumed.close()
    assert not set(rest) & set(emitted)
    assert emitted + rest == FRAMES
    assert following == FRAMES, "the next epoch is not every frame once on the new readers"


def valid_state() -> dict:
    src = source(0, 1, 0)
    take(src, 2)
    return json.loads(json.dumps(src.state_dict()))


def _set(path, value):
    def mutate(state):
        target = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


MALFORMED = {
    "another kind": _set(["kind"], "mixture"),
    "other lengths": _set(["lengths_digest"], "0" * 16),
    "other episode count": _set(["lengths_count"], 8),
    "a buffered frame past its episode": _set(["reader_states", "0", "buffer", 0], [3, 1]),
    "a buffered episode that does not exist": _set(["reader_states", "0", "buffer", 0], [7, 0]),
    "a buffer entry that is not a pair": _set(["reader_states", "0", "buffer", 0], [1, 2, 3]),
    "a buffer entry of strings": _set(["reader_states", "0", "buffer", 0], ["1", "2"]),
    "a frame twice in the buffer": lambda s: s["reader_states"]["0"]["buffer"].append(
        list(s["reader_states"]["0"]["buffer"][0])
    ),
    "a buffer over its size": _set(["reader_states", "0", "buffer"], [[2, f] for f in range(5)]),
    "a negative epoch": _set(["reader_states", "0", "epoch"], -1),
    "a bool epoch": _set(["reader_states", "0", "epoch"], True),
    "an index past the share": _set(["reader_states", "0", "index"], 99),
    "a frame past its segment": _set(["reader_states", "0", "frame"], 99),
    "a missing reader key": lambda s: s["reader_states"]["0"].pop("pops"),
    "a reader state that is a list": _set(["reader_states", "0"], []),
    "a reader id out of range": lambda s: s["reader_states"].update({"5": s["reader_states"].pop("0")}),
    "no state for this rank's reader": _set(["reader_states"], {}),
    "readers not ranks x workers": _set(["readers"], 2),
    "a string seed": _set(["seed"], "3"),
    "a bad segment": _set(["reader_states", "0", "shares"], [[0, [[0, 3, 9]]]]),
    "not a mapping": lambda s: s.clear(),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_or_foreign_state_is_refused_and_changes_nothing(name):
    state = valid_state()
    assert state["reader_states"]["0"]["buffer"], "nothing buffered: the buffer cases prove nothing"
    MALFORMED[name](state)
    src = source(0, 1, 0)
    take(src, 1)
    before = copy.deepcopy(src.state_dict())
    with pytest.raises(ValueError):
        src.load_state_dict(state)
    assert src.state_dict() == before


def test_the_valid_state_used_above_loads():
    src = source(0, 1, 0)
    assert src.load_state_dict(valid_state()) == []


def test_merge_refuses_states_of_different_runs_or_overlapping_ranks():
    a = source(0, 2).state_dict()
    with pytest.raises(ValueError, match="both hold"):
        merge_states([a, a])
    with pytest.raises(ValueError, match="disagree"):
        merge_states([a, source(1, 2, seed=9).state_dict()])


def test_persistent_workers_are_refused():
    with pytest.raises(ValueError, match="persistent_workers"):
        StreamingDataSource(
            read, LENGTHS, B, device=CPU, seed=0, num_workers=2, loader_kwargs={"persistent_workers": True}
        )


def test_a_batch_reads_each_episode_once_and_keeps_the_emitted_order():
    calls = []

    def counting_read(episode, frames):
        calls.append((episode, list(frames)))
        return read(episode, frames)

    pairs = [(2, 5), (0, 1), (2, 0), (4, 3), (0, 4)]
    items = read_pairs(counting_read, pairs)
    assert [(int(i["ep"]), int(i["frame"])) for i in items] == pairs
    assert calls == [(2, [5, 0]), (0, [1, 4]), (4, [3])]


GROUPS = [0, 1, 0, 2, 1, 0, 2]  # each episode's dataset in a mixture


def _group_truth(batches) -> list[int]:
    counts = [0, 0, 0]
    for batch in batches:
        for ep, _ in batch:
            counts[GROUPS[ep]] += 1
    return counts


@pytest.mark.parametrize("num_workers", [0, 2])
def test_groups_count_the_handed_out_samples_and_survive_a_resume(num_workers):
    ranks = [source(r, 2, num_workers, groups=GROUPS) for r in range(2)]
    first = [take(src, 5) for src in ranks]
    for src, batches in zip(ranks, first, strict=True):
        assert src.group_counts == _group_truth(batches)  # prefetched batches not counted
    merged = merge_states([src.state_dict() for src in ranks])
    assert set(merged["group_counts"]) == {"0", "1"}
    again = [source(r, 2, num_workers, groups=GROUPS) for r in range(2)]
    for src in again:
        src.load_state_dict(copy.deepcopy(merged))
    more = [take(src, 4) for src in again]
    for src, a, b in zip(again, first, more, strict=True):
        assert src.group_counts == _group_truth(a + b)
    # another world size: the totals carry on (with rank 0), nothing lost or counted twice
    one = source(0, 1, 0, groups=GROUPS)
    one.load_state_dict(copy.deepcopy(merged))
    assert one.group_counts == [sum(c) for c in zip(*(src.group_counts for src in ranks), strict=True)]
    for src in ranks + again:
        src.close()


def test_malformed_group_counts_are_refused():
    src = source(groups=GROUPS)
    take(src, 2)
    state = src.state_dict()
    for bad in ({"0": [1, 2]}, {"0": [1, 2, -1]}, {"5": [0, 0, 0]}, [1, 2, 3]):
        with pytest.raises(ValueError, match="group_counts|rank id"):
            source(groups=GROUPS).load_state_dict({**copy.deepcopy(state), "group_counts": bad})
    with pytest.raises(ValueError, match="one per episode"):
        source(groups=GROUPS[:-1])


def test_a_group_without_episodes_counts_zero():
    """A mixture whose last dataset gave no episode (all too short for the policy): still one count per
    dataset, so the counts line up with the datasets' names."""
    src = source(groups=[0] * len(LENGTHS), num_groups=2)
    take(src, 2)
    assert src.group_counts == [2 * B, 0]
    with pytest.raises(ValueError, match="fewer than the groups"):
        source(groups=GROUPS, num_groups=2)


def _keyed(item: dict, key: tuple[int, ...]) -> dict:
    return {**item, "key": torch.tensor(key)}


def test_augment_sees_each_items_epoch_episode_and_frame_and_a_resume_sees_the_same():
    """``augment(item, (epoch, episode, frame))`` runs on every item: each key names one frame of one
    epoch (every frame once per epoch, over readers), and a resumed source hands the same keys."""
    src = source(num_workers=2, augment=_keyed)
    n = 2 * sum(LENGTHS) // B  # two epochs
    it = iter(src)
    batches = [next(it) for _ in range(n)]
    keys = [tuple(k) for b in batches for k in b["key"].tolist()]
    assert all((ep, f) == pair for (_, ep, f), pair in zip(keys, [p for b in batches for p in pairs_of(b)]))
    assert Counter((ep, f) for e, ep, f in keys if e == 0) == FRAMES  # the readers are past epoch 0
    assert len(set(keys)) == len(keys)  # a frame once per epoch
    first = source(num_workers=2, augment=_keyed)
    it = iter(first)
    for _ in range(5):
        next(it)
    resumed = source(num_workers=2, augment=_keyed)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    it = iter(resumed)
    assert [next(it)["key"].tolist() for _ in range(n - 5)] == [b["key"].tolist() for b in batches[5:]]
    for s in (src, first, resumed):
        s.close()
