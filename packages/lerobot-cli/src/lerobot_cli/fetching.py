"""What a run downloads (a Hub dataset, ImageNet backbone weights) is fetched once per machine.

Every rank needs the files, and they land in one shared cache directory per machine. If every rank
fetched, N processes would download the same gigabytes at once into the same place. So this
machine's local main rank (``LOCAL_RANK`` 0) fetches first while the machine's other ranks wait, and
then they fetch too, which is a cache hit. The wait is on the job's key-value store, not a
collective: a download may take longer than any collective timeout, and a rank that dies makes the
launcher stop the job anyway. When the local main rank failed (offline, say), the others do not try
the network themselves: they raise at once, and the main rank's own sentence is the job's one line.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable
from typing import TypeVar

from lerobot_parallel.runtime import ParallelRuntime

from lerobot_cli.cli.errors import UsageError

T = TypeVar("T")
WAIT = datetime.timedelta(hours=12)  # a big dataset on a slow link; a dead rank ends the job before this


def _node() -> str:
    """This machine within the job: torchrun's node rank, else the host name."""
    return os.environ.get("GROUP_RANK") or socket.gethostname()


def _store():
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def local_main_first(runtime: ParallelRuntime, name: str, fetch: Callable[[], T]) -> T:
    """``fetch()`` on this machine's local main rank first, then on its other ranks; returns its result.

    ``name`` tells fetches apart (each call site its own). Single process: just ``fetch()``.
    """
    if not runtime.is_distributed:
        return fetch()
    store = _store()
    key = f"lerobot_cli/fetched/{name}/{_node()}"
    if runtime.local_rank == 0:
        try:
            result = fetch()
        except BaseException:
            store.set(key, "failed")
            raise
        store.set(key, "ok")
        return result
    store.wait([key], WAIT)
    if store.get(key) != b"ok":
        raise UsageError(f"{name}: the machine's local main rank could not fetch it (its error is the job's)")
    return fetch()


def decided_on_main(runtime: ParallelRuntime, name: str, decide: Callable[[], T]) -> T:
    """``decide()`` on the job's main rank, its result given to every rank: a value all ranks must agree
    on (the commit a Hub branch points at now). When it fails on the main rank, the others stop with a
    short line and the main rank's own error is the job's."""
    if not runtime.is_distributed:
        return decide()
    import torch.distributed as dist

    box: list = [None]
    if runtime.is_main:
        try:
            box = [("ok", decide())]
        except BaseException:
            box = [("failed", None)]
            dist.broadcast_object_list(box, src=0)
            raise
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status != "ok":
        raise UsageError(f"{name}: the main rank could not decide it (its error is the job's)")
    return value


def prefetch(cfg, runtime: ParallelRuntime, resuming: bool) -> None:
    """The run's downloads, once per machine (see the module docstring): the dataset when it is not
    cached, and the ImageNet backbone when a fresh policy with camera inputs will load it."""
    from lerobot_cli.datasets.mixing import run_meta
    from lerobot_cli.datasets.stream_location import meta_resolver
    from lerobot_cli.features import FeatureType
    from lerobot_cli.policies.backbone_weights import resolve_backbone_weights
    from lerobot_cli.workload import policy_config_for_dataset

    resolve = meta_resolver(cfg.dataset)  # a streamed dataset: its meta/ only

    def fetch(one):  # each dataset of a mixture, once per machine
        return local_main_first(runtime, f"dataset {one.repo_id or one.root}", lambda: resolve(one))

    meta = None
    if not cfg.dataset.is_mixture:
        fetch(cfg.dataset)
    else:
        meta = run_meta(cfg.dataset, fetch)
    spec = cfg.policy.backbone_weights()
    if not spec or resuming or cfg.policy.pretrained_path:
        return  # the weights come from a checkpoint: the backbone's initialisation is not read
    meta = meta or run_meta(cfg.dataset, resolve)
    features = policy_config_for_dataset(cfg.policy, meta.features).input_features
    if any(f.type is FeatureType.VISUAL for f in features.values()):
        local_main_first(runtime, "backbone", lambda: resolve_backbone_weights(spec))
