"""``--sample_weighting.*`` in real ``lerobot-train`` runs of a tiny pi0 on the demo dataset: the banner, the
``sample_weight_*`` and ``sample_weighting/<k>`` records, and that the weighted loss is what trains (weights
all 0 make the loss 0), on one process and on two (DDP and FSDP2: each rank weights its own micro-batch)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
CHUNK = 10
PI0 = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--policy.type=pi0",
    "--policy.paligemma_variant=gemma_tiny",
    "--policy.action_expert_variant=gemma_tiny",
    "--policy.vision_variant=tiny",
    "--policy.image_resolution=[56,56]",
    f"--policy.chunk_size={CHUNK}",
    f"--policy.n_action_steps={CHUNK}",
    f"--policy.tokenizer_name={REPO / 'data' / 'tokenizers' / 'demo_bytes'}",
    "--num_workers=0",
    "--batch_size=4",
    "--steps=2",
    "--log_freq=1",
    "--save_checkpoint=false",
]


def write_progress(path: Path, *, nan: bool = False) -> Path:
    """A progress file for the demo dataset: progress rising in even episodes, falling in odd ones
    (weights 1 and 0), or every value NaN (every frame gets the fallback weight)."""
    files = sorted(DEMO.glob("data/*/*.parquet"))
    table = pa.concat_tables(
        [pq.read_table(f, columns=["index", "episode_index", "frame_index"]) for f in files]
    )
    episode, frame = table.column("episode_index").to_numpy(), table.column("frame_index").to_numpy()
    progress = np.where(episode % 2 == 0, frame / 100.0, 1.0 - frame / 100.0).astype(np.float32)
    if nan:
        progress[:] = np.nan
    columns = {"index": table.column("index"), "episode_index": table.column("episode_index")}
    pq.write_table(pa.table({**columns, "progress_sparse": progress}), path)
    return path


def train(*flags: str) -> tuple[int, str, str]:
    from lerobot_cli.train import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*PI0, *flags])
    return rc, out.getvalue(), err.getvalue()


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def expected_stats(path: Path) -> dict:
    from lerobot_cli.sample_weighting.config import SampleWeightingConfig
    from lerobot_cli.sample_weighting.weights import make_sample_weighter

    w = make_sample_weighter(SampleWeightingConfig(), chunk_size=CHUNK, device=torch.device("cpu"), path=path)
    return {f"sample_weighting/{k}": float(v) for k, v in w.get_stats().items() if not isinstance(v, str)}


def test_a_weighted_run_logs_lerobots_stats_and_trains_the_weighted_loss(tmp_path):
    progress = write_progress(tmp_path / "sarm_progress.parquet")
    rc, out, err = train(f"--sample_weighting.progress_path={progress}", f"--output_dir={tmp_path / 'run'}")
    assert rc == 0, err
    assert (
        f"Sample weighting: rabc from {progress}: 1516 frames with progress_sparse, chunk_size {CHUNK}" in out
    )
    rows = records(tmp_path / "run")
    stats = expected_stats(progress)
    for row in rows:
        assert {k: row[k] for k in stats} == stats
        # rising episodes: weight 1, falling ones: 0 (an episode's last frame: delta 0, a soft weight)
        assert 0.0 <= row["sample_weight_mean_weight"] <= 1.0
        assert row["sample_weight_num_zero_weight"] + row["sample_weight_num_full_weight"] <= 4
        # a micro-batch of falling episodes only weighs nothing: its loss is 0, any other's is not
        assert (row["loss"] == 0.0) == (row["sample_weight_num_zero_weight"] == 4.0), row

    # every weight 0 (no frame has a delta, fallback_weight 0): LeRobot's (l*w).sum()/(w.sum()+1e-6) is 0
    zero = write_progress(tmp_path / "nan.parquet", nan=True)
    rc, out, err = train(
        f"--sample_weighting.progress_path={zero}",
        '--sample_weighting.extra_params={"fallback_weight": 0.0}',
        f"--output_dir={tmp_path / 'zero'}",
    )
    assert rc == 0, err
    for row in records(tmp_path / "zero"):
        assert row["loss"] == 0.0 and row["sample_weight_num_zero_weight"] == 4.0, row
        assert row["sample_weight_mean_weight"] == 0.0 and row["sample_weighting/num_frames"] == 0.0


def test_a_malformed_progress_file_stops_the_run_in_one_line(tmp_path):
    bad = tmp_path / "p.parquet"
    pq.write_table(pa.table({"index": [0, 1], "episode_index": [0, 0], "progress_dense": [0.0, 0.1]}), bad)
    with pytest.raises(SystemExit) as exit_:
        train(f"--sample_weighting.progress_path={bad}", f"--output_dir={tmp_path / 'run'}")
    assert exit_.value.code == 2


def test_act_is_refused_before_any_work(tmp_path):
    from lerobot_cli.train import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main(["--dataset.repo_id=lerobot/demo_reach", f"--dataset.root={DEMO}", "--policy.type=act",
              "--sample_weighting.type=rabc", f"--output_dir={tmp_path / 'run'}"])  # fmt: skip
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(lines) == 1
    assert lines[0].endswith("policy act has no per-sample loss (LeRobot's forward(batch, reduction='none')) "
                             "to weight; sample weighting supports pi0, pi05")  # fmt: skip


def test_two_processes_weight_each_micro_batch_under_ddp_and_fsdp2(launch, tmp_path):
    progress = write_progress(tmp_path / "sarm_progress.parquet")
    zero = write_progress(tmp_path / "nan.parquet", nan=True)
    outs = launch.lerobot_train_runs(
        [*PI0, f"--sample_weighting.progress_path={progress}", f"--output_dir={tmp_path / 'ddp'}"],
        [
            *PI0,
            "--parallelism.dp_shard=-1",
            f"--sample_weighting.progress_path={zero}",
            '--sample_weighting.extra_params={"fallback_weight": 0.0}',
            f"--output_dir={tmp_path / 'fsdp'}",
        ],
        nproc=2,
    )
    assert "(DDP)" in outs[0].stdout and "(FSDP2)" in outs[1].stdout
    stats = expected_stats(progress)
    for row in records(tmp_path / "ddp"):
        assert {k: row[k] for k in stats} == stats
        # per rank a micro-batch of 4: the counts are the mean over the two ranks
        assert row["samples"] == 8.0
        assert row["sample_weight_num_zero_weight"] + row["sample_weight_num_full_weight"] <= 4
    for row in records(tmp_path / "fsdp"):  # every rank's weights 0: both ranks' losses 0
        assert row["loss"] == 0.0 and row["sample_weight_num_zero_weight"] == 4.0, row
