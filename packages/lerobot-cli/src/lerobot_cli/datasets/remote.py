"""``RemoteDataset``: a LeRobot v3.0 dataset read in place from the Hugging Face Hub or any fsspec URL.

Nothing but ``meta/`` is downloaded: ``meta_root`` is a local copy of the dataset's ``meta/`` tree (what
:func:`~lerobot_cli.datasets.metadata.load_meta` parses), and :meth:`RemoteDataset.open` gives a
seekable binary file whose reads are ranged requests for ``block_bytes``-aligned blocks, kept in a
bounded in-process LRU cache. ``pq.ParquetFile(f)`` and ``av.open(f)`` accept such a file, so a
reader fetches a data file's footer and the row groups it reads, or the video packets it decodes,
and no other byte.

The transport is fsspec (``fsspec.core.url_to_fs``, ``cat_file(path, start, end)``, ``size``): one
code path for the Hub (``huggingface_hub.HfFileSystem``), s3, gcs, http and local files. For
``hf://`` URLs the branch or tag is resolved once, at construction, to its commit sha, and every
later request names that sha (``hf://datasets/org/name@<sha>/...``): a push to the branch during a
run changes no byte read, and HfFileSystem's cached directory listings are listings of an immutable
commit, so they cannot be stale. The ranged GET itself for ``hf://`` is one request through the hub
client's session on the sha's resolve URL (the URL HfFileSystem's files read) rather than
HfFileSystem's file object, whose reads retry 5xx and dropped connections internally up to 5 times
with 1 to 8 s waits; here :class:`RemoteDataset` owns the one retry policy (``retries``,
``backoff_s``), so a persistent failure ends in seconds with one error naming the file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

from lerobot_cli.datasets.errors import DatasetError

_SHA = re.compile(r"^[0-9a-f]{40}$")
_HF = re.compile(r"^hf://datasets/(?P<repo>[^/@]+/[^/@]+)(?:@(?P<rev>[^/]+))?/?$")


class _Missing(Exception):
    """The file does not exist: no retry."""


class _Transient(Exception):
    """A dropped connection, reset, short body or 5xx: worth retrying (after ``retry_after`` seconds when
    the server said so)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


MAX_RETRY_AFTER_S = 60.0  # a server asking for a longer wait than this is waited on for this long


def _retry_after(value: str | None) -> float | None:
    try:
        return min(max(float(value), 0.0), MAX_RETRY_AFTER_S) if value is not None else None
    except ValueError:  # an HTTP date: not worth parsing, the backoff applies
        return None


def check_relpath(relpath: str) -> str:
    """``relpath`` as a clean relative POSIX path; DatasetError when it is absolute, climbs out
    (``..``), or uses backslashes, drive letters or empty parts."""
    bad = (
        not isinstance(relpath, str)
        or not relpath
        or "\\" in relpath
        or "\x00" in relpath
        or relpath.startswith("/")
        or ":" in relpath
        or any(part in ("", ".", "..") for part in relpath.split("/"))
    )
    if bad:
        raise DatasetError(
            f"unsafe dataset path {relpath!r}: it must be a relative path inside the dataset "
            "(no '..', no leading '/', no backslash or drive letter)"
        )
    return str(PurePosixPath(relpath))


def _one_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text.splitlines()[0] if text else type(err).__name__


class RemoteDataset:
    """The files of a LeRobot v3.0 dataset at ``url``, read by range without downloading the dataset.

    ``url``: ``hf://datasets/<org>/<name>`` (optionally ``@<revision>``), any fsspec URL
    (``file:///x``, ``memory://x``, ``http://...``, ``s3://...``) or a plain local directory.
    ``revision`` (hf:// only): a branch, tag or commit sha; resolved once to the commit sha, which
    :attr:`revision` holds and every read names. A sha is kept as is (a resumed run reads the same
    commit). None for other URLs.

    The block cache is in memory, per process, at most ``cache_bytes`` (least recently used blocks go
    first): memory is bounded and leaves nothing behind on disk to clean up or to go stale, and
    DataLoader workers are re-forked every epoch, so a disk cache would mostly hold what a dead worker
    read. A forked child starts with an empty cache of its own, and pickling drops the cache and any
    open connection (spawned workers reconnect lazily). ``meta/`` alone is written to disk, under
    ``cache_dir/<sha256(url@revision)[:16]>/meta``, each file atomically (temp file + ``os.replace``)
    and reused when already there.
    """

    def __init__(
        self,
        url: str,
        *,
        revision: str | None = None,
        cache_dir: Path,
        cache_bytes: int = 256 << 20,
        block_bytes: int = 1 << 20,
        retries: int = 4,
        backoff_s: float = 0.5,
    ) -> None:
        if block_bytes <= 0 or cache_bytes < 0 or retries < 0:
            raise ValueError("block_bytes must be > 0, cache_bytes and retries >= 0")
        self.cache_bytes = int(cache_bytes)
        self.block_bytes = int(block_bytes)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self._repo_id: str | None = None
        m = _HF.match(url.rstrip("/"))
        if url.startswith("hf://"):
            if not m:
                raise DatasetError(f"dataset URL {url!r}: expected hf://datasets/<org>/<name>[@<revision>]")
            self._repo_id = m["repo"]
            self.url = f"hf://datasets/{self._repo_id}"
            self.revision: str | None = self._resolve_sha(revision or m["rev"])
            self._base = f"datasets/{self._repo_id}@{self.revision}"
        else:
            if revision is not None:
                raise DatasetError(f"dataset URL {url!r}: a revision applies to hf:// URLs only")
            self.url = url if "://" in url else str(Path(url).expanduser().resolve())
            self.revision = None
            self._base = None  # set with the file system
        self._fs: Any = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._blocks: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._held = 0
        self._sizes: dict[str, int] = {}
        self.stats = {"requests": 0, "bytes_fetched": 0, "cache_hits": 0}
        listing = self._meta_listing()
        # A commit never changes; any other URL may be rewritten in place, so its meta/ copy is keyed by
        # what the listing says now (names, sizes, modification stamps): a changed dataset is a new copy,
        # never old episode boundaries over new files.
        version = self.revision if self.revision is not None else json.dumps(sorted(listing.items()))
        key = hashlib.sha256(f"{self.url}@{version}".encode()).hexdigest()[:16]
        self.meta_root = Path(cache_dir) / key
        self._download_meta(sorted(listing))

    # ------------------------------------------------------------------ transport
    def _resolve_sha(self, revision: str | None) -> str:
        if revision is not None and _SHA.match(revision):
            return revision
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

        try:
            sha = HfApi().dataset_info(self._repo_id, revision=revision).sha
        except (RepositoryNotFoundError, RevisionNotFoundError) as err:
            raise DatasetError(
                f"dataset hf://datasets/{self._repo_id}: revision {revision or 'main'!r} not found "
                f"({_one_line(err)})"
            ) from err
        except (HfHubHTTPError, OSError) as err:
            raise DatasetError(
                f"cannot resolve hf://datasets/{self._repo_id}@{revision or 'main'}: {_one_line(err)}"
            ) from err
        if not sha:
            raise DatasetError(f"hf://datasets/{self._repo_id}: the Hub gave no commit sha")
        return sha

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:  # a forked child: its own cache and connections
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._blocks = OrderedDict()
            self._held = 0
            self._fs = None
            self.stats = {"requests": 0, "bytes_fetched": 0, "cache_hits": 0}

    def _filesystem(self):
        self._check_fork()
        if self._fs is None:
            if self._repo_id is not None:
                from huggingface_hub import HfFileSystem

                self._fs = HfFileSystem(skip_instance_cache=True)
            else:
                import fsspec.core

                try:
                    self._fs, self._base = fsspec.core.url_to_fs(self.url)
                except (ImportError, ValueError) as err:  # an unknown scheme, a backend not installed
                    raise DatasetError(
                        f"cannot open dataset URL {self.url}: {_one_line(err)} (hf://datasets/<org>/<name> "
                        "works as installed; s3://, gs:// and others need their fsspec package)"
                    ) from None
                self._base = self._base.rstrip("/")
        return self._fs

    def _path(self, relpath: str) -> str:
        self._filesystem()
        return f"{self._base}/{relpath}"

    def _hf_get(self, relpath: str, start: int | None, end: int | None) -> bytes:
        from huggingface_hub import constants
        from huggingface_hub.utils import get_session

        fs = self._filesystem()
        url = f"{fs.endpoint}/datasets/{self._repo_id}/resolve/{self.revision}/{quote(relpath, safe='/')}"
        headers = dict(fs._api._build_hf_headers())
        if start is not None:
            headers["range"] = f"bytes={start}-{end - 1}"
        try:
            r = get_session().get(
                url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT, follow_redirects=True
            )
            body = r.content
        except Exception as err:  # httpx transport errors: connect, reset, incomplete body
            raise _Transient(_one_line(err)) from err
        if r.status_code in (404, 410):
            raise _Missing(f"HTTP {r.status_code} {r.headers.get('x-error-message', '')}".strip())
        if r.status_code >= 500 or r.status_code == 429:
            raise _Transient(
                f"HTTP {r.status_code} {r.headers.get('x-error-message', '')}".strip(),
                _retry_after(r.headers.get("retry-after")),
            )
        if r.status_code >= 400:
            raise _Missing(f"HTTP {r.status_code}")
        return body

    def _get_once(self, relpath: str, start: int | None, end: int | None) -> bytes:
        if self._repo_id is not None:
            return self._hf_get(relpath, start, end)
        fs = self._filesystem()
        try:
            return fs.cat_file(self._path(relpath), start=start, end=end)
        except FileNotFoundError as err:
            raise _Missing(_one_line(err)) from err
        except Exception as err:
            status = getattr(err, "status", None) or getattr(err, "code", None)
            if isinstance(status, int) and 400 <= status < 500 and status != 429:
                raise _Missing(_one_line(err)) from err
            raise _Transient(_one_line(err)) from err

    def _get(self, relpath: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``relpath`` (the whole file when start is None), with retries."""
        attempts = self.retries + 1
        for attempt in range(attempts):
            try:
                data = self._get_once(relpath, start, end)
                if start is not None and len(data) != end - start:
                    raise _Transient(f"short body: {len(data)} of {end - start} bytes")
            except _Missing as err:
                raise DatasetError(f"missing file {self.url}/{relpath}: {err}") from None
            except _Transient as err:
                if attempt + 1 == attempts:
                    raise DatasetError(
                        f"cannot read {self.url}/{relpath} (revision {self.revision}) after {attempts} "
                        f"attempts: {err}"
                    ) from None
                # exponential with jitter (many readers throttled together must not retry together), or
                # the server's Retry-After when it gave one
                wait = self.backoff_s * (2**attempt) * random.uniform(0.5, 1.5)
                time.sleep(max(wait, err.retry_after or 0.0))
                continue
            with self._lock:
                self.stats["requests"] += 1
                self.stats["bytes_fetched"] += len(data)
            return data
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ meta
    def _meta_listing(self) -> dict[str, list]:
        """Every file under ``meta/``: its relative path and (size, modification stamp or ETag)."""
        fs = self._filesystem()
        root = self._path("meta")
        try:
            found = fs.find(root, withdirs=False, detail=True)
        except FileNotFoundError:
            found = {}
        except Exception as err:
            raise DatasetError(f"cannot list {self.url}/meta: {_one_line(err)}") from err
        prefix = root.rstrip("/") + "/"
        out = {}
        for name, info in found.items():
            name = str(name)
            if not name.startswith(prefix):  # a file system that renders names otherwise
                name = prefix + name.split("/meta/", 1)[-1]
            stamp = next(
                (info.get(k) for k in ("ETag", "etag", "mtime", "LastModified", "created") if info.get(k)),
                None,
            )
            out["meta/" + name[len(prefix) :]] = [info.get("size"), str(stamp) if stamp is not None else None]
        if not out:
            rev = f" at revision {self.revision}" if self.revision else ""
            raise DatasetError(f"missing directory {self.url}/meta{rev}: no LeRobot v3.0 dataset there")
        return out

    def _download_meta(self, names: list[str]) -> None:
        for rel in names:
            rel = check_relpath(rel)
            target = self.meta_root / rel
            if target.is_file():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            data = self._get(rel)
            # a name no other process or node can pick (a shared file system, pids alike in containers)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    # ------------------------------------------------------------------ files
    def size(self, relpath: str) -> int:
        """Size in bytes of ``relpath``."""
        relpath = check_relpath(relpath)
        if relpath in self._sizes:
            return self._sizes[relpath]
        fs = self._filesystem()
        try:
            info = fs.info(self._path(relpath))
        except FileNotFoundError as err:
            raise DatasetError(f"missing file {self.url}/{relpath}: {_one_line(err)}") from None
        except Exception as err:
            raise DatasetError(f"cannot stat {self.url}/{relpath}: {_one_line(err)}") from err
        if info.get("type") not in (None, "file"):
            raise DatasetError(f"{self.url}/{relpath} is a {info.get('type')}, not a file")
        self._sizes[relpath] = int(info["size"])
        return self._sizes[relpath]

    def open(self, relpath: str) -> RemoteFile:
        """A read-only seekable binary file over ``relpath``, read through the block cache."""
        relpath = check_relpath(relpath)
        return RemoteFile(self, relpath, self.size(relpath))

    def block(self, relpath: str, index: int, size: int) -> bytes:
        """Block ``index`` of ``relpath`` (of ``size`` bytes), from the cache or fetched."""
        self._check_fork()
        key = (relpath, index)
        with self._lock:
            data = self._blocks.get(key)
            if data is not None:
                self._blocks.move_to_end(key)
                self.stats["cache_hits"] += 1
                return data
        start = index * self.block_bytes
        data = self._get(relpath, start, min(size, start + self.block_bytes))
        with self._lock:
            if key not in self._blocks and len(data) <= self.cache_bytes:
                self._blocks[key] = data
                self._held += len(data)
                while self._held > self.cache_bytes:
                    _, old = self._blocks.popitem(last=False)
                    self._held -= len(old)
        return data

    @property
    def cached_bytes(self) -> int:
        """Bytes the block cache holds now (at most ``cache_bytes``)."""
        self._check_fork()
        return self._held

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_fs=None, _lock=None, _blocks=OrderedDict(), _held=0)
        state["stats"] = {"requests": 0, "bytes_fetched": 0, "cache_hits": 0}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __repr__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return f"RemoteDataset({self.url}{rev}, cache={self.cached_bytes}/{self.cache_bytes} bytes)"


class RemoteFile(io.RawIOBase):
    """A read-only, seekable view of one file of a :class:`RemoteDataset`."""

    def __init__(self, dataset: RemoteDataset, relpath: str, size: int) -> None:
        super().__init__()
        self._ds = dataset
        self.name = relpath
        self._size = size
        self._pos = 0

    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        pos = base + offset
        if pos < 0:
            raise OSError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, buffer) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        view = memoryview(buffer).cast("B")
        want = min(len(view), max(0, self._size - self._pos))
        done = 0
        block = self._ds.block_bytes
        while done < want:
            index, offset = divmod(self._pos + done, block)
            data = self._ds.block(self.name, index, self._size)
            n = min(want - done, len(data) - offset)
            view[done : done + n] = data[offset : offset + n]
            done += n
        self._pos += done
        return done

    def read(self, size: int = -1) -> bytes:
        left = max(0, self._size - self._pos)
        size = left if size is None or size < 0 else min(size, left)  # never allocate past the file
        buf = bytearray(size)
        n = self.readinto(buf)
        return bytes(buf[:n])

    def readall(self) -> bytes:
        return self.read(-1)
