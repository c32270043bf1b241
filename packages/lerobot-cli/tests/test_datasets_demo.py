"""The reader on the shipped demo dataset (data/lerobot/demo_reach),
as the README's training command sees it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot_cli.datasets import (
    DatasetConfig,
    LeRobotDataset,
    dataset_to_policy_features,
    make_dataset,
    resolve_delta_timestamps,
    split_policy_features,
)
from lerobot_cli.features import FeatureType

DATA = Path(__file__).resolve().parents[3] / "data"
ROOT = DATA / "lerobot" / "demo_reach"
CAMERA = "observation.images.top"


@pytest.fixture(scope="module")
def dataset() -> LeRobotDataset:
    info = json.loads((ROOT / "meta/info.json").read_text())
    return LeRobotDataset(ROOT, delta_timestamps={"action": [i / info["fps"] for i in range(10)]})


def test_shipped_copy_is_small_and_multi_file() -> None:
    files = [p for p in ROOT.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 5 * 1024**2
    assert len(list((ROOT / "data").glob("chunk-*/file-*.parquet"))) >= 2
    assert len(list((ROOT / "videos" / CAMERA).glob("chunk-*/file-*.mp4"))) >= 2
    info = json.loads((ROOT / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] >= 20


def test_items_have_lerobot_keys_shapes_and_dtypes(dataset: LeRobotDataset) -> None:
    assert len(dataset) == dataset.meta.total_frames == dataset.num_frames
    item = dataset[len(dataset) // 2]
    assert item["observation.state"].shape == (2,) and item["observation.state"].dtype == torch.float32
    assert item["observation.environment_state"].shape == (2,)
    assert item["action"].shape == (10, 2) and item["action_is_pad"].dtype == torch.bool
    image = item[CAMERA]
    assert (
        image.shape == (3, 64, 64) and image.dtype == torch.float32 and 0 <= image.min() <= image.max() <= 1
    )
    assert image.std() > 0.05  # a rendered scene, not a blank frame
    for key in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert item[key].shape == ()
    assert item["task"] == "Move the blue dot onto the red target."


def test_action_chunk_pads_past_the_episode_end(dataset: LeRobotDataset) -> None:
    eps = dataset.meta.episodes
    end = int(eps["dataset_to_index"][0])
    item = dataset[end - 3]  # 3 frames before the end of episode 0
    assert item["action_is_pad"].tolist() == [False] * 3 + [True] * 7
    last_action = dataset[end - 1]["action"][0]
    assert torch.equal(item["action"][3:], last_action.expand(7, 2))  # clamped to the last frame
    assert torch.equal(item["action"][0], dataset[end - 3]["action"][0])


def test_stats_match_the_data(dataset: LeRobotDataset) -> None:
    actions = torch.stack([dataset[i]["action"][0] for i in range(len(dataset))]).double().numpy()
    stats = dataset.meta.stats["action"]
    np.testing.assert_allclose(stats["mean"], actions.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats["std"], actions.std(0), rtol=1e-4)
    np.testing.assert_allclose(stats["min"], actions.min(0))
    np.testing.assert_allclose(stats["max"], actions.max(0))
    assert stats["count"].tolist() == [len(dataset)]
    assert dataset.meta.stats[CAMERA]["mean"].shape == (3, 1, 1)


def test_policy_features_and_delta_timestamps(dataset: LeRobotDataset) -> None:
    features = dataset_to_policy_features(dataset.meta.features)
    assert {k: (f.type, f.shape) for k, f in features.items()} == {
        "observation.state": (FeatureType.STATE, (2,)),
        "observation.environment_state": (FeatureType.ENV, (2,)),
        CAMERA: (FeatureType.VISUAL, (3, 64, 64)),
        "action": (FeatureType.ACTION, (2,)),
    }
    inputs, outputs = split_policy_features(features)
    assert list(outputs) == ["action"] and "action" not in inputs
    deltas = resolve_delta_timestamps(dataset.meta.features, dataset.fps, action_delta_indices=range(3))
    assert deltas == {"action": [0.0, 0.1, 0.2]}


def test_make_dataset_from_config_with_episode_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_LEROBOT_HOME", str(DATA))  # how the README's command finds the shipped copy
    ds = make_dataset(DatasetConfig(repo_id="lerobot/demo_reach", episodes=[0, 3, 5]))
    lengths = ds.meta.episodes["length"]
    assert ds.num_episodes == 3 and len(ds) == int(lengths.sum())
    assert sorted({ds[i]["episode_index"].item() for i in range(len(ds))}) == [0, 3, 5]


def test_dataloader_workers_0_and_2_give_the_same_batches(dataset: LeRobotDataset) -> None:
    subset = torch.utils.data.Subset(dataset, range(0, len(dataset), 9))  # spans every data and video file
    runs = []
    for workers in (0, 2):
        runs.append(list(torch.utils.data.DataLoader(subset, batch_size=8, num_workers=workers)))
    for a, b in zip(*runs, strict=True):
        for key in (CAMERA, "action", "action_is_pad", "index"):
            assert torch.equal(a[key], b[key])


def test_metadata_modules_do_not_import_torch() -> None:
    code = (
        "import sys, lerobot_cli.datasets as d, lerobot_cli.datasets.config, lerobot_cli.datasets.writer;"
        f"m = d.load_meta({str(ROOT)!r}); d.dataset_to_policy_features(m.features);"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
