"""lerobot-train's own loop and hooks (progress, logging, checkpoint schedule, interrupt watch) make no
host sync on a non-log step: run in this process on the demo dataset, every tensor read and collective
counted (lerobot_trainloop.testing.HostSyncCounter). Each event is labelled with the loop step it
belongs to (``loop.step`` at that moment: step s's hooks, then fetching and computing step s + 1) and
with where it happened: inside ``TrainLoop.train_step`` (the loop and every hook) or in the data
pipeline between steps (sampler, collate, pre-processor: CPU tensors of the dataset, which are host
work on any device, reported but not held to zero)."""

from __future__ import annotations

from pathlib import Path

from lerobot_cli import runner
from lerobot_cli.train import main
from lerobot_trainloop.loop import TrainLoop
from lerobot_trainloop.testing import HostSyncCounter

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "data" / "lerobot" / "demo_reach"


def test_lerobot_train_reads_the_device_only_at_log_and_save_steps(tmp_path, monkeypatch, capsys):
    state = {"loop": None, "in_step": False}
    real_step = TrainLoop.train_step

    def train_step(self, *args, **kwargs):
        state["loop"], state["in_step"] = self, True
        try:
            return real_step(self, *args, **kwargs)
        finally:
            state["in_step"] = False

    monkeypatch.setattr(TrainLoop, "train_step", train_step)
    monkeypatch.setattr(runner, "_setup_logging", lambda is_main: None)  # keep pytest's log capture

    def label():
        loop = state["loop"]
        return None if loop is None else ("loop" if state["in_step"] else "data", loop.step)

    # SGD: AdamW's single-tensor CPU path reads its CPU step counters with .item(), which on CUDA are
    # host tensors too (or device ones under --optimizer.fused=true): not a device sync, but counted here.
    argv = [
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        "--num_workers=0",
        "--policy.type=mlp",
        "--policy.hidden_dim=32",
        "--optimizer.type=sgd",
        "--batch_size=4",
        "--steps=20",
        "--log_freq=10",
        "--save_freq=15",
        f"--output_dir={tmp_path / 'run'}",
    ]
    with HostSyncCounter(label=label) as counter:
        assert main(argv) == 0
    out = capsys.readouterr().out
    assert "step 10/20 loss=" in out and "peak_rss_gb=" in out and "checkpoint:" in out

    loop_syncs = {s: counter.syncs(("loop", s)) for s in range(21)}
    quiet = [s for s in range(1, 20) if s not in (10, 15)]
    assert all(loop_syncs[s] == [] for s in quiet), loop_syncs
    assert loop_syncs[10] == ["tolist"]  # the log step: metrics + non-finite record, one read
    assert loop_syncs[15]  # the save step reads the non-finite record first (and the save reads state)
    assert loop_syncs[20]
    assert not [e for e in counter.events if e[0] == "async"]  # one process: no interrupt all-reduce
