"""The tiny FastWAM's ``--policy.*`` flags, shared by the tests that train one through ``lerobot-train``.

The size of the guide's ``fastwam-tiny`` block (packages/lerobot-cli/tests/test_fastwam_demo.py): tiny DiTs,
a tiny VAE and UMT5 built from config and the bundled byte-level tokenizer, so nothing is read from the Hub
cache; a 5-frame 32x32 video, 8-step chunks, the demo's 2-D state and action (``TINY_FASTWAM``, which the
guide's harness adds to a full-size command); ``DEMO_FASTWAM`` trains it on the bundled demo dataset,
offline, in float32. Importable as ``fastwam_flags`` (tests/conftest.py puts tests/ on ``sys.path``).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
TOKENIZER = REPO / "data" / "tokenizers" / "demo_bytes"

TINY_FASTWAM = [
    "--policy.variant=tiny",
    f"--policy.tokenizer_model_id={TOKENIZER}",
    "--policy.action_dim=2",
    "--policy.proprio_dim=2",
    "--policy.num_video_frames=5",
    "--policy.action_video_freq_ratio=1",
    "--policy.action_horizon=8",
    "--policy.n_action_steps=8",
    "--policy.image_size=[32,32]",
]
# The demo dataset trained offline, float32 (exact comparisons between layouts).
DEMO_FASTWAM = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=0",
    "--policy.type=fastwam",
    "--policy.torch_dtype=float32",
    *TINY_FASTWAM,
]
