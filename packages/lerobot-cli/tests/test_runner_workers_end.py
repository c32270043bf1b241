"""A run's DataLoader workers end with the run, not whenever the garbage collector frees their iterator.

The held-out eval's loader is persistent and held in a reference cycle (the loop's hooks and the eval
hold each other), so without ``ShieldedDataLoader.close`` at the end of ``runner.train`` its iterator and
two worker processes outlived the run. Several runs in one process (tests/multiproc/train_many.py) then
fork a later run's workers with that iterator inside: a garbage collection there runs torch's ``__del__``
in the child, which prints "Exception ignored ... AssertionError: can only test a child process". In-process,
a small MLP on the demo dataset, the collector off during the run so what is left is what the run left."""

from __future__ import annotations

import gc
import multiprocessing
from pathlib import Path

from lerobot_cli.train import main
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "data" / "lerobot" / "demo_reach"


def test_a_run_with_workers_and_held_out_eval_leaves_no_worker_or_iterator(tmp_path):
    flags = [
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        "--num_workers=2",
        "--policy.type=mlp",
        "--policy.hidden_dim=16",
        "--batch_size=2",
        "--steps=2",
        "--log_freq=0",
        "--dataset.eval_split=0.2",
        "--eval_steps=1",
        "--save_checkpoint=false",
        f"--output_dir={tmp_path / 'run'}",
    ]
    gc.collect()
    gc.disable()
    try:
        assert main(flags) == 0
        left = [o for o in gc.get_objects() if isinstance(o, _MultiProcessingDataLoaderIter)]
        workers = multiprocessing.active_children()
    finally:
        gc.enable()
    assert not workers, f"DataLoader workers outlived the run: {workers}"
    assert not left, f"{len(left)} DataLoader iterator(s) outlived the run"
