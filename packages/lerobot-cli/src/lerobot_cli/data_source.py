"""The run's data sources, built from the workload: the training batches and the held-out ones.

Everything about how ``lerobot-train`` reads its data is decided here, once: which frames can start a
training sample, the rank-sharded resumable order, the loader's workers, and what each batch becomes on
the device (the dataset's uint8 cameras cross as bytes, a quarter of float32's, become float32 in [0, 1]
there, then the preprocessor). Training and held-out eval batches take the same path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_trainloop.data_source import MapDataSource
from lerobot_trainloop.evaluation import EvalBatches
from lerobot_trainloop.mixture import MixtureBatchSampler
from lerobot_trainloop.sampler import ShardedBatchSampler
from lerobot_trainloop.streaming import StreamingDataSource

from lerobot_cli.batch_fit import check_batch_fits
from lerobot_cli.config import TrainConfig
from lerobot_cli.datasets import DatasetError
from lerobot_cli.datasets.dataset import cameras_to_float
from lerobot_cli.datasets.image_transforms import AugmentItem, Identity, ImageTransforms
from lerobot_cli.datasets.imagenet import is_depth_map
from lerobot_cli.datasets.mixture import MixtureDataset
from lerobot_cli.datasets.split import eval_sample_indices
from lerobot_cli.datasets.streamed import StreamedDataset


@attrs.frozen
class DataSources:
    """``train``: the resumable training batches; ``held_out``: ``--dataset.eval_split``'s episodes for
    the eval loss every ``--eval_steps`` (None: no held-out eval)."""

    train: MapDataSource | StreamingDataSource
    held_out: MapDataSource | None
    counts: Callable[[], dict[str, int]] | None = None  # a mixture's samples per dataset (MixtureCounts)

    @property
    def all(self) -> tuple[MapDataSource, ...]:
        return (self.train,) if self.held_out is None else (self.train, self.held_out)

    def close(self) -> None:
        """End every source's workers (each closed even if another's close raised)."""
        try:
            self.train.close()
        finally:
            if self.held_out is not None:
                self.held_out.close()


def training_rows(workload) -> Any:
    """The frames that may start a training sample, when the policy drops episode ends (diffusion's
    ``drop_n_last_frames``, as LeRobot's sampler does); None: all of them."""
    n = workload.policy_config.frames_dropped_per_episode()
    if n <= 0:
        return None
    rows = workload.dataset.rows_without_last(n)
    if len(rows) == 0:
        raise DatasetError(
            f"--policy.drop_n_last_frames={n} leaves no frame to train on: every episode of the "
            f"training set has at most {n} frames; lower it, or select longer episodes"
        )
    return rows


def _prepare(workload) -> Callable[[Any], Any]:
    """A placed batch as the policy takes it: cameras as float32 in [0, 1], then the preprocessor."""
    cameras = workload.dataset.meta.camera_keys
    pre = workload.preprocessor

    def prepare(batch):
        return pre(cameras_to_float(batch, cameras))

    return prepare


def _augment(workload, cfg: TrainConfig) -> AugmentItem | None:
    """``--dataset.image_transforms``: every camera (depth maps aside) of each training item augmented in
    the loader's workers, from a generator seeded by the run's seed and the item's sample key (see
    ``AugmentItem``); None when off (or when no transform can be picked). Never given to the held-out
    source."""
    transforms = ImageTransforms(cfg.dataset.image_transforms)
    if isinstance(transforms.tf, Identity):
        return None
    meta = workload.dataset.meta
    features = getattr(meta, "features", {})
    # Depth maps are left alone, as LeRobot does.
    cameras = [k for k in meta.camera_keys if not is_depth_map(features.get(k, {}))]
    return AugmentItem(transforms, cameras, cfg.seed)


def _loader_kwargs(cfg: TrainConfig, runtime: ParallelRuntime) -> dict[str, Any]:
    # Shielded workers: a stop signal must not kill them before the ranks agreed to stop (interrupt.py).
    workers = cfg.num_workers
    return {
        "shielded": True,
        "num_workers": workers,
        "pin_memory": runtime.device.type == "cuda",
        "persistent_workers": workers > 0 and cfg.persistent_workers,
        "prefetch_factor": cfg.prefetch_factor if workers > 0 else None,
        "multiprocessing_context": cfg.dataloader_multiprocessing_context if workers > 0 else None,
    }


def make_data_sources(workload, cfg: TrainConfig, runtime: ParallelRuntime) -> DataSources:
    """The training source (after checking a global batch fits in its samples) and, with
    ``--eval_steps`` and a held-out split, the held-out one. No worker starts before the first
    iteration, so building them early costs nothing."""
    if isinstance(workload.dataset, StreamedDataset):
        train = _streaming_source(workload, cfg, runtime)
        counts = StreamCounts(workload.dataset.names, train, runtime) if workload.dataset.is_mixture else None
        return DataSources(train=train, held_out=None, counts=counts)
    rows = training_rows(workload)
    num_samples = len(workload.dataset) if rows is None else len(rows)
    check_batch_fits(cfg.batch_size, runtime.dp_world_size, num_samples, cfg.dataset.episodes)
    prepare = _prepare(workload)
    kwargs = _loader_kwargs(cfg, runtime)
    sizes = _part_sizes(workload.dataset, rows)
    if sizes is not None and cfg.dataset.weights is not None:
        order = MixtureBatchSampler(
            sizes,
            cfg.dataset.weights,
            cfg.batch_size,
            dp_rank=runtime.dp_rank,
            dp_world_size=runtime.dp_world_size,
            seed=cfg.seed,
        )
    else:
        order = ShardedBatchSampler(
            num_samples,
            cfg.batch_size,
            dp_rank=runtime.dp_rank,
            dp_world_size=runtime.dp_world_size,
            seed=cfg.seed,
        )
    # The loader's generator is the run seed plus the rank (per-rank worker seeds); it never draws from
    # the global RNG, so dropout and VAE sampling after a resume match an uninterrupted run's.
    train = MapDataSource(
        workload.dataset,
        order,
        device=runtime.device,
        seed=cfg.seed + runtime.rank,
        rows=rows,
        prepare=prepare,
        loader_kwargs=kwargs,
        augment=_augment(workload, cfg),
    )
    held_out = None
    if cfg.eval_steps > 0 and workload.eval_dataset is not None:
        dataset = workload.eval_dataset
        batches = EvalBatches(
            eval_sample_indices(dataset.task_index, cfg.max_eval_samples),
            cfg.batch_size,
            dp_rank=runtime.dp_rank,
            dp_world_size=runtime.dp_world_size,
        )
        held_out = MapDataSource(
            dataset, batches, device=runtime.device, seed=cfg.seed, prepare=prepare, loader_kwargs=kwargs
        )
    counts = None if sizes is None else MixtureCounts(workload.dataset.names, sizes, order)
    return DataSources(train=train, held_out=held_out, counts=counts)


def _streaming_source(workload, cfg: TrainConfig, runtime: ParallelRuntime) -> StreamingDataSource:
    """``--dataset.streaming=true``: every (rank, worker) reader streams its share of the episodes. Its
    workers restart from the handed-out position at each iteration, so they cannot persist."""
    dataset: StreamedDataset = workload.dataset
    check_batch_fits(cfg.batch_size, runtime.dp_world_size, dataset.num_samples, cfg.dataset.episodes)
    readers = runtime.dp_world_size * max(1, cfg.num_workers)
    if len(dataset.lengths) < readers:
        raise DatasetError(
            f"--dataset.streaming=true gives each of the {readers} readers ({runtime.dp_world_size} ranks x "
            f"{max(1, cfg.num_workers)} workers, --num_workers) whole episodes, but the dataset has "
            f"{len(dataset.lengths)} to train on; lower --num_workers, or use more episodes"
        )
    _check_same_episodes(dataset, runtime)
    kwargs = _loader_kwargs(cfg, runtime)
    kwargs.pop("num_workers")
    kwargs["persistent_workers"] = False  # an endless stream: its workers never restart at an epoch
    return StreamingDataSource(
        dataset.read,
        dataset.lengths,
        cfg.batch_size,
        device=runtime.device,
        seed=cfg.seed,
        dp_rank=runtime.dp_rank,
        dp_world_size=runtime.dp_world_size,
        num_workers=cfg.num_workers,
        buffer_size=cfg.dataset.streaming_buffer_size,
        prepare=_prepare(workload),
        loader_kwargs=kwargs,
        groups=[d for d, _ in dataset.episodes] if dataset.is_mixture else None,
        num_groups=len(dataset.parts),  # a dataset whose episodes are all too short counts 0
        augment=_augment(workload, cfg),
    )


def _check_same_episodes(dataset: StreamedDataset, runtime: ParallelRuntime) -> None:
    """Every rank must stream the same episodes: a dataset at a URL without commits (s3://, http://)
    that changed while the ranks started would give each rank other shares, silently."""
    if not runtime.is_distributed:
        return
    import torch.distributed as dist
    from lerobot_trainloop.streaming import lengths_digest

    mine = lengths_digest(dataset.lengths)
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if len(set(every)) > 1:
        raise DatasetError(
            "the ranks read different versions of the streamed dataset (its episodes differ between "
            "them: it changed while the job started); start the run again, or pin a Hub revision"
        )


def _part_sizes(dataset, rows) -> list[int] | None:
    """A mixture's samples per dataset, in the order's position space (the rows that may start a sample);
    None for one dataset."""
    if not isinstance(dataset, MixtureDataset):
        return None
    if rows is None:
        return dataset.sizes
    return [len(part) for part in dataset.part_rows(np.asarray(rows))]


class MixtureCounts:
    """Samples drawn from each dataset of a mixture so far, over all ranks (the order is the same on every
    rank, so no collective is needed): ``samples/<repo id>`` in metrics.jsonl at each log step.

    A weighted mixture's sampler counts them as it goes; plain concatenation (a shuffled epoch over every
    frame) counts them from the consumed positions: whole epochs times the sizes, plus the part of the
    current epoch's permutation consumed so far."""

    def __init__(self, names: list[str], sizes: list[int], order) -> None:
        self.names = names
        self.bounds = np.cumsum(sizes)[:-1]
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.order = order

    def __call__(self) -> dict[str, int]:
        if isinstance(self.order, MixtureBatchSampler):
            counts = list(self.order.counts)
        else:
            order: ShardedBatchSampler = self.order
            seen = np.asarray(order.indices_at(order.epoch * order.num_samples, order.offset), dtype=np.int64)
            partial = np.bincount(np.searchsorted(self.bounds, seen, side="right"), minlength=len(self.names))
            counts = (order.epoch * self.sizes + partial).tolist()
        return {f"samples/{name}": int(n) for name, n in zip(self.names, counts, strict=True)}


class StreamCounts:
    """A streamed mixture's samples per dataset so far, over all ranks: each rank counts what it handed
    out (``StreamingDataSource.group_counts``, kept in the checkpoint), summed across ranks at each log
    step (a collective: every rank logs at the same steps)."""

    def __init__(self, names: list[str], source: StreamingDataSource, runtime: ParallelRuntime) -> None:
        self.names, self.source, self.runtime = names, source, runtime

    def __call__(self) -> dict[str, int]:
        counts = list(self.source.group_counts)
        if self.runtime.is_distributed:
            import torch
            import torch.distributed as dist

            total = torch.tensor(counts, dtype=torch.int64, device=self.runtime.device)
            dist.all_reduce(total)
            counts = total.tolist()
        return {f"samples/{name}": int(n) for name, n in zip(self.names, counts, strict=True)}
