"""``lerobot-train --dataset.image_transforms.enable=true``: a tiny ACT on the demo dataset (its camera feeds
the backbone) trains on augmented frames, and a run saved and resumed ends with the same weights, bit for
bit, as the uninterrupted run (the draws are seeded per sample, not by the worker or the global RNG), for
a map-style dataset, a weighted mixture and ``--dataset.streaming=true``. In-process."""

from __future__ import annotations

from pathlib import Path

import pytest
from lerobot_cli.train import main

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
ONE = ["--dataset.repo_id=lerobot/demo_reach", f"--dataset.root={DEMO}"]
MIXTURE = [  # the demo twice, sampled 70/30: a weighted mixture's draws are keyed too
    '--dataset.repo_id=["org/a","org/b"]',
    f'--dataset.root=["{DEMO}","{DEMO}"]',
    "--dataset.weights=[0.7,0.3]",
]
SOURCES = {
    "map": ONE,
    "streaming": [*ONE, "--dataset.streaming=true", "--dataset.streaming_buffer_size=16"],
    "mixture": MIXTURE,
}
ACT = [
    "--policy.type=act",
    "--policy.pretrained_backbone_weights=null",
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_encoder_layers=1",
    "--policy.n_vae_encoder_layers=1",
    "--policy.chunk_size=5",
    "--policy.n_action_steps=5",
    "--batch_size=2",
    "--log_freq=0",
    "--save_freq=2",
]
AUGMENT = ["--dataset.image_transforms.enable=true", "--dataset.image_transforms.max_num_transforms=6"]


def weights(run: Path, step: int) -> bytes:
    return (run / "checkpoints" / f"{step:06d}" / "pretrained_model" / "model.safetensors").read_bytes()


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_an_augmented_run_resumed_matches_the_uninterrupted_one_bitwise(tmp_path, source):
    streaming = source == "streaming"
    extra = SOURCES[source]
    whole, split, plain = tmp_path / "whole", tmp_path / "split", tmp_path / "plain"
    assert main([*ACT, *AUGMENT, *extra, "--num_workers=0", "--steps=4", f"--output_dir={whole}"]) == 0
    assert main([*ACT, *AUGMENT, *extra, "--num_workers=0", "--steps=2", f"--output_dir={split}"]) == 0
    config = split / "checkpoints" / "000002" / "pretrained_model" / "train_config.json"
    workers = [] if streaming else ["--num_workers=2"]  # map-style: the workers do not change the draws
    assert main(["--resume=true", f"--config_path={config}", "--steps=4", *workers]) == 0
    assert weights(split, 4) == weights(whole, 4)
    if source != "map":
        return
    # The augmentation is really applied: without it the same run trains other weights.
    assert main([*ACT, *extra, "--num_workers=0", "--steps=2", f"--output_dir={plain}"]) == 0
    assert weights(plain, 2) != weights(whole, 2)
