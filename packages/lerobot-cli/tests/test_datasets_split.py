"""``--dataset.eval_split``: LeRobot's per-task rule (the last ceil(n x split) episodes of each task are
held out), disjoint from the training episodes, combined with ``--dataset.episodes``; the training
sampler never draws a held-out frame over a whole epoch on any dp rank; ``--max_eval_samples`` caps
the frames per task; bad values are refused in one sentence."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from lerobot_cli.datasets import DatasetConfig, DatasetError, LeRobotDataset, load_meta
from lerobot_cli.datasets.split import eval_sample_indices, split_episodes
from lerobot_cli.datasets.writer import EpisodeData, write_dataset
from lerobot_trainloop import ShardedBatchSampler

TASKS = ["pick", "place", "push"]
# 11 episodes: task of episode e is TASKS[e % 3] except the last one, a task of its own
LENGTHS = [5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 4]


def _episode(ep: int, length: int) -> EpisodeData:
    t = np.arange(length)
    return EpisodeData(
        task="solo" if ep == len(LENGTHS) - 1 else TASKS[ep % 3],
        frames={
            "observation.state": np.stack([ep * 100 + t, -t], axis=1).astype(np.float32),
            "action": np.stack([ep + t, t], axis=1).astype(np.float32),
        },
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    features = {
        "observation.state": {"dtype": "float32", "shape": [2], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
    }
    return write_dataset(
        tmp_path_factory.mktemp("split") / "ds", 10, features, (_episode(e, n) for e, n in enumerate(LENGTHS))
    )


def test_per_task_the_last_episodes_are_held_out(root):
    split = split_episodes(load_meta(root), 0.25)
    # pick: 0,3,6,9 -> ceil(1.0)=1 held out (9); place: 1,4,7 -> ceil(0.75)=1 (7); push: 2,5,8 -> 8; solo: 10
    assert split.eval == (7, 8, 9, 10)
    assert split.train == (0, 1, 2, 3, 4, 5, 6)
    assert split.tasks == 4 and split.whole_tasks == ("solo",)
    assert split_episodes(load_meta(root), 0.5).eval == (
        4,
        5,
        6,
        7,
        8,
        9,
        10,
    )  # ceil(2.0), ceil(1.5) x2, solo


def test_it_splits_the_episodes_selection(root):
    meta = load_meta(root).select([0, 1, 3, 4, 6])
    split = split_episodes(meta, 0.4)  # pick: 0,3,6 -> 2 held out; place: 1,4 -> 1
    assert split.train == (0, 1) and split.eval == (3, 4, 6)


def test_everything_held_out_is_refused(root):
    with pytest.raises(DatasetError, match=r"--dataset.eval_split=0.5 holds out every one of the 2 episodes"):
        split_episodes(load_meta(root).select([0, 1]), 0.5)


@pytest.mark.parametrize("value", [1.0, -0.1, 1.5, True, "x"])
def test_invalid_fractions_are_refused(value):
    with pytest.raises(ValueError, match=r"--dataset.eval_split must be a fraction in \[0, 1\)"):
        DatasetConfig(repo_id="a/b", eval_split=value)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_training_sampler_never_yields_a_held_out_frame_in_a_whole_epoch(root, world):
    split = split_episodes(load_meta(root), 0.3)
    train = LeRobotDataset(root, episodes=split.train)
    held = LeRobotDataset(root, episodes=split.eval)
    held_frames = {int(held[i]["index"]) for i in range(len(held))}
    drawn = set()
    for rank in range(world):
        sampler = ShardedBatchSampler(len(train), 2, dp_rank=rank, dp_world_size=world, seed=5)
        for batch in _one_epoch(sampler, len(train), world):
            for i in batch:
                item = train[i]
                drawn.add(int(item["index"]))
                assert int(item["episode_index"]) in split.train
    assert not drawn & held_frames
    expected = {int(train[i]["index"]) for i in range(len(train))}
    assert drawn == expected  # the whole training set was drawn: the check covered an epoch
    assert len(held_frames) == sum(LENGTHS[e] for e in split.eval)


def _one_epoch(sampler: ShardedBatchSampler, n: int, world: int):
    """This rank's batches until the global stream covered n samples (one epoch)."""
    it = iter(sampler)
    for _ in range(math.ceil(n / (2 * world))):
        yield next(it)


def test_max_eval_samples_takes_the_first_frames_of_each_task():
    task_index = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    assert eval_sample_indices(task_index, 0) == list(range(9))
    assert eval_sample_indices(task_index, 6) == [0, 1, 3, 4, 5, 6]  # 6 // 3 tasks = 2 each
    assert eval_sample_indices(task_index, 2) == [0, 3, 5]  # at least one per task


def test_drop_n_last_frames_never_starts_a_sample_at_an_episode_end(root):
    """LeRobot's drop_n_last_frames (diffusion: 7): the sampler draws positions, SubsetBatches maps them to
    rows that are not among the last n frames of their episode; one epoch draws each such row once."""
    from lerobot_trainloop import SubsetBatches

    ds = LeRobotDataset(root)
    rows = ds.rows_without_last(2)
    assert len(rows) == sum(n - 2 for n in LENGTHS)
    sampler = ShardedBatchSampler(len(rows), 3, seed=1)
    drawn = [r for batch in _one_epoch_exact(SubsetBatches(sampler, rows), len(rows), 3) for r in batch]
    assert sorted(drawn[: len(rows)]) == sorted(rows.tolist())
    for r in drawn:
        item = ds[r]
        assert int(item["frame_index"]) < LENGTHS[int(item["episode_index"])] - 2
    assert len(ds.rows_without_last(0)) == len(ds)
    assert len(ds.rows_without_last(7)) == 0  # every episode has at most 7 frames


def test_its_help_says_what_the_sampler_does():
    """The help used to say the frames were recorded but not dropped; the test above shows they are."""
    from lerobot_cli.cli.build import known_flags
    from lerobot_cli.policies import config_class

    text = known_flags(config_class("diffusion"))["policy.drop_n_last_frames"].help
    assert "never start a training sample" in text and "not drop" not in text


def _one_epoch_exact(batches, n: int, batch_size: int):
    it = iter(batches)
    for _ in range(math.ceil(n / batch_size)):
        yield next(it)
