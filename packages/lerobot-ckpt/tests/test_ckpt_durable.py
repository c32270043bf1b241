"""A committed checkpoint is durable: before the staging tree is renamed to its step directory, every
file and every directory in it was fsynced after its last change; after the rename (or the atomic
exchange with an older copy of the step, or the two renames where there is none) the ``checkpoints/``
directory is fsynced before ``last`` is re-pointed (``last`` never names a step directory that a power
cut could take back), and again after; a new ``checkpoints/`` is fsynced into its parent. Without those, a
power cut after the save returned could leave ``last`` on a step directory whose files are empty or missing,
although no process was killed mid-write (which is what tests/test_ckpt_atomic.py drills).

The durability is observed, not assumed: ``os.fsync`` is wrapped to record what each descriptor is
(``/proc/self/fd``) with its size and modification time at that moment, and the renames are recorded
in order with them, for a synchronous save and for an asynchronous one (whose commit runs on its
background thread). Linux only (``/proc``), like the exchange it checks.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from lerobot_ckpt import AsyncCheckpointer, RunInfo, TrainingObjects, save_checkpoint
from lerobot_ckpt.commit import staging
from lerobot_ckpt.layout import LAST_LINK, is_transient_name
from torch import nn

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")

RUN = RunInfo(world_size=1, batch_size=4)


class Event(NamedTuple):
    kind: str  # fsync, rename (os.rename and os.replace) or exchange (a successful one)
    path: str  # what was fsynced; what was renamed
    to: str | None  # where it was renamed to
    seen: tuple[int, int] | str | None  # an fsync: (size, mtime_ns) then; a rename onto a link: its target
    thread: str


class Journal:
    """What reached the disk, in order (:class:`Event`), from any thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()
        real_fsync, real_rename, real_replace, real_exchange = (
            os.fsync,
            os.rename,
            os.replace,
            staging.exchange,
        )

        def fsync(fd) -> None:
            fd = fd if isinstance(fd, int) else fd.fileno()
            path, st = os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd)
            real_fsync(fd)
            self._add("fsync", path, None, (st.st_size, st.st_mtime_ns))

        def renamer(real):
            def rename(src, dst, *args, **kwargs) -> None:
                real(src, dst, *args, **kwargs)
                self._add(
                    "rename",
                    os.path.abspath(src),
                    os.path.abspath(dst),
                    os.readlink(dst) if os.path.islink(dst) else None,
                )

            return rename

        def exchange(a: Path, b: Path) -> bool:
            done = real_exchange(a, b)
            if done:
                self._add("exchange", os.path.abspath(a), os.path.abspath(b), None)
            return done

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "rename", renamer(real_rename))
        monkeypatch.setattr(os, "replace", renamer(real_replace))
        monkeypatch.setattr(staging, "exchange", exchange)

    def _add(self, kind: str, path: str, to: str | None, seen) -> None:
        with self._lock:
            self.events.append(Event(kind, path, to, seen, threading.current_thread().name))

    def fsyncs(self, path: Path, start: int = 0, end: int | None = None) -> list[tuple[int, tuple[int, int]]]:
        """``(index, (size, mtime_ns))`` of each fsync of ``path`` among ``events[start:end]``."""
        end = len(self.events) if end is None else end
        return [
            (i, e.seen)
            for i, e in enumerate(self.events)
            if start <= i < end and e.kind == "fsync" and e.path == str(path)
        ]


def assert_durable_commit(journal: Journal, step_dir: Path, *, new_checkpoints_dir: bool = False) -> Event:
    """The commit of ``step_dir`` (the last one in ``journal``) was durable, as the module docstring says;
    returns its rename (or exchange) event."""
    ckpts = step_dir.parent
    commits = [
        i
        for i, e in enumerate(journal.events)
        if e.kind in ("rename", "exchange") and e.to == str(step_dir) and is_transient_name(Path(e.path).name)
    ]
    assert commits, f"no rename of a staging directory to {step_dir}: {journal.events}"
    commit = commits[-1]
    staged = Path(journal.events[commit].path)
    entries = [step_dir, *sorted(step_dir.rglob("*"))]
    assert len(entries) > 10, (
        entries
    )  # a real tree: pretrained_model/, pretrained_model_ema/, training_state/
    for entry in entries:
        name = entry.relative_to(ckpts)
        before = journal.fsyncs(staged / entry.relative_to(step_dir), end=commit)
        assert before, f"{name} was not fsynced before the commit rename"
        st = entry.stat()
        # the last fsync saw the entry as it is now: nothing written to a file,
        # nor added to a directory, after it
        seen = before[-1][1] if entry.is_file() else before[-1][1][1]
        assert seen == ((st.st_size, st.st_mtime_ns) if entry.is_file() else st.st_mtime_ns), (
            f"{name} changed after its last fsync before the commit rename"
        )
    swaps = [
        i
        for i, e in enumerate(journal.events)
        if i > commit and e.kind == "rename" and e.to == str(ckpts / LAST_LINK) and e.seen == step_dir.name
    ]
    assert swaps, f"`last` never pointed at {step_dir.name} after its commit"
    # `last` may only point at a step directory whose rename is durable already
    assert journal.fsyncs(ckpts, start=commit + 1, end=swaps[0]), (
        "checkpoints/ not fsynced between the commit rename and the swap of `last`"
    )
    assert journal.fsyncs(ckpts, start=swaps[0] + 1), "checkpoints/ not fsynced after `last` was swapped"
    if new_checkpoints_dir:
        assert journal.fsyncs(ckpts.parent, end=commit), "a new checkpoints/ was not fsynced into its parent"
    return journal.events[commit]


def objects() -> TrainingObjects:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    ema = {k: v.detach().clone() for k, v in model.named_parameters()}
    return TrainingObjects(model=model, optimizer=opt, scheduler=sched, ema=ema)


def pretrained(path: Path) -> None:
    (path / "config.json").write_text('{"type": "toy"}')


@pytest.mark.parametrize("case", ["new", "replacing", "replacing-without-exchange"])
def test_a_synchronous_commit_is_durable(tmp_path, monkeypatch, case):
    saved = objects()
    if case != "new":  # the same step saved again (a resumed run): the exchange, or the two renames
        save_checkpoint(tmp_path, 2, run=RUN, objects=saved, write_pretrained=pretrained)
    if case == "replacing-without-exchange":
        monkeypatch.setattr(staging, "exchange", lambda a, b: False)
    journal = Journal(monkeypatch)
    step_dir = save_checkpoint(tmp_path, 2, run=RUN, objects=saved, write_pretrained=pretrained)
    commit = assert_durable_commit(journal, step_dir, new_checkpoints_dir=case == "new")
    assert commit.kind == ("exchange" if case == "replacing" else "rename")


def test_an_asynchronous_commit_is_durable(tmp_path, monkeypatch):
    """The background thread writes, fsyncs and renames: the same guarantees, recorded from that thread."""
    journal = Journal(monkeypatch)
    saver = AsyncCheckpointer.create()
    saved = objects()
    saver.save(tmp_path, 1, run=RUN, objects=saved, write_pretrained=pretrained)
    saver.save(tmp_path, 2, run=RUN, objects=saved, write_pretrained=pretrained)  # waits for 000001 first
    done = saver.wait()
    assert done is not None and done.step == 2
    for step, path in ((1, tmp_path / "checkpoints" / "000001"), (2, done.path)):
        commit = assert_durable_commit(journal, path, new_checkpoints_dir=step == 1)
        assert commit.thread == f"lerobot-ckpt-save-{step:06d}"  # committed in the background
