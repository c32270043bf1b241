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


@pytest.mark.parametrize("name", [METRICS_FILE, "abandoned"])
@pytest.mark.parametrize("resume", [False, True])
def test_a_symlinked_metrics_file_or_abandoned_dir_is_refused_in_one_line(tmp_path, victim, name, resume):
    run = tmp_path / "run"
    (run / "checkpoints" / "000002").mkdir(parents=True)
    (run / name).symlink_to(victim if name == METRICS_FILE else tmp_path)
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


def test_metrics_are_never_appended_through_a_symlink(tmp_path, victim):
    """A link that appears after the check: the append refuses it, naming the file."""
    (tmp_path / METRICS_FILE).symlink_to(victim)
    reporter = Reporter(True, tmp_path, total_steps=2, stream=io.StringIO())
    with pytest.raises(CheckpointWriteError, match=f"could not write {tmp_path / METRICS_FILE}: OSError"):
        reporter.log(1, {"loss": 1.0})
    reporter.close()
    assert victim.read_text() == "precious"
