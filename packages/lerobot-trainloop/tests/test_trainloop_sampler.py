"""Sharded resumable sampler: ranks simulated in one process (the sampler is pure arithmetic on a
shared permutation); real ranks through a DataLoader are checked in tests/test_engine_multiproc.py."""

from __future__ import annotations

import logging
from itertools import islice

import pytest
import torch
from lerobot_trainloop.sampler import ShardedBatchSampler, epoch_permutation, epoch_seed
from lerobot_trainloop.testing import SyntheticRegression
from torch.utils.data import DataLoader


def rank_samplers(n, b, w, **kw):
    return [ShardedBatchSampler(n, b, dp_rank=r, dp_world_size=w, **kw) for r in range(w)]


def take(sampler, steps):
    return list(islice(iter(sampler), steps))


@pytest.mark.parametrize("n,b,w", [(24, 3, 2), (20, 3, 2), (17, 2, 4), (10, 5, 1), (64, 4, 3)])
def test_disjoint_and_full_coverage_per_epoch(n, b, w):
    g = b * w
    steps = n * 3 // g + 2  # more than three epochs' worth, ending mid-epoch when n % g
    per_rank = [take(s, steps) for s in rank_samplers(n, b, w, seed=5)]
    stream = []  # global batches in rank order = the stream
    for k in range(steps):
        global_batch = [i for r in range(w) for i in per_rank[r][k]]
        if (k * g) // n == ((k + 1) * g - 1) // n:  # inside one epoch: ranks never share a sample
            assert len(set(global_batch)) == len(global_batch), "ranks overlap inside an epoch"
        # (a batch straddling two epochs may hold a sample once from each: documented)
        stream.extend(global_batch)
    for e in range(3):
        epoch = stream[e * n : (e + 1) * n]
        assert sorted(epoch) == list(range(n)), f"epoch {e} does not cover every sample exactly once"
        assert epoch == epoch_permutation(n, 5, e).tolist()


def test_tail_spills_into_next_epoch():
    # 20 samples, global batch 6: step 4 takes 2 samples of epoch 0 and 4 of epoch 1.
    s = ShardedBatchSampler(20, 6, seed=0)
    batches = take(s, 4)
    p0, p1 = epoch_permutation(20, 0, 0).tolist(), epoch_permutation(20, 0, 1).tolist()
    assert batches[3] == p0[18:] + p1[:4]


def test_same_permutation_on_every_rank_and_new_one_each_epoch():
    a, b = rank_samplers(30, 5, 2, seed=11)
    assert a._perm(0).tolist() == b._perm(0).tolist()
    assert epoch_permutation(30, 11, 0).tolist() != epoch_permutation(30, 11, 1).tolist()
    assert epoch_permutation(30, 11, 0).tolist() != epoch_permutation(30, 12, 0).tolist()
    assert epoch_seed(1, 0) != epoch_seed(0, 1)
    assert ShardedBatchSampler(8, 2, shuffle=False).indices_at(0, 8) == list(range(8))


def test_contiguous_rank_slices_of_each_global_batch():
    samplers = rank_samplers(40, 4, 2, seed=1)
    perm = epoch_permutation(40, 1, 0).tolist()
    assert take(samplers[0], 2) == [perm[0:4], perm[8:12]]
    assert take(samplers[1], 2) == [perm[4:8], perm[12:16]]


def test_state_is_consumed_position_and_resume_is_exact():
    s = ShardedBatchSampler(20, 3, dp_rank=1, dp_world_size=2, seed=4)
    first = take(s, 5)
    assert s.state_dict()["offset"] == 0  # iterating is not consuming
    s.consume(4)
    state = s.state_dict()
    assert (state["epoch"], state["offset"]) == (1, 4)  # 4 x 6 = 24 = 20 + 4
    resumed = ShardedBatchSampler(20, 3, dp_rank=1, dp_world_size=2, seed=4)
    resumed.load_state_dict(state)
    assert take(resumed, 1) == [first[4]]
    assert take(s, 1) == [first[4]]  # a fresh iter() restarts at the consumed position


@pytest.mark.parametrize("new_b,new_w", [(2, 4), (6, 1), (1, 3)])
def test_resume_with_other_world_or_batch_continues_the_same_stream(new_b, new_w):
    old = ShardedBatchSampler(30, 3, dp_rank=0, dp_world_size=2, seed=9)
    old.consume(7)  # 42 samples: epoch 1, offset 12
    state = old.state_dict()
    new = rank_samplers(30, new_b, new_w, seed=9)
    notes = [s.load_state_dict(state) for s in new]
    assert all(len(n) == 1 and "grouped into different batches" in n[0] for n in notes)
    steps = 5
    per_rank = [take(s, steps) for s in new]
    got = [i for k in range(steps) for r in range(new_w) for i in per_rank[r][k]]
    assert got == old.indices_at(42, steps * new_b * new_w)


def test_load_rejects_other_dataset_and_adopts_saved_seed(caplog):
    state = ShardedBatchSampler(20, 2, seed=3).state_dict()
    with pytest.raises(ValueError, match="saved for 20 samples"):
        ShardedBatchSampler(21, 2).load_state_dict(state)
    s = ShardedBatchSampler(20, 2, seed=99)
    with caplog.at_level(logging.WARNING):
        notes = s.load_state_dict(state)
    assert caplog.text == ""  # returned, not logged: the caller says it once
    assert s.seed == 3 and len(notes) == 1 and "checkpoint's seed=3" in notes[0]
    assert ShardedBatchSampler(20, 2, seed=3).load_state_dict(state) == []
    assert take(s, 1)[0] == epoch_permutation(20, 3, 0).tolist()[:2]


def test_dataloader_with_workers_prefetches_but_state_follows_consumption():
    ds = SyntheticRegression(40, seed=0)
    sampler = ShardedBatchSampler(len(ds), 4, dp_rank=1, dp_world_size=2, seed=2)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=2, prefetch_factor=2)
    expected = take(sampler, 6)
    it = iter(loader)
    got = []
    for _ in range(3):
        got.append(next(it)["index"].tolist())
        sampler.consume()
    del it  # workers have pulled further batches than the three we trained on
    assert got == expected[:3]
    assert sampler.state_dict()["offset"] == 24
    got_after = next(iter(loader))["index"].tolist()
    assert got_after == expected[3]


def test_index_sampler_for_plain_dataloader_batching():
    ds = SyntheticRegression(30, seed=0)
    sampler = ShardedBatchSampler(len(ds), 5, dp_rank=0, dp_world_size=2, seed=1, max_batches=4)
    batches = [b["index"].tolist() for b in DataLoader(ds, sampler=sampler.index_sampler(), batch_size=5)]
    assert batches == take(sampler, 4)
    assert len(sampler) == 4 and len(sampler.index_sampler()) == 20


def test_endless_without_max_batches_and_argument_checks():
    s = ShardedBatchSampler(10, 2)
    with pytest.raises(TypeError):
        len(s)
    assert len(take(s, 50)) == 50
    assert s.batches_per_epoch == 5
    with pytest.raises(ValueError, match="dp_rank"):
        ShardedBatchSampler(10, 2, dp_rank=2, dp_world_size=2)
    with pytest.raises(ValueError, match="larger than the dataset"):
        ShardedBatchSampler(10, 6, dp_world_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        ShardedBatchSampler(10, 0)


def test_set_epoch_for_epoch_style_trainers():
    s = ShardedBatchSampler(10, 3, seed=0, max_batches=3)
    s.set_epoch(2)
    assert take(s, 3) == [epoch_permutation(10, 0, 2).tolist()[i : i + 3] for i in (0, 3, 6)]
    assert torch.equal(s._perm(2), epoch_permutation(10, 0, 2))


def test_keyed_batches_pair_each_index_with_its_epoch():
    """``keyed_batches`` is ``iter()`` with each index's (epoch, index): the same on every topology and
    after a resume, unique over the run."""
    from lerobot_trainloop.sampler import SubsetBatches

    n, b = 10, 3
    s = ShardedBatchSampler(n, b, seed=4)
    plain, keyed = iter(s), s.keyed_batches()
    pairs = []
    for _ in range(8):  # 24 samples: two epochs and a part, batches straddling the boundaries
        batch = next(keyed)
        assert [i for i, _ in batch] == next(plain)
        pairs += batch
    assert all(key == (pos // n, i) for pos, (i, key) in enumerate(pairs))
    assert len({key for _, key in pairs}) == len(pairs)
    ranks = [ShardedBatchSampler(n, 1, dp_rank=r, dp_world_size=3, seed=4).keyed_batches() for r in range(3)]
    spread = [key for _ in range(8) for r in ranks for _, key in next(r)]
    assert spread == [key for _, key in pairs]  # another topology: the same keys in the same order
    s.consume(5)
    assert next(s.keyed_batches()) == pairs[15:18]  # a resumed position
    rows = [100 + i for i in range(n)]
    sub = next(SubsetBatches(ShardedBatchSampler(n, b, seed=4), rows).keyed_batches())
    assert sub == [(rows[i], key) for i, key in pairs[:3]]
