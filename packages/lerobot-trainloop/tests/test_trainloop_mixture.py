"""Weighted mixture sampler: ranks simulated in one process (the sampler is pure arithmetic on draws and
permutations every rank computes alike)."""

from __future__ import annotations

import math
from itertools import islice

import numpy as np
import pytest
import torch
from lerobot_trainloop import MapDataSource, MixtureBatchSampler, ShardedBatchSampler
from lerobot_trainloop.mixture import _DRAWS_TAG, _PERMS_TAG, BLOCK, mixed_seed
from torch.utils.data import TensorDataset

SIZES = [50, 7, 23]
WEIGHTS = [0.5, 0.3, 0.2]


def rank_samplers(b, w, sizes=SIZES, weights=WEIGHTS, **kw):
    return [MixtureBatchSampler(sizes, weights, b, dp_rank=r, dp_world_size=w, **kw) for r in range(w)]


def take(sampler, steps):
    return list(islice(iter(sampler), steps))


def global_stream(samplers, steps):
    """The union of the ranks' batches, step by step in rank order (what one process would read)."""
    per_rank = [take(s, steps) for s in samplers]
    return [[i for r in range(len(samplers)) for i in per_rank[r][k]] for k in range(steps)]


def source_of(index, sizes=SIZES):
    offsets = [sum(sizes[:d]) for d in range(len(sizes) + 1)]
    return next(d for d in range(len(sizes)) if offsets[d] <= index < offsets[d + 1])


def test_deterministic_from_the_seed():
    a = take(MixtureBatchSampler(SIZES, WEIGHTS, 8, seed=3), 20)
    assert a == take(MixtureBatchSampler(SIZES, WEIGHTS, 8, seed=3), 20)
    assert a != take(MixtureBatchSampler(SIZES, WEIGHTS, 8, seed=4), 20)
    assert all(0 <= i < sum(SIZES) for batch in a for i in batch)


@pytest.mark.parametrize("w", [2, 4])
def test_the_same_global_stream_on_every_world_size(w):
    steps, b = 30, 6  # 4 x 6 x 30 = 720 positions: sources 1 and 2 cycle many epochs
    single = take(MixtureBatchSampler(SIZES, WEIGHTS, b * w, seed=1), steps)
    samplers = rank_samplers(b, w, seed=1)
    per_rank = [take(s, steps) for s in samplers]
    for k in range(steps):
        assert [i for r in range(w) for i in per_rank[r][k]] == single[k]
        assert all(len(per_rank[r][k]) == b for r in range(w))
    # The draws are the same whatever the batch size: a world-1 sampler of batch 1 reads the same stream.
    assert [i for batch in take(MixtureBatchSampler(SIZES, WEIGHTS, 1, seed=1), 60) for i in batch] == [
        i for batch in single for i in batch
    ][:60]


def test_ranks_are_disjoint_within_a_source_epoch():
    # Large sources: no global batch reaches a second epoch of any of them, so ranks never share a sample.
    sizes = [400, 300]
    per_rank = [take(s, 5) for s in rank_samplers(8, 4, sizes=sizes, weights=[1, 1], seed=2)]
    everything = [i for batches in per_rank for batch in batches for i in batch]
    assert len(set(everything)) == len(everything) == 160


def test_realised_proportions_follow_the_weights():
    sizes, weights = [100_000, 50, 3_000], [0.7, 0.2, 0.1]
    n = 200_000
    s = MixtureBatchSampler(sizes, weights, 1000, seed=7)
    s.consume(n // 1000)
    assert sum(s.counts) == n
    for count, p in zip(s.counts, weights):
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(count - n * p) < 3 * sigma, (s.counts, weights)
    # ... and they are the draws of what was iterated
    drawn = [
        source_of(i, sizes)
        for batch in take(MixtureBatchSampler(sizes, weights, 1000, seed=7), 20)
        for i in batch
    ]
    assert [drawn.count(d) for d in range(3)] == list(
        MixtureBatchSampler(sizes, weights, 1000, seed=7)._count(0, 20_000)
    )


@pytest.mark.parametrize("shuffle", [True, False])
def test_each_source_cycles_through_its_epochs(shuffle):
    stream = [
        i
        for batch in take(MixtureBatchSampler(SIZES, WEIGHTS, 16, seed=5, shuffle=shuffle), 40)
        for i in batch
    ]
    offsets = [0, 50, 57]
    for d, size in enumerate(SIZES):
        draws = [i - offsets[d] for i in stream if source_of(i) == d]
        epochs = len(draws) // size
        assert epochs >= 2, "too few draws to see a source's epochs: the test proves nothing"
        for e in range(epochs):
            window = draws[e * size : (e + 1) * size]
            assert sorted(window) == list(range(size)), f"source {d} epoch {e} repeats or misses a sample"
            if not shuffle:
                assert window == list(range(size))
        if shuffle:
            assert draws[:size] != draws[size : 2 * size], f"source {d} reuses its permutation each epoch"


def test_every_block_source_and_epoch_has_its_own_generator_seed():
    small = range(4)
    perms = {mixed_seed(_PERMS_TAG, seed, d, e) for seed in small for d in small for e in small}
    draws = {mixed_seed(_DRAWS_TAG, seed, b) for seed in small for b in small}
    assert len(perms) == 64 and len(draws) == 16 and not perms & draws
    s = MixtureBatchSampler([BLOCK, BLOCK], [1, 1], 4)
    assert not np.array_equal(s._perm(0, 0), s._perm(1, 0))
    assert not np.array_equal(s._perm(0, 0), s._perm(0, 1))
    assert not np.array_equal(s._block(0), s._block(1))


def test_counts_are_the_consumed_draws_per_source_and_survive_a_state_round_trip():
    s = MixtureBatchSampler(SIZES, WEIGHTS, 5, dp_rank=1, dp_world_size=3, seed=8)
    ref = MixtureBatchSampler(SIZES, WEIGHTS, 15, seed=8)  # one process reading the global stream
    consumed = [i for batch in take(ref, 13) for i in batch]
    take(s, 20)
    assert s.counts == (0, 0, 0) and s.position == 0  # iterating is not consuming
    s.consume(6)
    s.consume(7)
    assert s.position == 13 * 15
    assert s.counts == tuple(sum(source_of(i) == d for i in consumed) for d in range(3))
    state = s.state_dict()
    assert state["kind"] == "mixture" and state["counts"] == list(s.counts) and state["position"] == 195
    other = MixtureBatchSampler(SIZES, WEIGHTS, 5, dp_rank=1, dp_world_size=3, seed=8)
    assert other.load_state_dict(state) == []
    assert other.counts == s.counts and other.position == s.position and other.state_dict() == state


def test_resume_on_the_same_world_size_is_exact():
    steps = 25
    uninterrupted = [take(s, steps) for s in rank_samplers(4, 2, seed=9)]
    runs = rank_samplers(4, 2, seed=9)
    for s in runs:
        s.consume(11)
    resumed = rank_samplers(4, 2, seed=9)
    for r, s in enumerate(resumed):
        assert s.load_state_dict(runs[r].state_dict()) == []
        assert take(s, steps - 11) == uninterrupted[r][11:]
        assert (
            take(runs[r], steps - 11) == uninterrupted[r][11:]
        )  # a fresh iter() starts at the consumed position


@pytest.mark.parametrize("new_b,new_w", [(2, 4), (12, 1), (1, 3), (5, 2)])
def test_resume_on_another_world_or_batch_size_continues_the_global_stream(new_b, new_w):
    old = rank_samplers(3, 2, seed=4)
    for s in old:
        s.consume(9)  # 54 samples
    state = old[0].state_dict()
    new = rank_samplers(new_b, new_w, seed=4)
    notes = [s.load_state_dict(state) for s in new]
    assert all(len(n) == 1 and "grouped into different batches" in n[0] for n in notes)
    steps = 12
    got = [i for batch in global_stream(new, steps) for i in batch]
    single = [
        i
        for batch in take(MixtureBatchSampler(SIZES, WEIGHTS, 1, seed=4), 54 + steps * new_b * new_w)
        for i in batch
    ]
    assert got == single[54:]  # nothing repeated, nothing skipped


def test_changed_weights_continue_from_the_saved_counts():
    old = MixtureBatchSampler(SIZES, WEIGHTS, 10, seed=6)
    old.consume(8)
    state = old.state_dict()
    new = MixtureBatchSampler(SIZES, [0.1, 0.1, 0.8], 10, seed=6)
    notes = new.load_state_dict(state)
    assert len(notes) == 1 and "weights changed" in notes[0]
    assert new.counts == old.counts and new.position == 80
    stream = [i for batch in take(new, 10) for i in batch]
    # Each source continues its own order where it stopped: the next draws from source d are its
    # draws number counts[d], counts[d] + 1, ... of the same permutations.
    long_run = MixtureBatchSampler(SIZES, WEIGHTS, 1, seed=6)
    for d, size in enumerate(SIZES):
        mine = [i for i in stream if source_of(i) == d]
        n = old.counts[d]
        expected = [
            long_run._elements(d, torch.tensor([n + j])).item() + sum(SIZES[:d]) for j in range(len(mine))
        ]
        assert mine == expected
    # The new weights decide the draws from here on: source 2 now dominates.
    assert sum(source_of(i) == 2 for i in stream) > 50
    new.consume(10)
    assert sum(new.counts) == new.position == 180


def test_load_rejects_other_sources_another_kind_and_malformed_states():
    good = MixtureBatchSampler(SIZES, WEIGHTS, 4, seed=1)
    good.consume(3)
    state = good.state_dict()
    with pytest.raises(ValueError, match="sizes"):
        MixtureBatchSampler([50, 7, 24], WEIGHTS, 4).load_state_dict(state)
    with pytest.raises(ValueError, match="not a mixture's"):
        MixtureBatchSampler(SIZES, WEIGHTS, 4).load_state_dict(ShardedBatchSampler(80, 4).state_dict())
    with pytest.raises(ValueError, match="not a ShardedBatchSampler's"):
        ShardedBatchSampler(80, 4).load_state_dict(state)
    c = state["counts"]
    for bad in (
        {"counts": [-1, c[1], c[2] + c[0] + 1]},  # negative
        {"counts": [*c, 0]},  # wrong length (the right sum)
        {"counts": [c[0] + 1, c[1], c[2]]},  # not summing to the position
        {"counts": [float(x) for x in c]},  # not whole numbers
        {"position": -12, "counts": [0, 0, 0]},
        {"position": "12"},
    ):
        fresh = MixtureBatchSampler(SIZES, WEIGHTS, 4, seed=1)
        with pytest.raises(ValueError):
            fresh.load_state_dict({**state, **bad})
        assert fresh.position == 0 and fresh.counts == (0, 0, 0), "a refused state changed the sampler"


def test_the_checkpoint_seed_wins():
    state = MixtureBatchSampler(SIZES, WEIGHTS, 4, seed=3).state_dict()
    s = MixtureBatchSampler(SIZES, WEIGHTS, 4, seed=99)
    notes = s.load_state_dict(state)
    assert s.seed == 3 and len(notes) == 1 and "checkpoint's seed=3" in notes[0]
    assert take(s, 5) == take(MixtureBatchSampler(SIZES, WEIGHTS, 4, seed=3), 5)


def test_argument_checks_and_endlessness():
    s = MixtureBatchSampler(SIZES, WEIGHTS, 4)
    with pytest.raises(TypeError):
        len(s)
    assert len(take(s, 100)) == 100
    assert len(MixtureBatchSampler(SIZES, WEIGHTS, 4, max_batches=3)) == 3
    assert s.num_samples == 80 and s.global_batch_size == 4
    assert MixtureBatchSampler([5], [2.0], 64).weights == (1.0,)  # a batch larger than the data is fine
    for args, match in (
        (([], [], 4), "at least one source"),
        (([5, 5], [1.0], 4), "one weight per source"),
        (([5, 0], [1, 1], 4), r"sizes\[1\]"),
        (([5, 5], [1, 0], 4), r"weights\[1\] must be a finite number > 0, got 0"),
        (([5, 5], [1, -2.5], 4), r"got -2.5"),
        (([5, 5], [1, float("nan")], 4), r"weights\[1\]"),
        (([5, 5], [1, float("inf")], 4), r"weights\[1\]"),
        (([5, 5], [1, 1], 0), "batch_size"),
    ):
        with pytest.raises(ValueError, match=match):
            MixtureBatchSampler(*args)
    with pytest.raises(ValueError, match="dp_rank"):
        MixtureBatchSampler(SIZES, WEIGHTS, 4, dp_rank=2, dp_world_size=2)


def test_a_map_data_source_over_a_mixture():
    data = TensorDataset(torch.arange(sum(SIZES)))
    order = MixtureBatchSampler(SIZES, WEIGHTS, 4, seed=2)
    src = MapDataSource(data, order, device=torch.device("cpu"), seed=0)
    assert src.resumable and src.num_samples == 80
    expected = take(MixtureBatchSampler(SIZES, WEIGHTS, 4, seed=2), 7)
    it = iter(src)
    got = [next(it)[0].tolist() for _ in range(4)]
    assert got == expected[:4]
    state = src.state_dict()
    assert state["position"] == 16 and sum(state["counts"]) == 16
    again = MapDataSource(
        data, MixtureBatchSampler(SIZES, WEIGHTS, 4, seed=2), device=torch.device("cpu"), seed=0
    )
    assert again.load_state_dict(state) == []
    it = iter(again)
    assert [next(it)[0].tolist() for _ in range(3)] == expected[4:]
    seven = MixtureBatchSampler(SIZES, WEIGHTS, 4, seed=2)
    seven.consume(7)
    assert again.state_dict() == seven.state_dict()


def test_keyed_batches_name_each_draw_by_its_stream_position():
    s = MixtureBatchSampler(SIZES, WEIGHTS, 4, dp_rank=1, dp_world_size=2, seed=3)
    total = sum(SIZES)
    plain, keyed = iter(s), s.keyed_batches()
    for k in range(30):
        batch = next(keyed)
        assert [i for i, _ in batch] == next(plain)
        assert [key for _, key in batch] == [divmod(k * 8 + 4 + j, total) for j in range(4)]
