"""The shipped PushT demo dataset (data/lerobot/demo_pusht): lerobot/pusht's features, statistics that
match its data, and the same frames as a fresh build by tools/make_demo_pusht.py (so the two cannot drift
apart). The rebuild needs lerobot-cli[pusht] (gym-pusht) and is skipped without it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lerobot_cli.datasets import load_meta

REPO = Path(__file__).resolve().parents[3]
ROOT = REPO / "data" / "lerobot" / "demo_pusht"
TOOL = REPO / "tools" / "make_demo_pusht.py"
CAMERA = "observation.image"
FEATURES = {  # lerobot/pusht's, with gym-pusht's 96x96 observation
    CAMERA: ("video", [96, 96, 3]),
    "observation.state": ("float32", [2]),
    "action": ("float32", [2]),
    "next.reward": ("float32", [1]),
    "next.done": ("bool", [1]),
    "next.success": ("bool", [1]),
    "timestamp": ("float32", [1]),
    "frame_index": ("int64", [1]),
    "episode_index": ("int64", [1]),
    "index": ("int64", [1]),
    "task_index": ("int64", [1]),
}
# PushT's reward (a shapely intersection area) can change in its last float64 bits between env instances
# (see test_env_pusht.py); stored as float32 it almost never shows, but a rebuild may differ there.
REWARD_RTOL = 1e-6


def _tool():
    spec = importlib.util.spec_from_file_location("make_demo_pusht", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _data(root: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted((root / "data").glob("chunk-*/file-*.parquet")))


def _column(table: pa.Table, key: str) -> np.ndarray:
    column = table.column(key).combine_chunks()
    if pa.types.is_fixed_size_list(column.type):
        return column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), -1)
    return column.to_numpy(zero_copy_only=False).reshape(len(column), 1)


def test_shipped_copy_has_lerobot_pusht_features_and_is_small() -> None:
    info = json.loads((ROOT / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 10
    assert {k: (ft["dtype"], ft["shape"]) for k, ft in info["features"].items()} == FEATURES
    assert info["features"][CAMERA]["info"]["video.fps"] == 10
    assert info["total_episodes"] == 20 and info["total_tasks"] == 1
    meta = load_meta(ROOT)
    lengths = meta.episodes["length"]
    assert len(lengths) == 20 and int(lengths.sum()) == info["total_frames"] and int(lengths.max()) <= 100
    assert len(list((ROOT / "data").glob("chunk-*/file-*.parquet"))) >= 2
    assert len(list((ROOT / "videos" / CAMERA).glob("chunk-*/file-*.mp4"))) >= 2
    assert sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file()) < 1024**2
    assert meta.tasks == {0: "Push the T-shaped block onto the T-shaped target."}


def test_shipped_frames_are_rollouts_and_stats_match_them() -> None:
    info = json.loads((ROOT / "meta" / "info.json").read_text())
    stats = json.loads((ROOT / "meta" / "stats.json").read_text())
    table = _data(ROOT)
    assert table.num_rows == info["total_frames"]
    for key in ("observation.state", "action", "next.reward", "next.success", "next.done"):
        values = _column(table, key).astype(np.float64)
        np.testing.assert_allclose(stats[key]["min"], values.min(0), err_msg=key)
        np.testing.assert_allclose(stats[key]["max"], values.max(0), err_msg=key)
        np.testing.assert_allclose(stats[key]["mean"], values.mean(0), rtol=1e-6, err_msg=key)
        np.testing.assert_allclose(stats[key]["std"], values.std(0), rtol=1e-6, atol=1e-9, err_msg=key)
        assert stats[key]["count"] == [table.num_rows], key
    assert np.asarray(stats[CAMERA]["mean"]).shape == (3, 1, 1)
    actions, reward = _column(table, "action"), _column(table, "next.reward")[:, 0]
    assert actions.min() >= 0 and actions.max() <= 512  # the agent's target, in PushT's pixels
    assert reward.min() >= 0 and reward.max() <= 1
    episode, frame = _column(table, "episode_index")[:, 0], _column(table, "frame_index")[:, 0]
    last = np.append(episode[1:] != episode[:-1], True)
    assert np.array_equal(_column(table, "next.done")[:, 0], last)  # done on each episode's last frame
    success = _column(table, "next.success")[:, 0]
    assert not success[~last].any() and np.all(reward[success] == 1.0)  # success ends the episode
    assert np.array_equal(frame[last] + 1, load_meta(ROOT).episodes["length"])
    best = [reward[episode == e].max() for e in range(info["total_episodes"])]
    assert np.mean(best) > 0.5 and success.sum() >= 3  # an expert, far above a random policy (about 0.07)


def test_the_reader_serves_it_as_the_training_command_does(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from lerobot_cli.datasets import DatasetConfig, make_dataset

    monkeypatch.setenv("HF_LEROBOT_HOME", str(REPO / "data"))
    dataset = make_dataset(DatasetConfig(repo_id="lerobot/demo_pusht"))
    item = dataset[len(dataset) - 1]
    assert tuple(item[CAMERA].shape) == (3, 96, 96) and 0 <= item[CAMERA].min() <= item[CAMERA].max() <= 1
    assert tuple(item["observation.state"].shape) == (2,) and tuple(item["action"].shape) == (2,)
    assert bool(item["next.done"]) and item["task"].startswith("Push the T")


def _assert_same(shipped, fresh, where: str, loose: bool = False) -> None:
    """Equal, except numbers under a ``next.reward`` key, which only need to agree to REWARD_RTOL."""
    if isinstance(shipped, dict) and isinstance(fresh, dict):
        assert sorted(shipped) == sorted(fresh), where
        for key in shipped:
            _assert_same(shipped[key], fresh[key], f"{where} {key}", loose or "next.reward" in key)
    elif loose and isinstance(shipped, (float, list)):
        np.testing.assert_allclose(shipped, fresh, rtol=REWARD_RTOL, err_msg=where)
    elif isinstance(shipped, list) and shipped and not isinstance(shipped[0], str):
        np.testing.assert_array_equal(np.asarray(shipped), np.asarray(fresh), err_msg=where)  # a short diff
    else:
        assert shipped == fresh, f"{where}: {shipped!r} != {fresh!r}"


def test_the_shipped_dataset_is_the_tools_build(tmp_path: Path) -> None:
    pytest.importorskip("gym_pusht", reason="lerobot-cli[pusht] (uv sync installs it)")
    tool = _tool()
    fresh, coverages = tool.build(tmp_path / "demo_pusht")
    assert len(coverages) == 20
    hint = "differs from tools/make_demo_pusht.py's build: rerun it with --overwrite"
    files = sorted(p.relative_to(ROOT) for p in ROOT.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()), hint
    for name in ("info.json", "stats.json"):  # the mp4 bytes vary with the encoder; their layout must not
        shipped, built = (json.loads((r / "meta" / name).read_text()) for r in (ROOT, fresh))
        _assert_same(shipped, built, f"meta/{name} {hint}")
    for path in files:
        if path.suffix == ".parquet":
            shipped, built = pq.read_table(ROOT / path), pq.read_table(fresh / path)
            assert shipped.schema.equals(built.schema, check_metadata=True), f"{path} {hint}"
            _assert_same(shipped.to_pydict(), built.to_pydict(), f"{path} {hint}")
    # the videos: each episode's first and last frame decode alike from both copies
    from lerobot_cli.datasets.dataset import LeRobotDataset

    shipped, built = LeRobotDataset(ROOT), LeRobotDataset(fresh)
    episodes = shipped.meta.episodes
    for start, end in zip(episodes["dataset_from_index"], episodes["dataset_to_index"], strict=True):
        for index in (int(start), int(end) - 1):
            error = float((shipped[index][CAMERA] - built[index][CAMERA]).abs().mean())
            assert error < 0.01, f"{CAMERA} frame {index}: mean |shipped - fresh| = {error:.4f}; {hint}"
