"""No write of ``lerobot-train``'s own goes through a name planted in its run directory (issue 31).

A run directory can be one somebody sent (resumed in place with ``--resume=true``): a symlink under
``metrics.jsonl``, ``abandoned/`` or a staged ``.metrics.jsonl.tmp-<pid>`` would make the run write
outside it. Each is refused in one line before anything is written, or never used."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from lerobot_ckpt import CheckpointWriteError
from lerobot_cli.cli.errors import UsageError
from lerobot_cli.reporting import METRICS_FILE, Reporter
from lerobot_cli.rundir import inspect_run_dir


def _fresh_plan(directory: Path):
    return SimpleNamespace(cfg=SimpleNamespace(output_dir=str(directory)), resume=None)


def _resume_plan(directory: Path, checkpoint: Path):
    resume = SimpleNamespace(in_place=True, abandon=(), checkpoint=checkpoint)
    return SimpleNamespace(cfg=SimpleNamespace(output_dir=str(directory)), resume=resume)


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("precious")
    return path


@pytest.mark.parametrize("name", [METRICS_FILE, "abandoned", "wandb"])
@pytest.mark.parametrize("resume", [False, True])
def test_a_symlinked_metrics_file_or_abandoned_dir_is_refused_in_one_line(tmp_path, victim, name, resume):
    run = tmp_path / "run"
    (run / "checkpoints" / "000002").mkdir(parents=True)
    (run / name).symlink_to(victim if name == METRICS_FILE else tmp_path)  # wandb/: a run's files elsewhere
    plan = _resume_plan(run, run / "checkpoints" / "000002") if resume else _fresh_plan(run)
    with pytest.raises(UsageError) as info:
        inspect_run_dir(plan)
    message = str(info.value)
    assert message.startswith(f"--output_dir={run} holds {name} as a symlink (to ")
    assert "a run never writes through a symlink" in message and "\n" not in message
    assert victim.read_text() == "precious"


def test_a_resume_rewrites_metrics_through_a_fresh_name_not_a_planted_one(tmp_path, victim):
    run = tmp_path / "run"
    (run / "checkpoints" / "000002").mkdir(parents=True)
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in (1, 2, 3, 4)]
    (run / METRICS_FILE).write_text("".join(ln + "\n" for ln in lines))
    for pid in range(max(1, os.getpid() - 32), os.getpid() + 32):
        (run / f".{METRICS_FILE}.tmp-{pid}").symlink_to(victim)
    work = inspect_run_dir(_resume_plan(run, run / "checkpoints" / "000002"))
    notes = work.apply()
    assert victim.read_text() == "precious"
    assert (run / METRICS_FILE).read_text().splitlines() == lines[:2]
    (aside,) = (run / "abandoned").iterdir()
    assert (aside / METRICS_FILE).read_text().splitlines() == lines[2:]
    assert any("moved to" in n for n in notes)
    assert not [p for p in run.iterdir() if p.name.startswith(f".{METRICS_FILE}") and not p.is_symlink()]


def test_a_fresh_run_sets_an_earlier_failed_runs_wandb_files_aside_with_its_metrics(tmp_path):
    """A run that failed before its first checkpoint left wandb/ (--wandb.enable) beside metrics.jsonl:
    retried in the same directory, both go under abandoned/ together, so the new run's wandb folder and
    the old one's are not mixed."""
    run = tmp_path / "run"
    (run / "wandb" / "offline-run-1-abc").mkdir(parents=True)
    (run / "wandb" / "offline-run-1-abc" / "run-abc.wandb").write_bytes(b"x")
    (run / METRICS_FILE).write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    notes = inspect_run_dir(_fresh_plan(run)).apply()
    (aside,) = (run / "abandoned").iterdir()
    assert (aside / "wandb" / "offline-run-1-abc" / "run-abc.wandb").read_bytes() == b"x"
    assert (aside / METRICS_FILE).is_file() and not (run / "wandb").exists()
    assert notes == [
        (
            f"{run} held an earlier run that committed no checkpoint: starting afresh there; its "
            f"{METRICS_FILE} (1 lines) and its wandb/ moved to {aside}"
        )
    ]
    (run / "wandb").write_text("not a folder")
    with pytest.raises(UsageError, match="wandb is not a directory"):
        inspect_run_dir(_fresh_plan(run))


def test_metrics_are_never_appended_through_a_symlink(tmp_path, victim):
    """A link that appears after the check: the append refuses it, naming the file."""
    (tmp_path / METRICS_FILE).symlink_to(victim)
    reporter = Reporter(True, tmp_path, total_steps=2, stream=io.StringIO())
    with pytest.raises(CheckpointWriteError, match=f"could not write {tmp_path / METRICS_FILE}: OSError"):
        reporter.log(1, {"loss": 1.0})
    reporter.close(failed=True)
    assert victim.read_text() == "precious"


def _plant_aside_links(run: Path, target: Path, suffixes: tuple[str, ...]) -> None:
    """Symlinks under ``abandoned/`` named for every timestamp of the next minutes (red team 6)."""
    import datetime as dt

    (run / "abandoned").mkdir()
    start = dt.datetime.now()
    for second in range(-2, 180):
        stamp = (start + dt.timedelta(seconds=second)).strftime("%Y%m%d-%H%M%S")
        for suffix in suffixes:
            (run / "abandoned" / f"{stamp}-{suffix}").symlink_to(target, target_is_directory=True)


@pytest.mark.parametrize("abandon_newer", [False, True])
def test_a_resume_never_moves_into_a_planted_abandoned_entry(tmp_path, abandon_newer):
    elsewhere = tmp_path / "victim_home"
    elsewhere.mkdir()
    (elsewhere / METRICS_FILE).write_text("precious\n")
    run = tmp_path / "run"
    for step in ("000002", "000004"):
        (run / "checkpoints" / step).mkdir(parents=True)
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in (1, 2, 3, 4)]
    (run / METRICS_FILE).write_text("".join(ln + "\n" for ln in lines))
    _plant_aside_links(run, elsewhere, ("after-000002",))
    resume = SimpleNamespace(
        in_place=True,
        abandon=(run / "checkpoints" / "000004",) if abandon_newer else (),
        checkpoint=run / "checkpoints" / "000002",
    )
    plan = SimpleNamespace(cfg=SimpleNamespace(output_dir=str(run)), resume=resume)
    notes = inspect_run_dir(plan).apply()
    assert sorted(p.name for p in elsewhere.iterdir()) == [METRICS_FILE]
    assert (elsewhere / METRICS_FILE).read_text() == "precious\n"
    (aside,) = [p for p in (run / "abandoned").iterdir() if not p.is_symlink()]
    assert (aside / METRICS_FILE).read_text().splitlines() == lines[2:]
    assert (run / METRICS_FILE).read_text().splitlines() == lines[:2]
    if abandon_newer:
        assert (aside / "checkpoints" / "000004").is_dir() and not (aside / "checkpoints").is_symlink()
        assert not (run / "checkpoints" / "000004").exists()
    assert any(str(aside) in n for n in notes)


def test_a_fresh_run_never_moves_earlier_metrics_into_a_planted_abandoned_entry(tmp_path):
    elsewhere = tmp_path / "victim_home"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / METRICS_FILE).write_text(json.dumps({"step": 1}) + "\n")
    _plant_aside_links(run, elsewhere, ("earlier-run",))
    inspect_run_dir(_fresh_plan(run)).apply()
    assert list(elsewhere.iterdir()) == []
    (aside,) = [p for p in (run / "abandoned").iterdir() if not p.is_symlink()]
    assert (aside / METRICS_FILE).is_file() and not (run / METRICS_FILE).exists()


def test_set_aside_refuses_a_symlinked_or_existing_destination(tmp_path):
    from lerobot_ckpt import set_aside

    checkpoints = tmp_path / "checkpoints"
    for step in ("000002", "000004"):
        (checkpoints / step).mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    aside = tmp_path / "aside"
    aside.mkdir()
    (aside / "checkpoints").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(CheckpointWriteError, match="is a symlink"):
        set_aside([checkpoints / "000004"], aside / "checkpoints", point_last_at=checkpoints / "000002")
    (aside / "checkpoints").unlink()
    (aside / "checkpoints").mkdir()
    with pytest.raises(CheckpointWriteError, match="already exists"):
        set_aside([checkpoints / "000004"], aside / "checkpoints", point_last_at=checkpoints / "000002")
    assert list(elsewhere.iterdir()) == [] and (checkpoints / "000004").is_dir()
