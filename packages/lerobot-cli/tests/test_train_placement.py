"""lerobot-train never places a batch's per-sample host values (the dataset ``index``, which pi0,
diffusion and FastWAM read on the host for their per-sample draws) on the device: neither the
pre-processor's ``DeviceStep`` nor the loop's placement after it. Run in this process on the demo dataset,
every ``Tensor.to(device)`` recorded (lerobot_trainloop.testing.UploadRecorder: on a CPU run the call
that would copy on an accelerator): the ``index`` the loop receives at each step (the object the collate
made: no processor step replaces it) was uploaded 0 times, the normalised state once (the loop's placement:
on an accelerator a no-op, ``DeviceStep`` placed it before the normaliser)."""

from __future__ import annotations

from pathlib import Path

import torch
from lerobot_cli import runner
from lerobot_cli.processors.steps import DeviceStep
from lerobot_cli.train import main
from lerobot_trainloop.batch import HOST_KEYS
from lerobot_trainloop.loop import TrainLoop
from lerobot_trainloop.testing import UploadRecorder

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "data" / "lerobot" / "demo_reach"


def test_lerobot_train_keeps_the_index_on_the_host(tmp_path, monkeypatch):
    assert DeviceStep.host_keys is HOST_KEYS  # one declaration for both placements
    seen: list[dict] = []
    real_step = TrainLoop.train_step

    def train_step(self, batch, *args, **kwargs):
        seen.append(dict(batch))  # what the pre-processor made: the loop's placement comes next
        return real_step(self, batch, *args, **kwargs)

    monkeypatch.setattr(TrainLoop, "train_step", train_step)
    monkeypatch.setattr(runner, "_setup_logging", lambda is_main: None)  # keep pytest's log capture
    argv = [
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        "--num_workers=0",
        "--policy.type=mlp",
        "--policy.hidden_dim=32",
        "--batch_size=4",
        "--steps=3",
        "--save_checkpoint=false",
        f"--output_dir={tmp_path / 'run'}",
    ]
    with UploadRecorder() as rec:
        assert main(argv) == 0
    assert len(seen) == 3
    index_uploads = [rec.uploads_of(batch["index"], any_label=True) for batch in seen]
    assert index_uploads == [0, 0, 0], f"host->device moves of index per step: {index_uploads}"
    # the recorder sees this run's placements (the loop's placement of the normalised state)
    assert [rec.uploads_of(batch["observation.state"], any_label=True) for batch in seen] == [1, 1, 1]


def test_cameras_reach_the_policy_as_normalised_floats(tmp_path, monkeypatch):
    """The dataset hands training its cameras as uint8 (a quarter of the bytes through the workers'
    shared memory and to the device); the runner makes them float in [0, 1] on the device before the
    pre-processor, so the policy sees what a float dataset gives: with ImageNet's mean/std (the default)
    every normalised value lies within [-2.2, 2.7], where raw bytes would reach ~1100."""
    seen: list[dict] = []
    real_step = TrainLoop.train_step

    def train_step(self, batch, *args, **kwargs):
        seen.append(dict(batch))
        return real_step(self, batch, *args, **kwargs)

    monkeypatch.setattr(TrainLoop, "train_step", train_step)
    monkeypatch.setattr(runner, "_setup_logging", lambda is_main: None)
    argv = [
        "--dataset.repo_id=lerobot/demo_reach",
        f"--dataset.root={DEMO}",
        "--num_workers=0",
        "--policy.type=act",
        "--policy.dim_model=16",
        "--policy.n_heads=2",
        "--policy.dim_feedforward=16",
        "--policy.n_encoder_layers=1",
        "--policy.n_decoder_layers=1",
        "--policy.chunk_size=4",
        "--policy.n_action_steps=4",
        "--policy.pretrained_backbone_weights=null",
        "--batch_size=2",
        "--steps=2",
        "--save_checkpoint=false",
        f"--output_dir={tmp_path / 'run'}",
    ]
    assert main(argv) == 0
    camera = "observation.images.top"
    for batch in seen:
        image = batch[camera]
        assert image.dtype == torch.float32 and image.shape[-3:] == (3, 64, 64)
        assert -2.2 <= float(image.min()) and float(image.max()) <= 2.7
