"""``MapDataSource``: one owner of the order, the loader, the placement and the preparation of batches.

Its position is what the consumer took, never what the workers prefetched; its state resumes the exact
next batch; placement leaves HOST_KEYS on the host and ``prepare`` sees placed batches; ``close`` ends
the workers; and a ``TrainLoop`` given ``data=`` leaves the counting to it."""

from __future__ import annotations

import pytest
import torch
from lerobot_parallel.plan import build_plan
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.wrap import wrap_model
from lerobot_trainloop import DataSource, MapDataSource, ShardedBatchSampler, TrainLoop, resumable_loader
from lerobot_trainloop.evaluation import EvalBatches
from lerobot_trainloop.testing import SyntheticRegression, TinyRegressor

DATA = SyntheticRegression(40, seed=1)
B = 4
WORKERS = {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 2}


class CountingSampler(ShardedBatchSampler):
    """Counts the index batches the DataLoader asked for (what the workers were sent)."""

    yielded = 0

    def __iter__(self):
        for batch in super().__iter__():
            self.yielded += 1
            yield batch


def source(order=None, **kw) -> MapDataSource:
    order = order if order is not None else ShardedBatchSampler(len(DATA), B, seed=3)
    kw.setdefault("device", torch.device("cpu"))
    kw.setdefault("seed", 0)
    return MapDataSource(DATA, order, **kw)


def take(src, n: int) -> list[list[int]]:
    it = iter(src)
    return [next(it)["index"].tolist() for _ in range(n)]


def test_it_is_a_data_source():
    assert isinstance(source(), DataSource)


def test_the_position_is_what_the_consumer_took_not_what_the_workers_prefetched():
    order = CountingSampler(len(DATA), B, seed=3)
    src = source(order, loader_kwargs=WORKERS)
    try:
        it = iter(src)
        for taken in range(1, 4):
            next(it)
            assert src.state_dict()["offset"] == taken * B
        assert order.yielded > 3, "the workers were sent no batch ahead: the test proves nothing"
        assert src.handed_out == 3
    finally:
        src.close()


def test_a_loaded_state_resumes_the_exact_next_batch():
    reference = take(source(), 13)  # past an epoch's end (40 samples = 10 batches)
    first = source(loader_kwargs=WORKERS)
    try:
        assert take(first, 11) == reference[:11]
        state = first.state_dict()
    finally:
        first.close()
    resumed = source(ShardedBatchSampler(len(DATA), B, seed=99))
    notes = resumed.load_state_dict(state)
    assert any("seed=3" in n for n in notes)  # the saved permutation wins, and says so
    assert take(resumed, 2) == reference[11:13]


def test_rows_are_read_while_the_order_counts_positions():
    rows = list(range(0, 40, 2))  # 20 positions
    src = source(ShardedBatchSampler(len(rows), B, seed=0), rows=rows)
    batches = take(src, 2)
    assert all(i % 2 == 0 for b in batches for i in b)
    assert src.num_samples == 20 and src.state_dict()["num_samples"] == 20
    assert src.state_dict()["offset"] == 2 * B


def test_placement_keeps_host_keys_on_the_host_and_prepare_sees_placed_batches():
    seen = []

    def prepare(batch):
        seen.append({k: v.device.type for k, v in batch.items()})
        return {**batch, "prepared": True}

    meta = torch.device("meta")  # any device but the host's: the placement is visible on a CPU machine
    src = source(device=meta, prepare=prepare)
    batch = next(iter(src))
    assert batch["prepared"] is True
    assert seen == [{"x": "meta", "y": "meta", "index": "cpu"}]
    assert batch["x"].device == meta and batch["index"].device.type == "cpu"


@pytest.mark.parametrize("shielded", [True, False])
def test_close_ends_the_workers(shielded):
    src = source(loader_kwargs={**WORKERS, "shielded": shielded})
    it = iter(src)
    next(it)
    workers = list(src.loader._iterator._workers)
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    src.close()
    for w in workers:
        w.join(timeout=10)
    assert not any(w.is_alive() for w in workers)


def test_a_fixed_order_has_no_position_and_repeats_the_whole_set():
    src = source(EvalBatches(list(range(10)), B))
    once = [b["index"].tolist() for b in src]
    assert once == [b["index"].tolist() for b in src] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert src.state_dict() == {} and src.load_state_dict({}) == []
    with pytest.raises(ValueError, match="fixed order"):
        src.load_state_dict({"epoch": 0, "offset": 4})


def _loop(**kw) -> TrainLoop:
    rt = ParallelRuntime.single("cpu")
    model = TinyRegressor(seed=0)
    wrapped = wrap_model(model, rt, build_plan(model, rt))
    return TrainLoop(wrapped, torch.optim.SGD(model.parameters(), lr=0.01), **kw)


def test_a_loop_on_a_source_saves_the_position_a_sampler_would():
    src = source(loader_kwargs=WORKERS)
    sampler = ShardedBatchSampler(len(DATA), B, seed=3)
    try:
        by_source = _loop(data=src)
        by_source.run(src, 7)
        by_sampler = _loop(sampler=sampler)
        by_sampler.run(resumable_loader(DATA, sampler, seed=0), 7)
    finally:
        src.close()
    assert by_source.position is src and by_sampler.position is sampler
    assert src.state_dict() == {**sampler.state_dict(), "offset": 7 * B}
    with pytest.raises(ValueError, match="not both"):
        _loop(data=src, sampler=sampler)
