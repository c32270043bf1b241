"""``lerobot-train`` on a mixture of three datasets (one names its camera differently, one runs at another
fps) under FSDP2 x2: the banner, per-dataset sample counts in metrics.jsonl, the proportions, and a resume
that logs the uninterrupted run's losses bitwise. One torchrun launch holds every run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from lerobot_cli.datasets.writer import EpisodeData, write_dataset

pytestmark = pytest.mark.slow

SHAPE = [16, 24, 3]
WEIGHTS = [0.6, 0.3, 0.1]
IDS = '["org/a","org/b","org/c"]'
RENAME = '[{},{"observation.images.front":"observation.images.top"},{}]'


def _write(root: Path, fps: int, camera: str, base: int, task: str) -> Path:
    features = {
        "observation.state": {"dtype": "float32", "shape": [3], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
        camera: {"dtype": "video", "shape": SHAPE, "names": ["height", "width", "channels"]},
    }

    def episode(ep: int, length: int) -> EpisodeData:
        t = np.arange(length, dtype=np.float32)
        rng = np.random.default_rng(base + ep)
        return EpisodeData(
            task=task,
            frames={
                "observation.state": (base + rng.normal(size=(length, 3))).astype(np.float32),
                "action": np.stack([base / 1000 + t / length, -t / length], axis=1).astype(np.float32),
                camera: rng.integers(0, 250, (length, *SHAPE), dtype=np.uint8),
            },
        )

    return write_dataset(root, fps, features, (episode(e, n) for e, n in enumerate([20, 15, 25])))


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def mixture_runs(launch, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mixture")
    roots = [
        _write(tmp / "a", 10, "observation.images.top", 1000, "pick"),
        _write(tmp / "b", 10, "observation.images.front", 2000, "place"),
        _write(tmp / "c", 20, "observation.images.top", 3000, "pour"),
    ]
    data = [
        f"--dataset.repo_id={IDS}",
        "--dataset.root=[" + ",".join(f'"{r}"' for r in roots) + "]",
        f"--dataset.rename_map={RENAME}",
        "--num_workers=0",
        "--policy.type=mlp",
        "--policy.hidden_dim=32",
        "--parallelism.dp_shard=-1",
        "--batch_size=8",
        "--log_freq=1",
    ]
    weighted = [*data, f"--dataset.weights={json.dumps(WEIGHTS)}"]
    half = tmp / "half"
    runs = {
        "full": [*weighted, "--steps=12", "--save_checkpoint=false"],
        "half": [*weighted, "--steps=6"],
        "resumed": [
            "--resume=true",
            f"--config_path={half}/checkpoints/000006/pretrained_model/train_config.json",
            "--steps=12",
        ],
        "concat": [*data, "--steps=6", "--save_checkpoint=false"],
        "held": [*data, "--steps=3", "--save_checkpoint=false", "--dataset.eval_split=0.3", "--eval_steps=3"],
    }
    items = [
        flags if "--resume=true" in flags else [*flags, f"--output_dir={tmp / name}"]
        for name, flags in runs.items()
    ]
    outs = launch.lerobot_train_runs(*items, nproc=2)
    return {
        name: (tmp / name if name != "resumed" else half, out) for name, out in zip(runs, outs, strict=True)
    }


def test_the_banner_lists_each_dataset_and_its_share(mixture_runs):
    _, out = mixture_runs["full"]
    text = out.stdout
    assert "Dataset: a mixture of 3 (weighted): 180 frames, 9 episodes" in text
    assert "  org/a: 60 frames, 3 episodes at 10 fps, 60.0% of samples" in text
    assert "  org/c: 60 frames, 3 episodes at 20 fps, 10.0% of samples" in text
    _, out = mixture_runs["concat"]
    assert "Dataset: a mixture of 3 (concatenated: each frame once per epoch)" in out.stdout
    assert "33.3% of samples" in out.stdout


def test_metrics_count_each_datasets_samples_and_follow_the_weights(mixture_runs):
    run, _ = mixture_runs["full"]
    records = _records(run)
    keys = [f"samples/org/{k}" for k in "abc"]
    for record in records:  # every log step: all ranks' samples so far (global batch 16)
        assert sum(record[k] for k in keys) == 16 * record["step"], record
    last = records[-1]
    total = sum(last[k] for k in keys)
    for key, weight in zip(keys, WEIGHTS, strict=True):
        sigma = math.sqrt(total * weight * (1 - weight))
        assert abs(last[key] - total * weight) <= 3 * sigma, (key, last[key], total * weight)


def test_plain_concatenation_counts_every_frame_once_per_epoch(mixture_runs):
    run, _ = mixture_runs["concat"]
    last = _records(run)[-1]
    # 6 steps x 16 = 96 samples of an epoch of 180 frames: counts never exceed a dataset's frames
    counts = [last[f"samples/org/{k}"] for k in "abc"]
    assert sum(counts) == 96 and all(0 < c <= 60 for c in counts)


def test_a_resumed_mixture_logs_the_uninterrupted_losses_bitwise(mixture_runs):
    full = {r["step"]: r for r in _records(mixture_runs["full"][0])}
    resumed = [r for r in _records(mixture_runs["resumed"][0]) if r["step"] > 6]
    assert [r["step"] for r in resumed][-1] == 12
    for record in resumed:
        want = full[record["step"]]
        assert record["loss"] == want["loss"], record["step"]
        assert all(record[f"samples/org/{k}"] == want[f"samples/org/{k}"] for k in "abc")


def test_eval_split_holds_out_each_datasets_last_episodes(mixture_runs):
    run, out = mixture_runs["held"]
    # per dataset and task the last ceil(3 x 0.3) = 1 of 3 episodes: 25 frames each
    assert "Eval: 3 of 9 episodes held out" in out.stdout and "on 75 frames" in out.stdout
    assert (
        "Dataset: a mixture of 3 (concatenated: each frame once per epoch): 105 frames, 6 episodes"
        in out.stdout
    )
    evals = [r for r in _records(run) if "eval/loss" in r]
    assert [r["step"] for r in evals] == [3] and math.isfinite(evals[0]["eval/loss"])
