"""Streams a LeRobot dataset on every rank (gloo) and records which frames each reader handed out.

``torchrun … streaming_epoch.py <out_dir> <dataset root or hf:// URL> <batch> <workers>``. Each rank runs
a ``StreamingDataSource`` over a real ``EpisodeReader`` (``StreamedDataset``; a URL read by range through
``RemoteDataset``, ``HF_ENDPOINT`` naming the Hub) with ``workers`` DataLoader workers, and:

A. takes the first half of the batches, then saves the merged position of every rank
   (``gather_states``: the checkpoint's data position);
B. takes the rest (a fresh iterator: the workers restart from the handed-out position), enough for
   every reader to finish its first epoch;
C. builds a new source, loads A's merged position and takes as many batches as B: they must be B's.

Per rank it writes ``rank<r>.json``: per batch the reader that produced it (the one whose state moved)
and the batch's ``index`` values, for A, B and C, and a digest of each batch's tensors; rank 0 writes
``state_a.json``. The test checks the epoch coverage and resumes A's state on another world size.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from lerobot_cli.datasets.episode_reader import EpisodeReader
from lerobot_cli.datasets.remote import RemoteDataset
from lerobot_cli.datasets.streamed import StreamedDataset
from lerobot_trainloop.streaming import StreamingDataSource, gather_states, natural_share

_spec = importlib.util.spec_from_file_location("_common", Path(__file__).with_name("_common.py"))
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)

SEED, BUFFER = 7, 16


def digest(batch: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(batch):
        value = batch[key]
        if isinstance(value, torch.Tensor):
            h.update(key.encode())
            h.update(value.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def make_source(dataset: StreamedDataset, batch: int, workers: int, rank: int, world: int):
    return StreamingDataSource(
        dataset.read,
        dataset.lengths,
        batch,
        device=torch.device("cpu"),
        seed=SEED,
        dp_rank=rank,
        dp_world_size=world,
        num_workers=workers,
        buffer_size=BUFFER,
    )


def take(source: StreamingDataSource, n: int) -> list[dict]:
    """``n`` batches from a fresh iterator: for each, the reader whose state moved and the indices."""
    out = []
    before = {g: json.dumps(s, sort_keys=True) for g, s in source.reader_states.items()}
    for i, batch in enumerate(source):
        after = {g: json.dumps(s, sort_keys=True) for g, s in source.reader_states.items()}
        moved = [g for g in after if after[g] != before[g]]
        assert len(moved) == 1, moved
        out.append({"reader": moved[0], "index": batch["index"].tolist(), "digest": digest(batch)})
        before = after
        if i + 1 == n:
            break
    return out


def main() -> None:
    common.arm_watchdog(150)
    out, root = Path(sys.argv[1]), sys.argv[2]
    batch, workers = int(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    files = None
    if "://" in root:
        files = RemoteDataset(root, cache_dir=out / "cache", cache_bytes=1 << 20, block_bytes=1 << 14)
        root = files.meta_root
    dataset = StreamedDataset([EpisodeReader(root, return_uint8=True, files=files)])
    readers = world * max(1, workers)
    share = max(
        sum(stop - start for _, start, stop in natural_share(dataset.lengths, SEED, 0, g, readers, True))
        for g in range(readers)
    )
    total = max(1, workers) * (math.ceil(share / batch) + 1)  # every reader past its first epoch
    first = total // 2 | 1  # odd: the next batch comes from the second worker
    source = make_source(dataset, batch, workers, rank, world)
    part_a = take(source, first)
    state_a = gather_states(source.state_dict())
    part_b = take(source, total - first)
    source.close()
    again = make_source(dataset, batch, workers, rank, world)
    notes = again.load_state_dict(state_a)
    part_c = take(again, total - first)
    again.close()
    record = {"A": part_a, "B": part_b, "C": part_c, "notes": notes, "lengths": dataset.lengths}
    common.write_json(out / f"rank{rank}.json", record)
    if rank == 0:
        common.write_json(out / "state_a.json", state_a)
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(0.2)


if __name__ == "__main__":
    main()
