"""``--rename_map`` on two processes, DDP and FSDP2: a tiny ACT trained on a camera named
``observation.images.top`` fine-tunes on a dataset whose camera is ``observation.images.front``. The rename is
the pre-processor's, so each rank renames its own batches; the fine-tuned checkpoint saves the map and our
loader feeds it ``front``-keyed batches. One torchrun launch holds every run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot_cli.datasets.writer import EpisodeData, write_dataset

pytestmark = pytest.mark.slow

TOP, FRONT = "observation.images.top", "observation.images.front"
SHAPE = [24, 32, 3]
ACT = [
    "--policy.type=act",
    "--policy.pretrained_backbone_weights=null",
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_heads=2",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.n_vae_encoder_layers=1",
    "--policy.chunk_size=5",
    "--policy.n_action_steps=5",
]
RUN = ["--num_workers=0", "--batch_size=2", "--steps=2", "--log_freq=1"]


def _write(root: Path, camera: str, seed: int, scale: float) -> Path:
    features = {
        "observation.state": {"dtype": "float32", "shape": [3], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
        camera: {"dtype": "video", "shape": SHAPE, "names": ["height", "width", "channels"]},
    }

    def episode(ep: int, n: int) -> EpisodeData:
        rng = np.random.default_rng(seed + ep)
        t = np.arange(n, dtype=np.float32)
        return EpisodeData(
            task="reach",
            frames={
                "observation.state": (seed + scale * rng.normal(size=(n, 3))).astype(np.float32),
                "action": np.stack([t / n, -scale * t / n], axis=1).astype(np.float32),
                camera: rng.integers(0, int(120 * scale), (n, *SHAPE), dtype=np.uint8),
            },
        )

    return write_dataset(root, 10, features, (episode(e, n) for e, n in enumerate([12, 10])))


@pytest.fixture(scope="module")
def runs(launch, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rename_map")
    top, front = _write(tmp / "top", TOP, 10, 1.0), _write(tmp / "front", FRONT, 20, 2.0)
    base = tmp / "base" / "checkpoints" / "last" / "pretrained_model"
    tune = [
        "--dataset.repo_id=org/front",
        f"--dataset.root={front}",
        f"--policy.path={base}",
        f"--rename_map={json.dumps({FRONT: TOP})}",
        *RUN,
    ]
    outs = launch.lerobot_train_runs(
        ["--dataset.repo_id=org/top", f"--dataset.root={top}", *ACT, *RUN, f"--output_dir={tmp / 'base'}"],
        [*tune, f"--output_dir={tmp / 'ddp'}"],
        [*tune, "--parallelism.dp_shard=-1", f"--output_dir={tmp / 'fsdp'}"],
        nproc=2,
    )
    return {"ddp": (tmp / "ddp", outs[1]), "fsdp": (tmp / "fsdp", outs[2])}


@pytest.mark.parametrize(("name", "mode"), [("ddp", "(DDP)"), ("fsdp", "(FSDP2)")])
def test_each_rank_renames_and_the_checkpoint_keeps_the_map(runs, name, mode):
    from lerobot_cli.policies.pretrained import load_pretrained
    from lerobot_cli.processors import load_processors

    run, out = runs[name]
    assert "world size 2; topology dp_replicate=" in out.stdout and mode in out.stdout, out.stdout
    assert f"Rename: {FRONT} → {TOP} (--rename_map" in out.stdout
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(np.isfinite(losses)), losses
    pretrained = run / "checkpoints" / "last" / "pretrained_model"
    steps = json.loads((pretrained / "policy_preprocessor.json").read_text())["steps"]
    assert steps[0]["config"] == {"rename_map": {FRONT: TOP}}
    pre, _ = load_processors(pretrained)
    _, policy = load_pretrained(pretrained)
    batch = pre({FRONT: torch.rand((1, 3, *SHAPE[:2])), "observation.state": torch.randn((1, 3))})
    with torch.no_grad():
        assert policy.predict_action_chunk(batch).shape == (1, 5, 2)
