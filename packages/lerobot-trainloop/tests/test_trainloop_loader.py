"""``resumable_loader``: making an iterator leaves the global RNG alone, so a resume continues exactly."""

import pytest
import torch
from lerobot_trainloop import ShardedBatchSampler, resumable_loader
from torch.utils.data import DataLoader


def _draw_after_iter(make) -> torch.Tensor:
    torch.manual_seed(7)
    next(iter(make()))
    return torch.rand(3)


def test_an_iterator_does_not_shift_the_global_rng():
    data = list(range(20))
    sampler = ShardedBatchSampler(len(data), 4, seed=0)
    torch.manual_seed(7)
    untouched = torch.rand(3)
    assert torch.equal(_draw_after_iter(lambda: resumable_loader(data, sampler, seed=1)), untouched)
    # what it prevents: a plain DataLoader's iterator draws its workers' base seed from the global RNG
    assert not torch.equal(_draw_after_iter(lambda: DataLoader(data, batch_sampler=sampler)), untouched)


def test_the_sampler_decides_the_order():
    data = list(range(20))
    sampler = ShardedBatchSampler(
        len(data), 4, dp_rank=1, dp_world_size=2, seed=3, max_batches=5
    )  # else endless
    expected = [list(map(int, b)) for b in sampler]
    assert [b.tolist() for b in resumable_loader(data, sampler, seed=0)] == expected
    with pytest.raises(TypeError, match="sets batch_sampler itself"):
        resumable_loader(data, sampler, seed=0, batch_sampler=sampler)
