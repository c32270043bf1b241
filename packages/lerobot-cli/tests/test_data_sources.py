"""``make_data_sources``: the training and held-out sources a run gets from its workload.

The training source samples only the frames that may start a sample (``drop_n_last_frames``) and counts
its position over them; batches reach the preprocessor on the device with float cameras; the held-out
source exists only with ``--eval_steps`` and a held-out split, and ``close`` ends both. A fake workload,
so the wiring is checked without a policy."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lerobot_cli.data_source import make_data_sources
from lerobot_cli.datasets import DatasetError
from lerobot_cli.datasets.image_transforms import AugmentItem, ImageTransforms, ImageTransformsConfig
from lerobot_parallel.runtime import ParallelRuntime
from torch.utils.data import Dataset

CAM = "observation.images.cam"
FRAMES_PER_EPISODE = 5


class Frames(Dataset):
    """``n`` frames in episodes of 5, each a uint8 camera and its index."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.task_index = torch.zeros(n, dtype=torch.int64).numpy()
        self.meta = SimpleNamespace(camera_keys=[CAM])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {CAM: torch.full((1, 2, 2), 255, dtype=torch.uint8), "index": torch.tensor(i)}

    def rows_without_last(self, n: int) -> list[int]:
        return [i for i in range(self.n) if i % FRAMES_PER_EPISODE < FRAMES_PER_EPISODE - n]


def workload(dropped: int = 0, eval_frames: int | None = None):
    seen = []

    def pre(batch):
        seen.append(batch[CAM].dtype)
        return {**batch, "preprocessed": True}

    return SimpleNamespace(
        dataset=Frames(20),
        eval_dataset=Frames(eval_frames) if eval_frames else None,
        policy_config=SimpleNamespace(frames_dropped_per_episode=lambda: dropped),
        preprocessor=pre,
        seen=seen,
    )


def cfg(**kw):
    base = {
        "batch_size": 2,
        "seed": 0,
        "num_workers": 0,
        "eval_steps": 0,
        "max_eval_samples": 0,
        "prefetch_factor": 2,
        "persistent_workers": True,
        "dataloader_multiprocessing_context": None,
        "dataset": SimpleNamespace(episodes=None, image_transforms=ImageTransformsConfig()),
    }
    return SimpleNamespace(**{**base, **kw})


RT = ParallelRuntime.single("cpu")


def test_training_batches_are_prepared_and_skip_dropped_frames():
    wl = workload(dropped=2)
    data = make_data_sources(wl, cfg(), RT)
    assert data.held_out is None and data.all == (data.train,)
    assert data.train.num_samples == 12  # 3 of every 5 frames may start a sample
    it = iter(data.train)
    batches = [next(it) for _ in range(6)]
    rows = [i for b in batches for i in b["index"].tolist()]
    assert sorted(rows) == wl.dataset.rows_without_last(2)  # one epoch: every allowed frame once
    assert all(b["preprocessed"] and b[CAM].dtype == torch.float32 for b in batches)
    assert wl.seen == [torch.float32] * 6 and float(batches[0][CAM].max()) == 1.0
    assert data.train.state_dict()["offset"] == 0 and data.train.state_dict()["epoch"] == 1
    data.close()


def test_no_frame_left_to_train_on_names_the_flag():
    with pytest.raises(DatasetError, match="--policy.drop_n_last_frames=5 leaves no frame"):
        make_data_sources(workload(dropped=5), cfg(), RT)


def test_the_held_out_source_needs_eval_steps_and_a_split():
    assert make_data_sources(workload(eval_frames=5), cfg(), RT).held_out is None
    data = make_data_sources(workload(eval_frames=5), cfg(eval_steps=1, num_workers=1), RT)
    try:
        held = data.held_out
        assert held is not None and not held.resumable and held.order.num_samples == 5
        assert [b["index"].tolist() for b in held] == [[0, 1], [2, 3], [4]]
        assert all(b["preprocessed"] for b in held)
        assert len(data.all) == 2 and all(s.loaders for s in data.all)
    finally:
        data.close()
    assert held.loader._iterator is None  # close ended the persistent workers


class Pictures(Frames):
    """``n`` frames whose camera is a 3×8×8 uint8 picture of its own (so every transform changes it)."""

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        return {
            CAM: torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8, generator=g),
            "index": torch.tensor(i),
        }


AUGMENT = ImageTransformsConfig(enable=True, max_num_transforms=6)


def augmented(eval_frames=None, **kw):
    wl = workload(eval_frames=eval_frames)
    wl.dataset = Pictures(20)
    wl.eval_dataset = Pictures(eval_frames) if eval_frames else None
    dataset = SimpleNamespace(episodes=None, image_transforms=AUGMENT)
    return wl, make_data_sources(wl, cfg(dataset=dataset, **kw), RT)


def test_training_cameras_are_augmented_per_sample_key_and_held_out_ones_are_not():
    wl, data = augmented(eval_frames=4, eval_steps=1)
    expect = AugmentItem(ImageTransforms(AUGMENT), [CAM], seed=0)
    try:
        it = iter(data.train)
        seen: dict[int, list[torch.Tensor]] = {}
        for step in range(20):  # two epochs of 10 batches
            batch = next(it)
            for row, frames in zip(batch["index"].tolist(), batch[CAM], strict=True):
                raw = wl.dataset[row]
                assert torch.equal(frames, expect(raw, (step // 10, row))[CAM])  # key: (epoch, index)
                assert not torch.equal(frames, raw[CAM].float() / 255)
                seen.setdefault(row, []).append(frames)
        assert all(len(v) == 2 and not torch.equal(*v) for v in seen.values())  # each epoch its own draws
        for batch in data.held_out:  # the held-out frames as decoded, never augmented
            for row, frames in zip(batch["index"].tolist(), batch[CAM], strict=True):
                assert torch.equal(frames, wl.eval_dataset[row][CAM].float() / 255)
    finally:
        data.close()


def test_an_augmented_source_resumed_mid_epoch_draws_what_it_would_have():
    _, whole = augmented()
    it = iter(whole.train)
    batches = [next(it)[CAM] for _ in range(7)]
    _, first = augmented()
    it = iter(first.train)
    for _ in range(3):
        next(it)
    state = first.train.state_dict()
    _, resumed = augmented(num_workers=2)  # other workers: the same draws
    resumed.train.load_state_dict(state)
    try:
        it = iter(resumed.train)
        for want in batches[3:]:
            assert torch.equal(next(it)[CAM], want)
    finally:
        resumed.close()


def test_a_depth_camera_is_not_augmented():
    depth = "observation.images.depth"

    class WithDepth(Pictures):
        def __getitem__(self, i: int) -> dict:
            item = super().__getitem__(i)
            return {**item, depth: item[CAM].clone()}

    wl = workload()
    wl.dataset = WithDepth(20)
    wl.dataset.meta = SimpleNamespace(
        camera_keys=[CAM, depth], features={CAM: {}, depth: {"info": {"is_depth_map": True}}}
    )
    data = make_data_sources(wl, cfg(dataset=SimpleNamespace(episodes=None, image_transforms=AUGMENT)), RT)
    batch = next(iter(data.train))
    raw = [wl.dataset[i] for i in batch["index"].tolist()]
    assert torch.equal(batch[depth], torch.stack([r[depth] for r in raw]).float() / 255)
    assert not torch.equal(batch[CAM], batch[depth])
    data.close()
