"""Where ``--dataset.streaming=true`` reads a dataset: in place on disk, or remotely by range.

* ``--dataset.root`` a directory: read there, in place.
* ``--dataset.root`` a URL (``hf://datasets/org/name``, ``s3://…``, ``http://…``, any fsspec URL), or a repo
  id alone (the Hub, as LeRobot's streaming reads it): read through
  :class:`~lerobot_cli.datasets.remote.RemoteDataset`, the Hub's at ``--dataset.revision`` (default
  ``main``) resolved once to its commit. Only ``meta/`` is downloaded (under
  ``$HF_LEROBOT_HOME/streaming/``); data and video files are read by range into a bounded cache.

The choice depends on the flags alone, never on what one machine happens to have cached: every rank of
every node makes the same one (a rank reading a local copy while another streams the Hub would train on
two datasets, and the revision's broadcast would run on some ranks only).

One ``RemoteDataset`` per (url, revision) per process: the metadata and the episode readers share it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs

from lerobot_cli.datasets.config import DatasetConfig
from lerobot_cli.datasets.hub import lerobot_home, resolve_dataset_root

_SHA = re.compile(r"^[0-9a-f]{40}$")
_opened: dict[tuple[str, str | None, int], object] = {}


def is_url(root: str) -> bool:
    return "://" in root


def remote_url(cfg: DatasetConfig) -> str | None:
    """The URL a streamed (one-dataset) ``cfg`` is read from; None: a local directory."""
    if cfg.root is not None:
        return cfg.root if is_url(cfg.root) else None
    return f"hf://datasets/{cfg.repo_id}" if cfg.repo_id else None


def remote_dataset(cfg: DatasetConfig):
    """The ``RemoteDataset`` of a streamed one-dataset ``cfg`` (shared per process); None when local."""
    url = remote_url(cfg)
    if url is None:
        return None
    key = (url, cfg.revision, cfg.streaming_cache_mb)
    if key not in _opened:
        from lerobot_cli.datasets.remote import RemoteDataset

        _opened[key] = RemoteDataset(
            url,
            revision=cfg.revision if url.startswith("hf://") else None,
            cache_dir=lerobot_home() / "streaming",
            cache_bytes=cfg.streaming_cache_mb << 20,
        )
    return _opened[key]


def stream_meta_root(cfg: DatasetConfig) -> Path:
    """The directory whose ``meta/`` describes the streamed dataset (the dataset's own, or the local copy
    of a remote one's)."""
    remote = remote_dataset(cfg)
    return remote.meta_root if remote is not None else resolve_dataset_root(cfg)


def meta_resolver(cfg: DatasetConfig):
    """How ``run_meta`` finds each dataset of ``cfg``: downloaded as a whole, or streamed."""
    return stream_meta_root if cfg.streaming else resolve_dataset_root


def _unpinned(one: DatasetConfig) -> bool:
    """Whether ``one`` (one dataset) streams from the Hub at a branch or tag, not at a commit."""
    url = remote_url(one)
    return url is not None and url.startswith("hf://") and not (one.revision and _SHA.match(one.revision))


def pinned(cfg: DatasetConfig, resolve_on_main) -> DatasetConfig:
    """``cfg`` with every Hub dataset it streams at a branch resolved to its commit, the same on every
    rank: ``resolve_on_main(fn)`` runs ``fn`` on the main rank and gives every rank its result. The
    commits are saved with the run (a mixture's as a JSON list), so a resume reads the same data."""
    if not cfg.streaming:
        return cfg
    sources = cfg.sources()
    ones = [cfg.source_config(s) for s in sources] if len(sources) > 1 else [cfg]
    if not any(_unpinned(one) for one in ones):
        return cfg
    shas = resolve_on_main(
        lambda: [remote_dataset(one).revision if _unpinned(one) else one.revision for one in ones]
    )
    if len(ones) == 1:
        return attrs.evolve(cfg, revision=shas[0])
    return attrs.evolve(cfg, revision=json.dumps(shas))
