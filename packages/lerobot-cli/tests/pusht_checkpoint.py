"""A tiny PushT policy checkpoint for the ``lerobot-eval`` tests: the bundled PushT demo (96x96 camera,
2-D state and action) and one ``lerobot-train`` step of a tiny policy on it: ``ACT`` (it reads the camera
and the state: both reach its actions) or the cheaper ``MLP`` (state only), with the training-time
simulation eval of that step (``EVAL``) beside the checkpoint. Loaded by path (the tests are not a
package) by test_lerobot_eval.py and tests/test_lerobot_eval_ranks.py."""

from __future__ import annotations

import json
from pathlib import Path

DEMO_PUSHT = Path(__file__).resolve().parents[3] / "data" / "lerobot" / "demo_pusht"  # the bundled demo
# The eval both sides run: 3 episodes of 8 steps in batches of 2 (batch 1 keeps one of its two envs).
EVAL = [
    "--env.type=pusht",
    "--env.episode_length=8",
    "--eval.n_episodes=3",
    "--eval.batch_size=2",
    "--eval.use_async_envs=false",
]


ACT = [
    "--policy.type=act",
    "--policy.pretrained_backbone_weights=null",
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_heads=2",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.n_vae_encoder_layers=1",
    "--policy.chunk_size=4",
    "--policy.n_action_steps=4",
]
MLP = ["--policy.type=mlp", "--policy.hidden_dim=16"]


def train_tiny(root: Path, policy: list[str]) -> Path:
    """``<root>/run``: one training step of ``policy`` (``ACT`` or ``MLP``), its checkpoint, and the
    simulation eval of that step (``training_eval``)."""
    from lerobot_cli.train import main

    out = root / "run"
    flags = [
        "--dataset.repo_id=lerobot/demo_pusht",
        f"--dataset.root={DEMO_PUSHT}",
        *policy,
        "--policy.device=cpu",
        "--policy.push_to_hub=false",
        "--save_checkpoint=true",
        "--steps=1",
        "--batch_size=2",
        "--num_workers=0",
        "--env_eval_freq=1",
        *EVAL,
        f"--output_dir={out}",
    ]
    assert main(flags) == 0
    return out


def training_eval(out: Path) -> dict:
    return json.loads((out / "eval" / "step_000001" / "eval_info.json").read_text())


def read_eval_info(directory: Path) -> dict:
    return json.loads((directory / "eval_info.json").read_text())


def same_episodes(got: list[dict], want: list[dict]) -> None:
    """The same episodes: index, seed, success and every action (their SHA-256) exactly, rewards to
    gym-pusht's reproducibility (1e-12; test_env_pusht.py)."""
    key = ("episode_ix", "seed", "success", "actions_sha256")
    assert [[e[k] for k in key] for e in got] == [[e[k] for k in key] for e in want]
    for a, b in zip(got, want, strict=True):
        assert abs(a["sum_reward"] - b["sum_reward"]) <= 1e-12
        assert abs(a["max_reward"] - b["max_reward"]) <= 1e-12


def video_frames(path: Path) -> list[tuple[int, int]]:
    """The (height, width) of every frame of the mp4 at ``path``."""
    import av

    with av.open(str(path)) as container:
        return [(frame.height, frame.width) for frame in container.decode(video=0)]
