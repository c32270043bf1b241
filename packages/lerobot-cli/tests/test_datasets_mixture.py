"""Several datasets read as one: the flags' lists, renames, feature checks, per-dataset fps windows,
statistics aggregated over the datasets, the tasks' union."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot_cli.datasets import DatasetError, LeRobotDataset, load_meta
from lerobot_cli.datasets.config import DatasetConfig
from lerobot_cli.datasets.mixing import MixtureMeta, mixture_features
from lerobot_cli.datasets.mixture import MixtureDataset
from lerobot_cli.datasets.stats import aggregate_stats
from lerobot_cli.datasets.writer import EpisodeData, write_dataset

SHAPE = [16, 24, 3]


def _features(camera: str, state: int = 3) -> dict:
    return {
        "observation.state": {"dtype": "float32", "shape": [state], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
        camera: {"dtype": "video", "shape": SHAPE, "names": ["height", "width", "channels"]},
    }


def _write(root: Path, fps: int, camera: str, base: int, tasks: list[str], state: int = 3) -> Path:
    def episode(ep: int, length: int) -> EpisodeData:
        t = np.arange(length, dtype=np.float32)
        return EpisodeData(
            task=tasks[ep % len(tasks)],
            frames={
                "observation.state": np.stack([base + 100 * ep + t] * state, axis=1).astype(np.float32),
                "action": np.stack([base + 100 * ep + t, -t], axis=1).astype(np.float32),
                camera: np.stack([np.full(SHAPE, (base // 1000 * 60 + 7 * i) % 250, np.uint8) for i in t]),
            },
        )

    return write_dataset(root, fps, _features(camera, state), (episode(e, n) for e, n in enumerate([6, 4])))


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("mix")
    return {
        "a": _write(tmp / "a", 10, "observation.images.top", 1000, ["pick", "place"]),
        "b": _write(tmp / "b", 10, "observation.images.front", 2000, ["place", "stack"]),
        "c": _write(tmp / "c", 20, "observation.images.top", 3000, ["pour"]),
    }


def _config(roots: dict[str, Path], **kw) -> DatasetConfig:
    ids = '["org/a","org/b","org/c"]'
    paths = "[" + ",".join(f'"{roots[k]}"' for k in "abc") + "]"
    rename = ({}, {"observation.images.front": "observation.images.top"}, {})
    return DatasetConfig(repo_id=ids, root=paths, rename_map=kw.pop("rename_map", rename), **kw)


def _mixture(roots: dict[str, Path], delta: dict | None = None, **kw) -> MixtureDataset:
    sources = _config(roots, **kw).sources()
    parts = []
    for source in sources:
        meta = load_meta(source.root)
        own = {source.rename.get(k, k): k for k in meta.features}
        d = None if delta is None else {own[k]: [i / meta.fps for i in v] for k, v in delta.items()}
        parts.append(LeRobotDataset(source.root, episodes=source.episodes, delta_timestamps=d))
    return MixtureDataset(parts, sources)


def test_items_are_renamed_tagged_and_windowed_at_each_datasets_fps(roots: dict[str, Path]) -> None:
    mix = _mixture(roots, delta={"action": [0, 1, 2]})  # frame offsets, in seconds per dataset's fps
    assert mix.sizes == [10, 10, 10] and len(mix) == 30 and mix.names == ["org/a", "org/b", "org/c"]
    cam = "observation.images.top"
    for row, (d, base) in zip((0, 10, 20), ((0, 1000), (1, 2000), (2, 3000)), strict=True):
        item = mix[row]
        assert set(item) >= {cam, "action", "action_is_pad", "observation.state", "dataset_index", "task"}
        assert "observation.images.front" not in item
        assert item["dataset_index"].item() == d
        # three consecutive frames of that dataset, whatever its fps (c is at 20 fps)
        assert item["action"][:, 0].tolist() == [base, base + 1, base + 2]
        assert item[cam].shape == (3, 16, 24)
    # the tasks' union, in order of first appearance; each item's task_index points into it
    assert mix.meta.tasks == {0: "pick", 1: "place", 2: "stack", 3: "pour"}
    for row in range(len(mix)):
        item = mix[row]
        assert mix.meta.tasks[item["task_index"].item()] == item["task"]
    # the held-over frames: each dataset's own episode ends
    assert mix.rows_without_last(2).tolist() == [0, 1, 2, 3, 6, 7] + [10, 11, 12, 13, 16, 17] + [
        20,
        21,
        22,
        23,
        26,
        27,
    ]


def test_the_mixtures_stats_aggregate_the_datasets_stats(roots: dict[str, Path]) -> None:
    mix = _mixture(roots)
    metas = [load_meta(roots[k]) for k in "abc"]
    renamed = [
        metas[0].stats,
        {
            ("observation.images.top" if k == "observation.images.front" else k): v
            for k, v in metas[1].stats.items()
        },
        metas[2].stats,
    ]
    want = aggregate_stats(renamed)
    for key in ("observation.state", "action", "observation.images.top"):
        for stat, value in want[key].items():
            np.testing.assert_array_equal(mix.meta.stats[key][stat], value, err_msg=f"{key} {stat}")
    # count-weighted over 10 + 10 + 10 frames: the mean of a's, b's and c's means
    np.testing.assert_allclose(
        mix.meta.stats["action"]["mean"],
        np.mean([m.stats["action"]["mean"] for m in metas], axis=0),
        rtol=1e-6,
    )
    assert int(np.asarray(mix.meta.stats["action"]["count"]).item()) == 30


def test_a_feature_missing_from_one_dataset_names_it_and_the_rename(roots: dict[str, Path]) -> None:
    sources = _config(roots, rename_map=({}, {}, {})).sources()
    metas = [load_meta(s.root) for s in sources]
    with pytest.raises(DatasetError) as err:
        mixture_features(metas, sources)
    message = str(err.value)
    assert (
        "'org/b'" in message and "'observation.images.top'" in message and "--dataset.rename_map" in message
    )
    # a rename of a feature the dataset lacks
    sources = _config(roots, rename_map=({"observation.images.nope": "x"}, {}, {})).sources()
    with pytest.raises(DatasetError, match="renames 'observation.images.nope', which dataset 'org/a'"):
        mixture_features(metas, sources)


def test_a_shape_mismatch_names_the_dataset_and_feature(tmp_path: Path, roots: dict[str, Path]) -> None:
    wide = _write(tmp_path / "wide", 10, "observation.images.top", 4000, ["t"], state=5)
    cfg = DatasetConfig(repo_id='["org/a","org/wide"]', root=f'["{roots["a"]}","{wide}"]')
    sources = cfg.sources()
    with pytest.raises(DatasetError) as err:
        MixtureMeta([load_meta(s.root) for s in sources], sources)
    message = str(err.value)
    assert (
        "'observation.state'" in message and "[5]" in message and "[3]" in message and "'org/wide'" in message
    )


def test_episode_selection_per_dataset(roots: dict[str, Path]) -> None:
    mix = _mixture(roots, episodes=[[1], None, [0]])
    assert mix.sizes == [4, 10, 6]
    assert mix[0]["action"][0].item() == 1100  # episode 1 of a
    assert torch.equal(mix[13]["dataset_index"], torch.tensor(1))
    assert torch.equal(mix[14]["dataset_index"], torch.tensor(2))


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"repo_id": '["a","a"]'}, "names a dataset twice"),
        ({"repo_id": '["a","b"]', "root": '["x"]'}, "--dataset.root="),
        ({"repo_id": "a", "weights": [1.0]}, "--dataset.weights applies to a mixture"),
        (
            {"repo_id": "a", "rename_map": [{"x": "y"}]},
            "--dataset.rename_map renames the datasets of a mixture",
        ),
        ({"repo_id": '["a","b"]', "weights": [1, -1]}, "give 2 positive numbers"),
        ({"repo_id": '["a","b"]', "weights": [1, float("nan")]}, "give 2 positive numbers"),
        ({"repo_id": '["a","b"]', "episodes": [0, 1]}, "one JSON list of episode indices (or null: all) per"),
        ({"repo_id": "a", "episodes": [[0]]}, "one list per dataset is for a mixture"),
        ({"repo_id": '["a","b"]', "episodes": [[0, 0], None]}, "distinct episode indices"),
        ({"repo_id": "[a"}, "starts like a JSON list but is not one"),
        ({"repo_id": '["a","b"]', "rename_map": [{"x": "y"}]}, "give a JSON list of 2 objects"),
        ({"repo_id": '["a","b"]', "rename_map": [{"x": "z", "y": "z"}, {}]}, "renames two features to one"),
    ],
)
def test_mixture_flags_that_do_not_fit_are_one_sentence(kw: dict, needle: str) -> None:
    with pytest.raises(ValueError) as err:
        DatasetConfig(**kw)
    assert needle in str(err.value)


def test_one_dataset_keeps_its_flags_meaning() -> None:
    (only,) = DatasetConfig(repo_id="org/a", root="/data/a", episodes=[3, 1]).sources()
    assert (only.name, only.root, only.episodes, only.rename) == ("org/a", "/data/a", (3, 1), {})
    two = DatasetConfig(repo_id='["org/a","org/b"]', root='[null,"/b"]', weights=[3, 1]).sources()
    assert [(s.repo_id, s.root) for s in two] == [("org/a", None), ("org/b", "/b")]


def test_task_index_is_the_united_one_per_frame(roots: dict[str, Path]) -> None:
    mix = _mixture(roots)
    assert mix.task_index.tolist() == [mix[row]["task_index"].item() for row in range(len(mix))]
    assert sorted(set(mix.task_index.tolist())) == [0, 1, 2, 3]
