"""``RemoteDataset`` on the shipped demo dataset served by ``tools/hub_server.py`` to the real
huggingface_hub client: same bytes as the local files, range reads, a bounded cache, a pinned revision,
retries, path checks, local and file:// URLs, and fork safety."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import pickle
import shutil
import urllib.request
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lerobot_cli.datasets import DatasetError
from lerobot_cli.datasets.metadata import load_meta
from lerobot_cli.datasets.remote import RemoteDataset

REPO = Path(__file__).resolve().parents[3]
ROOT = REPO / "data" / "lerobot" / "demo_reach"
REPO_ID = "org/demo_reach"
DATA = "data/chunk-000/file-000.parquet"
VIDEO = "videos/observation.images.top/chunk-000/file-000.mp4"
BIG = "data/chunk-000/file-100.parquet"
BLOCK = 4096

_spec = importlib.util.spec_from_file_location("hub_server", REPO / "tools" / "hub_server.py")
hub_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hub_server)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):
    """Start a loopback Hub; point huggingface_hub at it. Yields a function making more servers."""
    servers = []

    def start(root: Path = ROOT, **kwargs):
        server, url = hub_server.serve(root, REPO_ID, **kwargs)
        servers.append(server)
        from huggingface_hub import constants

        monkeypatch.setenv("HF_ENDPOINT", url)
        monkeypatch.setattr(constants, "ENDPOINT", url)  # read at import; HfApi/HfFileSystem use it
        return server, url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _stats(url: str) -> dict:
    return json.load(urllib.request.urlopen(url + "/_stats"))


def _frames(source) -> np.ndarray:
    with av.open(source) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _remote(tmp_path: Path, **kwargs) -> RemoteDataset:
    kwargs.setdefault("block_bytes", BLOCK)
    kwargs.setdefault("backoff_s", 0.01)
    return RemoteDataset(f"hf://datasets/{REPO_ID}", cache_dir=tmp_path / "cache", **kwargs)


def test_hf_reads_match_local(hub, tmp_path: Path) -> None:
    server, _ = hub()
    ds = _remote(tmp_path)
    assert ds.revision == server.sha
    assert json.loads((ds.meta_root / "meta/info.json").read_text()) == json.loads(
        (ROOT / "meta/info.json").read_text()
    )
    assert load_meta(ds.meta_root).info == load_meta(ROOT).info
    assert pq.ParquetFile(ds.open(DATA)).read().equals(pq.read_table(ROOT / DATA))
    assert np.array_equal(_frames(ds.open(VIDEO)), _frames(str(ROOT / VIDEO)))
    # meta is reused by a second instance (a restart): no meta file is fetched again
    again = _remote(tmp_path)
    assert again.meta_root == ds.meta_root and again.stats["requests"] == 0


def test_range_reads_fetch_less_than_the_file(hub, tmp_path: Path) -> None:
    # pyarrow reads the last 64 KiB at once for the footer: a data file larger than that
    root = tmp_path / "root"
    shutil.copytree(ROOT, root)
    rng = np.random.default_rng(0)
    big = pa.table({"x": rng.standard_normal(200_000), "index": np.arange(200_000)})
    pq.write_table(big, root / BIG, row_group_size=10_000)
    _, url = hub(root)
    ds = _remote(tmp_path)
    file = pq.ParquetFile(ds.open(BIG))
    assert file.read_row_group(3).equals(pq.ParquetFile(root / BIG).read_row_group(3))
    with av.open(ds.open(VIDEO)) as container:
        for i, _ in zip(range(3), container.decode(video=0), strict=False):
            pass
    served = _stats(url)["paths"]
    assert 0 < served[BIG] < (root / BIG).stat().st_size / 2
    assert 0 < served[VIDEO] < (ROOT / VIDEO).stat().st_size


def test_cache_is_bounded_and_hits_make_no_request(hub, tmp_path: Path) -> None:
    hub()
    ds = _remote(tmp_path, cache_bytes=3 * BLOCK)
    for rel in (DATA, VIDEO):
        assert len(ds.open(rel).read()) == (ROOT / rel).stat().st_size
    assert 0 < ds.cached_bytes <= 3 * BLOCK
    f = ds.open(VIDEO)
    f.seek(BLOCK * 2)
    first = f.read(100)
    requests = ds.stats["requests"]
    f.seek(BLOCK * 2)
    assert f.read(100) == first == (ROOT / VIDEO).read_bytes()[BLOCK * 2 : BLOCK * 2 + 100]
    assert ds.stats["requests"] == requests and ds.stats["cache_hits"] > 0


def test_revision_is_pinned(hub, tmp_path: Path) -> None:
    server, url = hub()
    old = server.sha
    ds = _remote(tmp_path)
    assert ds.revision == old
    server.move_main("f" * 40)  # a push to main after construction
    ds.open(DATA).read(10)
    assert set(_stats(url)["revs"]) == {old}
    assert _remote(tmp_path / "b").revision == "f" * 40  # a new run resolves the new head
    with pytest.raises(DatasetError, match="e{40}"):
        _remote(tmp_path / "c", revision="e" * 40)
    with pytest.raises(DatasetError, match="nope"):
        _remote(tmp_path / "d", revision="nope")


def test_dropped_connections_are_retried(hub, tmp_path: Path) -> None:
    _, url = hub(drop_every=3)
    ds = _remote(tmp_path, retries=3)
    assert ds.open(DATA).read() == (ROOT / DATA).read_bytes()
    assert _stats(url)["drops"] > 0


def test_persistent_error_names_file_and_attempts(hub, tmp_path: Path) -> None:
    hub(fail_path="file-001.parquet")
    ds = _remote(tmp_path, retries=2)
    with pytest.raises(DatasetError, match=r"data/chunk-000/file-001\.parquet.*after 3 attempts.*500"):
        ds.open("data/chunk-000/file-001.parquet").read()
    with pytest.raises(DatasetError, match="missing file.*file-099"):
        ds.open("data/chunk-000/file-099.parquet")


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "data/../../x", "a\\..\\b", "C:/x", "a//b"])
def test_unsafe_relpaths_are_refused(bad: str, tmp_path: Path) -> None:
    ds = RemoteDataset(str(ROOT), cache_dir=tmp_path)
    with pytest.raises(DatasetError, match="unsafe dataset path"):
        ds.open(bad)


def test_server_refuses_paths_outside_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(ROOT / "meta", root / "meta")
    (tmp_path / "secret.txt").write_text("s3cr3t-content")
    (root / "meta" / "link.txt").symlink_to(tmp_path / "secret.txt")
    server, _ = hub_server.serve(root, REPO_ID)
    try:
        port = server.server_address[1]
        for path in ("../../secret.txt", "meta/../../secret.txt", "%2e%2e/secret.txt", "meta/link.txt"):
            conn = http.client.HTTPConnection("127.0.0.1", port)
            conn.request("GET", f"/datasets/{REPO_ID}/resolve/{server.sha}/{path}")
            response = conn.getresponse()
            assert response.status in (403, 404) and b"s3cr3t" not in response.read(), path
            conn.close()
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("form", ["dir", "file"])
def test_local_dir_and_file_url(form: str, tmp_path: Path) -> None:
    url = str(ROOT) if form == "dir" else ROOT.as_uri()
    ds = RemoteDataset(url, cache_dir=tmp_path, block_bytes=BLOCK)
    assert ds.revision is None
    assert load_meta(ds.meta_root).info == load_meta(ROOT).info
    assert pq.ParquetFile(ds.open(DATA)).read().equals(pq.read_table(ROOT / DATA))
    assert ds.size(VIDEO) == (ROOT / VIDEO).stat().st_size
    assert ds.stats["requests"] > 0


def test_fork_and_pickle_get_their_own_cache(hub, tmp_path: Path) -> None:
    hub()
    ds = _remote(tmp_path)
    expected = (ROOT / DATA).read_bytes()
    assert ds.open(DATA).read() == expected
    held = ds.cached_bytes
    assert held > 0
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.cached_bytes == 0 and clone.open(DATA).read() == expected
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: an empty cache, then its own reads
        try:
            empty = ds.cached_bytes == 0
            ok = ds.open(DATA).read() == expected and ds.stats["requests"] > 0
            os.write(write, json.dumps([empty, ok]).encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        assert json.loads(pipe.read() or "null") == [True, True]
    assert status == 0 and ds.cached_bytes == held


def test_a_url_without_commits_fetches_a_changed_meta_anew(tmp_path: Path) -> None:
    """A dataset rewritten in place at a URL (s3, http, ...) is a new meta/ copy: never the old episode
    boundaries over the new files, nor a file the remote no longer has."""
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/changing/meta/info.json", b'{"v": 1}')
    fs.pipe("/changing/meta/episodes/chunk-000/file-000.parquet", b"old")
    first = RemoteDataset("memory://changing", cache_dir=tmp_path)
    again = RemoteDataset("memory://changing", cache_dir=tmp_path)
    assert again.meta_root == first.meta_root  # unchanged: the copy is reused
    fs.pipe("/changing/meta/info.json", b'{"v": 2, "longer": true}')
    fs.rm("/changing/meta/episodes/chunk-000/file-000.parquet")
    fs.pipe("/changing/meta/episodes/chunk-000/file-001.parquet", b"new")
    later = RemoteDataset("memory://changing", cache_dir=tmp_path)
    assert later.meta_root != first.meta_root
    assert json.loads((later.meta_root / "meta/info.json").read_text())["v"] == 2
    assert [p.name for p in (later.meta_root / "meta/episodes/chunk-000").iterdir()] == ["file-001.parquet"]
    fs.rm("/changing", recursive=True)


@pytest.mark.parametrize("url", ["foo://x", "unknownproto://bucket/x"])
def test_an_unknown_url_scheme_is_one_dataset_error(tmp_path: Path, url: str) -> None:
    with pytest.raises(DatasetError, match=f"cannot open dataset URL {url}"):
        RemoteDataset(url, cache_dir=tmp_path)
