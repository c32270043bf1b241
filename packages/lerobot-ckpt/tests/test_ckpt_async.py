"""Asynchronous saves in one process: the snapshot is the save step's state, training goes on while
the background phase writes, the files are those of a synchronous save, and a failed background
write is raised at the next wait naming its step, leaving ``last`` where it was.

The background phase is slowed with ``LEROBOT_CKPT_TEST_COMMIT_DELAY_S`` (the real code path,
paused after its writers) so that training steps provably run while a save is in flight.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot_ckpt import (
    AsyncCheckpointer,
    CheckpointWriteError,
    RunInfo,
    TrainingObjects,
    load_checkpoint,
    read_last,
    read_tensors,
    save_checkpoint,
)
from lerobot_ckpt.save import TEST_COMMIT_DELAY_ENV
from torch import nn

RUN = RunInfo(world_size=1, batch_size=4)


class Tied(nn.Module):
    """Tied embedding/head (a header alias in model.safetensors) and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 16)
        self.body = nn.Linear(16, 16)
        self.head = nn.Linear(16, 7, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 16))

    def forward(self, idx):
        return self.head(torch.tanh(self.body(self.emb(idx) * self.scale)))


def _setup():
    torch.manual_seed(0)
    model = Tied()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def _step(model, opt, sched) -> float:
    idx = torch.randint(0, 7, (8, 5))
    loss = nn.functional.cross_entropy(model(idx).reshape(-1, 7), idx.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()
    return time.monotonic()


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _files(step_dir: Path) -> dict[str, object]:
    """Every file's content: safetensors as (metadata, dtype, shape, raw bytes per tensor) since
    ``save_file`` orders its header metadata differently from call to call; other files as bytes."""
    out: dict[str, object] = {}
    for p in sorted(step_dir.rglob("*")):
        if p.suffix == ".safetensors":
            tensors, metadata = read_tensors(p)
            out[str(p.relative_to(step_dir))] = (
                metadata,
                {k: (str(v.dtype), tuple(v.shape), _raw(v)) for k, v in sorted(tensors.items())},
            )
        elif p.is_file():
            out[str(p.relative_to(step_dir))] = p.read_bytes()
    return out


def _pretrained(path: Path) -> None:
    (path / "config.json").write_text('{"type": "toy"}')


def test_async_save_snapshots_the_step_trains_meanwhile_and_writes_the_sync_files(tmp_path, monkeypatch):
    model, opt, sched = _setup()
    objects = TrainingObjects(model=model, optimizer=opt, scheduler=sched)
    for _ in range(3):
        _step(model, opt, sched)
    kwargs = {"run": RUN, "objects": objects, "write_pretrained": _pretrained}
    _seed_all(5)
    sync_dir = save_checkpoint(
        tmp_path / "sync", 3, sampler_state={"offset": 12}, loop_state={"step": 3}, **kwargs
    )

    saver = AsyncCheckpointer.create()
    assert saver.group is None  # no process group: nothing to create
    monkeypatch.setenv(TEST_COMMIT_DELAY_ENV, "1.0")
    sampler, loop = {"offset": 12}, {"step": 3}
    _seed_all(5)
    t0 = time.monotonic()
    target = saver.save(tmp_path / "async", 3, sampler_state=sampler, loop_state=loop, **kwargs)
    returned = time.monotonic()
    in_flight, committed_at_return = saver.in_flight, target.exists()
    sampler["offset"], loop["step"] = 99, 99  # the caller's dicts move on too
    step_times = [_step(model, opt, sched) for _ in range(5)]  # mutates every parameter and moment
    done = saver.wait()

    assert in_flight == 3 and not committed_at_return
    assert done.path == target and read_last(tmp_path / "async" / "checkpoints") == target
    assert returned - t0 < 0.5 <= done.committed - done.snapshot_done
    # (a) training stepped while the save was in flight: after its snapshot, before its commit (the
    # background waits 1 s before writing; on a loaded machine later steps may end after the commit)
    assert done.snapshot_done < step_times[0] < done.committed, (done, step_times)
    # (c) the background wrote the state of step 3 (not of step 8): the synchronous save's files,
    # tensors bitwise
    assert _files(target) == _files(sync_dir)
    assert saver.wait() is None  # nothing in flight any more

    # and it resumes: the weights are step 3's
    fresh, fresh_opt, fresh_sched = _setup()
    state = load_checkpoint(
        target, objects=TrainingObjects(model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
    )
    assert state.step == 3 and state.sampler_state == {"offset": 12} and state.loop_state == {"step": 3}


def test_the_next_save_waits_for_the_previous_one(tmp_path, monkeypatch):
    model, opt, sched = _setup()
    objects = TrainingObjects(model=model, optimizer=opt, scheduler=sched)
    saver = AsyncCheckpointer.create()
    monkeypatch.setenv(TEST_COMMIT_DELAY_ENV, "0.5")
    saver.save(tmp_path, 1, run=RUN, objects=objects)
    t0 = time.monotonic()
    saver.save(tmp_path, 2, run=RUN, objects=objects)  # blocks until 000001 committed
    assert time.monotonic() - t0 >= 0.3 and saver.last.step == 1
    assert read_last(tmp_path / "checkpoints").name == "000001"
    saver.close()
    assert read_last(tmp_path / "checkpoints").name == "000002"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["000001", "000002", "last"]


def test_a_failed_background_write_is_raised_at_the_next_wait_naming_the_step(tmp_path, monkeypatch):
    """A disk that refuses the weights (RLIMIT_FSIZE: EFBIG, reproducibly) once the save is in the
    background: the training-thread part writes only the small config file and succeeds."""
    model, opt, sched = _setup()
    objects = TrainingObjects(model=model, optimizer=opt, scheduler=sched)
    saver = AsyncCheckpointer.create()
    saver.save(tmp_path, 2, run=RUN, objects=objects, write_pretrained=_pretrained)
    saver.wait()
    ckpts = tmp_path / "checkpoints"
    before = {
        str(p.relative_to(ckpts)): p.read_bytes() if p.is_file() else None for p in sorted(ckpts.rglob("*"))
    }

    monkeypatch.setenv(TEST_COMMIT_DELAY_ENV, "0.3")
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, limit[1]))
    try:
        saver.save(
            tmp_path, 4, run=RUN, objects=objects, write_pretrained=_pretrained
        )  # returns: config is tiny
        _step(model, opt, sched)
        with pytest.raises(CheckpointWriteError) as info:
            saver.wait()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, previous)
    message = str(info.value)
    assert message.startswith(
        "checkpoint 000004 was not saved (the previous checkpoint and `last` are unchanged): could not write "
    ), message
    assert "File too large" in message and "\n" not in message
    after = {
        str(p.relative_to(ckpts)): p.read_bytes() if p.is_file() else None for p in sorted(ckpts.rglob("*"))
    }
    assert after == before  # `last`, step 2 untouched; the staging directory removed
    assert saver.wait() is None  # reported once
    saver.save(tmp_path, 4, run=RUN, objects=objects)  # the next save works again
    saver.close()
    assert read_last(ckpts).name == "000004"
    assert not any(name.startswith(".") for name in os.listdir(ckpts))
