"""Bad data fails at once with one DatasetError line that names the file and what would be valid."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lerobot_cli.datasets import DatasetError, LeRobotDataset

DEMO = Path(__file__).resolve().parents[3] / "data" / "lerobot" / "demo_reach"
CAMERA = "observation.images.top"
FIRST_DATA = "data/chunk-000/file-000.parquet"
FIRST_VIDEO = f"videos/{CAMERA}/chunk-000/file-000.mp4"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return Path(shutil.copytree(DEMO, tmp_path / "demo_reach"))


def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=4))


def _error(root: Path, **kwargs) -> str:
    with pytest.raises(DatasetError) as caught:
        LeRobotDataset(root, **kwargs)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError) and "\n" not in message
    return message


@pytest.mark.parametrize(
    "relative", ["meta/info.json", "meta/stats.json", "meta/tasks.parquet", FIRST_DATA, FIRST_VIDEO]
)
def test_missing_file_is_named(root: Path, relative: str) -> None:
    (root / relative).unlink()
    message = _error(root)
    assert "missing file" in message and str(root / relative) in message


def test_missing_episode_metadata(root: Path) -> None:
    shutil.rmtree(root / "meta/episodes")
    assert "meta/episodes" in _error(root)


def test_feature_absent_from_parquet_names_file_and_column(root: Path) -> None:
    path = root / FIRST_DATA
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["action"]), path)
    message = _error(root)
    assert str(path) in message and "'action'" in message and "meta/info.json" in message


def test_vector_shape_mismatch(root: Path) -> None:
    _edit_json(root / "meta/info.json", lambda info: info["features"]["action"].update(shape=[3]))
    message = _error(root)
    assert (
        "shape mismatch" in message and "'action'" in message and "data/chunk-000/file-000.parquet" in message
    )


def test_video_shape_mismatch(root: Path) -> None:
    _edit_json(root / "meta/info.json", lambda info: info["features"][CAMERA].update(shape=[48, 64, 3]))
    message = _error(root)
    assert "shape mismatch" in message and FIRST_VIDEO in message and "64x64" in message


@pytest.mark.parametrize("version", ["v2.1", "v4.0", None])
def test_unsupported_codebase_version_says_which_are_supported(root: Path, version: str | None) -> None:
    _edit_json(root / "meta/info.json", lambda info: info.update(codebase_version=version))
    message = _error(root)
    assert "meta/info.json" in message and repr(version) in message and "supported versions: v3.0" in message
    if version == "v2.1":
        assert "convert_dataset_v21_to_v30" in message


def test_timestamp_drift_names_the_video(root: Path) -> None:
    path = next((root / "meta/episodes").glob("*/*.parquet"))
    table = pq.read_table(path)
    column = f"videos/{CAMERA}/from_timestamp"
    shifted = pa.array([t + 0.04 for t in table[column].to_pylist()])  # 0.4 frame at 10 fps
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, shifted), path)
    dataset = LeRobotDataset(root)  # metadata itself is consistent; the frames are not where it says
    with pytest.raises(DatasetError, match=r"no frame within 0.0001 s") as caught:
        dataset[3]
    assert FIRST_VIDEO in str(caught.value) and "from_timestamp" in str(caught.value)


def test_rows_that_disagree_with_episode_ranges(root: Path) -> None:
    path = next((root / "meta/episodes").glob("*/*.parquet"))
    table = pq.read_table(path)
    lengths = table["length"].to_pylist()
    lengths[0] -= 1
    ends = table["dataset_to_index"].to_pylist()
    ends[0] -= 1
    table = table.set_column(table.schema.get_field_index("length"), "length", pa.array(lengths))
    table = table.set_column(
        table.schema.get_field_index("dataset_to_index"), "dataset_to_index", pa.array(ends)
    )
    pq.write_table(table, path)
    message = _error(root)
    assert str(root / FIRST_DATA) in message and "do not match meta/episodes" in message


def test_delta_timestamps_must_fit_fps_and_features(root: Path) -> None:
    assert "multiples of 1/fps" in _error(root, delta_timestamps={"action": [0.0, 0.05]})
    assert "'nope' is not a feature" in _error(root, delta_timestamps={"nope": [0.0]})


def test_corrupt_parquet_is_named(root: Path) -> None:
    (root / FIRST_DATA).write_bytes(b"not parquet")
    assert str(root / FIRST_DATA) in _error(root)


def test_an_empty_episode_selection_is_refused() -> None:
    from lerobot_cli.datasets import DatasetConfig

    with pytest.raises(
        ValueError, match=r"--dataset.episodes=\[\] selects no episode: give a non-empty JSON list"
    ):
        DatasetConfig(repo_id="lerobot/demo_reach", episodes=[])
    assert "selects no episode" in _error(DEMO, episodes=[])  # the reader itself, called without the config


def _workload_error(root: Path) -> str:
    from lerobot_cli.config import TrainConfig
    from lerobot_cli.datasets import DatasetConfig
    from lerobot_cli.policies.mlp.config import MLPConfig
    from lerobot_cli.workload import build_workload

    cfg = TrainConfig(
        dataset=DatasetConfig(repo_id="lerobot/demo_reach", root=str(root)), policy=MLPConfig(hidden_dim=8)
    )
    with pytest.raises(DatasetError) as caught:
        build_workload(cfg, device="cpu")
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("edit", "says", "supported"),
    [
        (lambda stats: stats["observation.state"].pop("std"), "'observation.state' has no 'std'", "MIN_MAX"),
        (lambda stats: stats.pop("action"), "no statistics for 'action'", "IDENTITY"),
    ],
)
def test_stats_missing_what_the_policy_normalizes_names_file_feature_and_key(
    root: Path, edit, says, supported
) -> None:
    _edit_json(root / "meta/stats.json", edit)
    message = _workload_error(root)
    assert message.startswith(f"{root / 'meta/stats.json'}: {says}"), message
    kind = "STATE" if "state" in says else "ACTION"
    assert f"{kind} features are normalized with MEAN_STD, which needs mean and std" in message
    assert '--policy.normalization_mapping=\'{"VISUAL": "MEAN_STD", "STATE": ' in message
    # The suggested mapping uses a mode the remaining statistics support
    # (min/max are still there for the state).
    assert f'"{kind}": "{supported}"' in message and "(modes these statistics support)" in message


@pytest.mark.parametrize(
    ("entry", "template", "why"),
    [
        ("data_path", "/{chunk_index}{file_index}/etc/x.parquet", "absolute"),
        ("data_path", "../outside/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet", ".."),
        (
            "video_path",
            "videos/../../outside/{video_key}/chunk-{chunk_index:03d}/f-{file_index:03d}.mp4",
            "..",
        ),
        ("data_path", "data/chunk-{0}/file-{file_index:03d}.parquet", "not a template"),
    ],
)
def test_a_path_template_leading_out_of_the_dataset_is_refused(
    tmp_path: Path, entry: str, template: str, why: str
) -> None:
    """``meta/info.json`` is untrusted: its path templates must stay inside the dataset root. The
    outside copy of the files is a valid dataset, so without the check it would load silently."""
    root = Path(shutil.copytree(DEMO, tmp_path / "demo_reach"))
    shutil.copytree(root / "data", tmp_path / "outside", dirs_exist_ok=True)
    shutil.copytree(root / "videos", tmp_path / "outside", dirs_exist_ok=True)
    _edit_json(root / "meta/info.json", lambda info: info.__setitem__(entry, template))
    message = _error(root)
    assert entry in message and str(root / "meta/info.json") in message and why in message


def test_a_data_file_linked_out_of_the_dataset_is_refused(root: Path, tmp_path: Path) -> None:
    """A symlink inside the dataset that points elsewhere on the disk is not followed; one inside the
    root (a layout that shares files) still is."""
    outside = tmp_path / "elsewhere.parquet"
    shutil.copy(root / FIRST_DATA, outside)
    (root / FIRST_DATA).unlink()
    (root / FIRST_DATA).symlink_to(outside)
    message = _error(root)
    assert "is a symlink" in message and FIRST_DATA in message and "data_path" in message
    inside = root / "data" / "real.parquet"
    shutil.copy(outside, inside)
    (root / FIRST_DATA).unlink()
    (root / FIRST_DATA).symlink_to(inside)
    assert len(LeRobotDataset(root)) > 0


@pytest.mark.parametrize(
    "relative",
    ["meta/info.json", "meta/stats.json", "meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet"],
)
def test_a_meta_file_linked_out_of_the_dataset_is_refused(root: Path, tmp_path: Path, relative: str) -> None:
    """``meta/`` files are checked like the files ``meta/info.json`` names (red team 8): a symlink to a
    file elsewhere on the disk (another dataset's stats, say) is refused before it is read; one that
    stays inside the root is still followed."""
    outside = tmp_path / "other" / Path(relative).name
    outside.parent.mkdir()
    shutil.copy(root / relative, outside)
    (root / relative).unlink()
    (root / relative).symlink_to(outside)
    message = _error(root)
    assert "is a symlink" in message and relative in message and str(root) in message
    inside = root / "meta" / ("real-" + Path(relative).name)
    shutil.copy(outside, inside)
    (root / relative).unlink()
    (root / relative).symlink_to(inside)
    assert len(LeRobotDataset(root)) > 0


def test_a_linked_meta_directory_is_refused(root: Path, tmp_path: Path) -> None:
    shutil.move(root / "meta", tmp_path / "meta")
    (root / "meta").symlink_to(tmp_path / "meta", target_is_directory=True)
    assert "is a symlink" in _error(root)


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("data/chunk-{chunk_index.__class__.__name__}/file-{file_index:03d}.parquet", "not one of them"),
        ("data/chunk-{chunk_index[0]}/file-{file_index:03d}.parquet", "not one of them"),
        ("data/chunk-{chunk_index!r}/file-{file_index:03d}.parquet", "has a conversion"),
        ("data/chunk-{chunk_index:999999999d}/file.parquet", "has a format other than"),
        ("data/chunk-{chunk_index:{file_index}}/file.parquet", "has a format other than"),
        ("data/chunk-{chunk_index/file.parquet", "not a template"),
    ],
)
def test_a_path_template_may_hold_only_plain_named_fields(root: Path, template: str, why: str) -> None:
    """Red team 12: attribute/index access, conversions and huge widths are refused in one line
    naming meta/info.json and the entry, before any path is built."""
    _edit_json(root / "meta/info.json", lambda info: info.__setitem__("data_path", template))
    message = _error(root)
    assert str(root / "meta/info.json") in message and "data_path" in message and why in message
    assert "'int'" not in message and len(message) < 1000


def test_a_path_too_long_for_the_file_system_is_one_line(root: Path) -> None:
    template = "data/" + "x" * 300 + "-{chunk_index:03d}-{file_index:03d}.parquet"
    _edit_json(root / "meta/info.json", lambda info: info.__setitem__("data_path", template))
    message = _error(root)
    assert "data_path" in message and "cannot be read" in message
