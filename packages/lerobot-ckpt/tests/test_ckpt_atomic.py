"""Crash safety with real processes: SIGKILL at random instants, and writes refused by the kernel.

Children are forked from the test process (torch already imported), which keeps a dozen kills
within a couple of seconds; each child is a real process that is killed or exits, never returns.
"""

import errno
import os
import random
import resource
import select
import signal
import time

import pytest
import torch
from lerobot_ckpt import (
    CheckpointSaveError,
    CheckpointWriteError,
    RunInfo,
    TrainingObjects,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_last,
    save_checkpoint,
)
from lerobot_ckpt.layout import is_transient_name
from torch import nn

RUN = RunInfo(world_size=1, batch_size=4)


def _model():
    return nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8))


def _stamp(model, value):
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)


def _in_child(body) -> int:
    """Fork; the child runs ``body`` and always leaves through os._exit (never back into pytest)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            torch.set_num_threads(1)
            code = body()
        except BaseException:  # noqa: BLE001 - report through the exit code only
            code = 3
        finally:
            os._exit(code)
    return pid


def _check_complete(out, model_cls=_model):
    """``last`` resolves, the checkpoint loads, and every file of it comes from one and the same save."""
    last = resolve_last(out / "checkpoints")
    model = model_cls()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = load_checkpoint(out, objects=TrainingObjects(model=model, optimizer=opt), restore_rng=False)
    assert state.checkpoint_dir == last.resolve() and state.step == int(last.name)
    stamp = state.sampler_state["save_index"]
    assert all(bool((p == stamp).all()) for p in model.parameters())
    assert all(bool((s["momentum_buffer"] == stamp).all()) for s in opt.state.values())
    for step_dir in list_checkpoints(out / "checkpoints"):  # every visible step dir is complete too
        load_checkpoint(step_dir, objects=TrainingObjects(model=model_cls()), restore_rng=False)
    return state.step, stamp


def _saver(out, ready_fd):
    def body():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        # gradients set by hand: a forked child cannot run autograd once the parent process has started
        # autograd's worker threads (an earlier test in the same pytest process may have)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        i = 0
        while True:
            i += 1
            _stamp(model, i)
            for s in opt.state.values():
                s["momentum_buffer"].fill_(i)
            # each step is saved twice: the second save replaces the directory `last` points to
            save_checkpoint(
                out,
                (i + 1) // 2,
                run=RUN,
                objects=TrainingObjects(model=model, optimizer=opt),
                sampler_state={"save_index": i},
            )
            if i == 1:
                os.write(ready_fd, b"1")

    return body


@pytest.mark.slow
def test_sigkill_at_random_points_never_breaks_last(tmp_path, warm):
    rnd = random.Random(1234)
    saw_leftovers = 0
    last_seen = (0, 0)
    for attempt in range(12):
        r, w = os.pipe()
        pid = _in_child(_saver(tmp_path, w))
        os.close(w)
        ready, _, _ = select.select([r], [], [], 60)
        assert ready, "saver child never completed its first save"
        os.read(r, 1)
        os.close(r)
        time.sleep(rnd.uniform(0.0, 0.25))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
            f"attempt {attempt}: {status}"
        )
        saw_leftovers += any(is_transient_name(p.name) for p in (tmp_path / "checkpoints").iterdir())
        last_seen = _check_complete(tmp_path)
        assert last_seen[0] == (last_seen[1] + 1) // 2
    assert saw_leftovers, "no kill landed inside a save; the drill did not test anything"
    # the next save cleans every leftover of the killed ones
    _save_stamped(tmp_path, 1000, 7)
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if is_transient_name(p.name)]
    assert _check_complete(tmp_path) == (1000, 7)


def _save_stamped(out, step, value):
    """Save at ``step`` a model and SGD optimizer whose parameters and momentum buffers all hold ``value``
    (``sampler_state={"save_index": value}``); returns them."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 64)).sum().backward()
    opt.step()
    for s in opt.state.values():
        s["momentum_buffer"].fill_(value)
    _stamp(model, value)
    save_checkpoint(
        out,
        step,
        run=RUN,
        objects=TrainingObjects(model=model, optimizer=opt),
        sampler_state={"save_index": value},
    )
    return model, opt


def _first_checkpoint(out):
    return _save_stamped(out, 1, 1)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """Pay torch's lazy imports (optimizer.step pulls in torch._dynamo: seconds) once, before forking,
    so children inherit them and the drill measures saves, not imports."""
    out = tmp_path_factory.mktemp("warm")
    _first_checkpoint(out)
    _check_complete(out)


@pytest.mark.slow
@pytest.mark.parametrize("step", [2, 1], ids=["new-step", "replacing-last"])
def test_file_size_limit_fails_cleanly_and_keeps_previous(tmp_path, step):
    """RLIMIT_FSIZE (``ulimit -f``) makes the kernel refuse the write, as a full disk would."""
    model, opt = _first_checkpoint(tmp_path)
    r, w = os.pipe()

    def body():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        _stamp(model, 2)
        try:
            save_checkpoint(
                tmp_path,
                step,
                run=RUN,
                objects=TrainingObjects(model=model, optimizer=opt),
                sampler_state={"save_index": 2},
            )
        except CheckpointWriteError as exc:
            os.write(w, f"{exc}|{exc.path}|{getattr(exc.os_error, 'errno', '')}".encode())
            return 0
        return 2

    pid = _in_child(body)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    message, path, err = os.read(r, 65536).decode().split("|")
    os.close(r)
    assert os.WEXITSTATUS(status) == 0, message
    assert path.endswith("pretrained_model/model.safetensors")  # the first file over 4 KiB
    assert (
        f"checkpoint {step:06d} was not saved (the previous checkpoint and `last` are unchanged)" in message
    )
    assert "could not write" in message and "model.safetensors" in message
    assert "File too large" in message or str(errno.EFBIG) in message or err == str(errno.EFBIG)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["000001", "last"]  # staging removed
    assert _check_complete(tmp_path) == (1, 1)


def test_failing_pretrained_hook_leaves_everything_as_it_was(tmp_path):
    _first_checkpoint(tmp_path)
    model = _model()

    def disk_full(path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path / "config.json"))

    with pytest.raises(CheckpointWriteError, match=r"000002 was not saved .*No space left on device") as info:
        save_checkpoint(
            tmp_path, 2, run=RUN, objects=TrainingObjects(model=model), write_pretrained=disk_full
        )
    assert info.value.path.name == "config.json" and info.value.os_error.errno == errno.ENOSPC

    def buggy(path):
        raise KeyError("policy")

    with pytest.raises(CheckpointSaveError, match=r"000002 was not saved .*KeyError: 'policy'") as info:
        save_checkpoint(tmp_path, 2, run=RUN, objects=TrainingObjects(model=model), write_pretrained=buggy)
    assert isinstance(info.value.__cause__, KeyError)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["000001", "last"]
    assert _check_complete(tmp_path) == (1, 1)


def test_leftovers_are_ignored_then_cleaned_but_last_target_spared(tmp_path):
    model, opt = _first_checkpoint(tmp_path)
    ckpts = tmp_path / "checkpoints"
    (ckpts / ".tmp-000002-999").mkdir()
    (ckpts / ".tmp-000002-999" / "junk").write_text("half a save")
    os.symlink("000001", ckpts / ".last-tmp-999")
    assert [p.name for p in list_checkpoints(ckpts)] == ["000001"]
    assert latest_checkpoint(tmp_path) == ckpts / "000001"
    save_checkpoint(
        tmp_path,
        2,
        run=RUN,
        objects=TrainingObjects(model=model, optimizer=opt),
        sampler_state={"save_index": 1},
    )
    assert sorted(os.listdir(ckpts)) == ["000001", "000002", "last"]


def test_replacing_without_atomic_exchange(tmp_path, monkeypatch):
    """File systems without renameat2(RENAME_EXCHANGE) (e.g. NFS) take the two-rename path."""
    from lerobot_ckpt.commit import staging

    model, opt = _first_checkpoint(tmp_path)
    monkeypatch.setattr(staging, "exchange", lambda a, b: False)
    for s in opt.state.values():
        s["momentum_buffer"].fill_(5)
    _stamp(model, 5)
    save_checkpoint(
        tmp_path,
        1,
        run=RUN,
        objects=TrainingObjects(model=model, optimizer=opt),
        sampler_state={"save_index": 5},
    )
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["000001", "last"]
    assert _check_complete(tmp_path) == (1, 5)


# --- no write goes through a name someone else planted (issue 31) ---


def test_the_run_lock_is_never_written_through_a_planted_symlink(tmp_path):
    from lerobot_ckpt import RunDirectoryError, RunLock
    from lerobot_ckpt.layout import RUN_LOCK

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RUN_LOCK).symlink_to(victim)
    with pytest.raises(RunDirectoryError) as info:
        RunLock.acquire(run_dir)
    assert str(info.value).startswith(f"{run_dir / RUN_LOCK} is a symlink (to {victim}); the run lock")
    assert "\n" not in str(info.value) and victim.read_text() == "precious"
    (run_dir / RUN_LOCK).unlink()
    os.mkfifo(run_dir / RUN_LOCK)  # not a regular file: refused, and the open does not hang
    with pytest.raises(RunDirectoryError, match="is not a regular file"):
        RunLock.acquire(run_dir)


def test_json_and_safetensors_writers_create_exclusively(tmp_path):
    """The writers every save and the converter use refuse an existing name (a symlink above all)
    instead of writing through it; what replaces a file goes through a fresh mkstemp name."""
    from lerobot_ckpt.commit.filesystem import replace_json, write_json
    from lerobot_ckpt.safetensors.stream import SafetensorsPlan, SafetensorsStreamWriter

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "planted.json"
    link.symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_json(link, {"a": 1})
    plan = SafetensorsPlan.build([("w", torch.float32, (2,))])
    with pytest.raises(FileExistsError):
        SafetensorsStreamWriter(link, plan)
    with pytest.raises(CheckpointWriteError, match="is a symlink"):
        replace_json(link, {"a": 1})
    assert victim.read_text() == "precious" and link.is_symlink()
    real = tmp_path / "record.json"
    write_json(real, {"a": 1})
    for pid in range(os.getpid() - 8, os.getpid() + 8):  # a fixed per-pid name would be written through
        (tmp_path / f".record.json.tmp-{pid}").symlink_to(victim)
    replace_json(real, {"a": 2})
    assert real.read_text() == '{\n  "a": 2\n}\n' and victim.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.is_symlink()) == ["record.json", "victim.txt"]
    with pytest.raises(ValueError, match="safetensors reserves that key"):
        SafetensorsPlan.build([("__metadata__", torch.float32, (2,))])


def test_a_save_never_writes_through_names_planted_in_checkpoints(tmp_path):
    """A run directory someone sent (and a resume writes into) with symlinks under the staging and
    `last` names this process will use: they are removed as leftovers, never followed."""
    model, opt = _first_checkpoint(tmp_path)
    ckpts = tmp_path / "checkpoints"
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (ckpts / f".tmp-000002-{os.getpid()}").symlink_to(outside)
    (ckpts / f".last-tmp-{os.getpid()}").symlink_to(outside / "keep.txt")
    save_checkpoint(
        tmp_path,
        2,
        run=RUN,
        objects=TrainingObjects(model=model, optimizer=opt),
        sampler_state={"save_index": 1},
    )
    assert sorted(os.listdir(ckpts)) == ["000001", "000002", "last"]
    assert os.listdir(outside) == ["keep.txt"] and (outside / "keep.txt").read_text() == "keep"
