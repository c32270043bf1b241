"""``lerobot-train --policy.type=fastwam`` on the bundled demo dataset: a tiny FastWAM trains offline.

The command is the user guide's ``fastwam-tiny`` block (docs/guide.md, section FastWAM), read from the guide
and run as written, with only ``--output_dir`` moved to a temporary directory, so the guide and this test
cannot drift apart. ``--policy.variant=tiny`` builds tiny DiTs and a tiny Wan2.2-shaped VAE and UMT5 from
config, and the task text goes through ``data/tokenizers/demo_bytes`` (the byte-level stand-in the pi0 demo
uses), so nothing is downloaded (the Hugging Face Hub is set offline here). The demo's 64×64 camera becomes
a 5-frame 32×32 video (``num_video_frames=5`` at ``action_video_freq_ratio=1``: every frame, one latent
transition) and the 2-D reaching actions an 8-step chunk. About 30-50 s on 2 CPU cores.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import torch
from lerobot_cli.train import main

REPO = Path(__file__).resolve().parents[3]
GUIDE = REPO / "docs" / "guide.md"
GUIDE_BLOCK = re.compile(r"<!-- test: id=fastwam-tiny\b[^>]*-->\s*```bash\n(.*?)```", re.DOTALL)


def guide_command() -> list[str]:
    """The guide's ``fastwam-tiny`` command as ``lerobot-train`` arguments; its relative ``data/`` paths (the
    repository's bundled dataset and tokenizer) resolved against the repository, as the guide's test does."""
    block = GUIDE_BLOCK.search(GUIDE.read_text())
    assert block, "docs/guide.md lost its fastwam-tiny block"
    argv = shlex.split(block.group(1).replace("\\\n", " "))
    assert argv[0] == "lerobot-train", argv
    return [re.sub(r"^(--[\w.]+=)data/", lambda m: f"{m.group(1)}{REPO / 'data'}/", a) for a in argv[1:]]


def flag(argv: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    assert values, f"the guide's fastwam-tiny command has no --{name}"
    return values[-1]


DEMO_FLAGS = guide_command()
STEPS, LOG = int(flag(DEMO_FLAGS, "steps")), int(flag(DEMO_FLAGS, "log_freq"))


def test_a_tiny_fastwam_trains_offline_on_the_demo_and_its_loss_goes_down(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "demo_fastwam"
    assert flag(DEMO_FLAGS, "save_freq") == str(STEPS) and STEPS % LOG == 0, DEMO_FLAGS
    argv = [*DEMO_FLAGS, f"--output_dir={out}"]  # the guide's command; later flags win
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "Policy: fastwam; learnable params 73,050 / total 73,050" in printed, printed
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows]
    assert len(losses) == STEPS // LOG
    # both parts are logged, lambda-weighted (1.0 each here), and they sum to the loss
    for row in rows:
        assert abs(row["loss_video"] + row["loss_action"] - row["loss"]) < 1e-4 * row["loss"]
    # flow matching draws new noise and timesteps every step, so single values are noisy: the last two
    # logged losses against the first two (measured 4.52, 3.76 -> 2.23, 2.12 here)
    first, last = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
    assert last < 0.75 * first, losses

    # the checkpoint: LeRobot's config.json (tiny networks written out), our variant beside it, and a
    # policy that loads from it and acts on a demo frame
    saved = out / "checkpoints" / "last" / "pretrained_model"
    config = json.loads((saved / "config.json").read_text())
    assert config["type"] == "fastwam" and config["video_dit_config"]["hidden_dim"] == 32
    assert json.loads((saved / "config_extensions.json").read_text())["variant"] == "tiny"
    from lerobot_cli.policies.weights import load_policy

    _, policy = load_policy(saved)
    frame = {
        "observation.images.top": torch.rand(1, 3, 64, 64),
        "observation.state": torch.zeros(1, 2),
        "task": ["Move the blue dot onto the red target."],
    }
    chunk = policy.predict_action_chunk(frame)
    assert chunk.shape == (1, 8, 2) and chunk.dtype == torch.float32 and torch.isfinite(chunk).all()
    assert torch.equal(policy.select_action(frame), chunk[:, 0])


def test_features_the_config_derives_are_not_held_against_the_dataset():
    """FastWAM's config fills in LeRobot's synthetic features (one full-size camera, its state and action)
    when given none: nobody fixed them, so the run fits them to the dataset instead of refusing the demo
    for lacking ``observation.images.image``; features someone gave are still checked."""
    from lerobot_cli.features import FeatureType, PolicyFeature
    from lerobot_cli.policies import registry
    from lerobot_cli.workload import features_are_derived

    fastwam = registry.config_class("fastwam")
    assert features_are_derived(fastwam())
    assert features_are_derived(fastwam(variant="tiny", action_dim=2, proprio_dim=None, image_size=(32, 32)))
    given = {"observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, 224, 448))}
    assert not features_are_derived(fastwam(input_features=given))
    act = registry.config_class("act")
    assert not features_are_derived(act(input_features=given))
    assert features_are_derived(act())  # nothing given, nothing derived: nothing to check either


def test_the_guides_downloads_are_the_commands_a_run_asks_for():
    """docs/guide.md's "What to download first" lists, line for line, the ``hf download`` commands a
    full-size run names when a part is missing from the cache (the VAE, UMT5, its tokenizer, the base)."""
    from lerobot_cli.policies.fastwam import sources
    from lerobot_cli.policies.fastwam.config import FASTWAM_BASE_MODEL_ID, FastWAMConfig

    section = GUIDE.read_text().split("### What to download first", 1)[1]
    block = re.search(r"```text\n(.*?)```", section, re.DOTALL)
    assert block, "docs/guide.md lost the FastWAM downloads block"
    listed = block.group(1).strip().splitlines()

    config = FastWAMConfig()
    parts = [
        (sources.VAE, sources.WAN22_DIFFUSERS_MODEL_ID),
        (sources.TEXT_ENCODER, config.text_encoder_model_id),
        (sources.TOKENIZER, config.tokenizer_model_id),
    ]
    asked = []
    for part, source in parts:
        line = sources.FrozenPartUnavailableError(part, source, "not cached").naming(None)
        asked.append(re.search(r"download it once with network access: (hf download .*?) \(", line).group(1))
    assert config.base_model_id == FASTWAM_BASE_MODEL_ID
    asked.append(f"hf download {config.base_model_id}")  # base.py's line
    assert listed == asked
