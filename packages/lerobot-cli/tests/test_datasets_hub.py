"""Where data comes from: --dataset.root as is, the LeRobot cache, or a Hub download (transport faked)."""

from __future__ import annotations

import shutil
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
from lerobot_cli.datasets import DatasetConfig, DatasetError, lerobot_home, make_dataset, resolve_dataset_root
from lerobot_cli.datasets.writer import EpisodeData, write_dataset

REPO = "someone/tiny_reach"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small state-only dataset standing in for the Hub repository's files."""
    features = {
        "observation.state": {"dtype": "float32", "shape": [2], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
    }
    episodes = [
        EpisodeData(
            "reach",
            {"observation.state": np.full((n, 2), n, np.float32), "action": np.zeros((n, 2), np.float32)},
        )
        for n in (4, 6)
    ]
    return write_dataset(tmp_path_factory.mktemp("hub") / "repo", 10, features, episodes)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "lerobot_home"))
    return tmp_path / "lerobot_home"


def _no_download(*args, **kwargs):
    raise AssertionError("snapshot_download must not be called")


def test_root_is_used_as_is(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _no_download)
    assert resolve_dataset_root(DatasetConfig(repo_id=REPO, root=str(source))) == source


def test_root_without_a_dataset_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _no_download)
    with pytest.raises(DatasetError, match="--dataset.root=") as caught:
        resolve_dataset_root(DatasetConfig(repo_id=REPO, root=str(tmp_path / "nothing")))
    assert str(tmp_path / "nothing" / "meta" / "info.json") in str(caught.value)


def test_cached_copy_is_used_without_download(
    source: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(source, home / REPO)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _no_download)
    assert resolve_dataset_root(DatasetConfig(repo_id=REPO)) == home / REPO


def test_absent_dataset_is_downloaded_into_the_cache(
    source: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def fake_snapshot_download(repo_id, *, repo_type, local_dir, revision):  # the transport only
        calls.append((repo_id, repo_type, Path(local_dir), revision))
        shutil.copytree(source, local_dir, dirs_exist_ok=True)
        return local_dir

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    dataset = make_dataset(DatasetConfig(repo_id=REPO, revision="v3.0", episodes=[1]))
    assert calls == [(REPO, "dataset", home / REPO, "v3.0")]
    assert len(dataset) == 6 and dataset[0]["observation.state"].tolist() == [6.0, 6.0]
    assert resolve_dataset_root(DatasetConfig(repo_id=REPO)) == home / REPO  # now cached: no second call
    assert len(calls) == 1


def test_offline_and_absent_names_the_paths_tried(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args, **kwargs):
        raise huggingface_hub.errors.LocalEntryNotFoundError("cannot reach huggingface.co; offline mode")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(DatasetError) as caught:
        resolve_dataset_root(DatasetConfig(repo_id=REPO))
    message = str(caught.value)
    assert REPO in message and str(home / REPO / "meta" / "info.json") in message
    assert "LocalEntryNotFoundError" in message and "--dataset.root" in message and "\n" not in message


def test_download_that_is_not_a_lerobot_dataset(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", lambda *a, local_dir, **k: Path(local_dir).mkdir(parents=True)
    )
    with pytest.raises(DatasetError, match="has no meta/info.json"):
        resolve_dataset_root(DatasetConfig(repo_id=REPO))


def test_no_repo_id_and_no_root() -> None:
    with pytest.raises(DatasetError, match="--dataset.repo_id"):
        resolve_dataset_root(DatasetConfig())


def test_home_follows_lerobot_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_LEROBOT_HOME", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert lerobot_home() == tmp_path / "hf" / "lerobot"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert lerobot_home() == Path("~/.cache/huggingface/lerobot").expanduser()
