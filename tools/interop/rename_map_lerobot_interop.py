"""``--rename_map`` both ways between this stack and LeRobot 0.6.1: a checkpoint fine-tuned with a renamed
camera loads in the other trainer, whose pre-processor renames the camera by itself, and gives the same
actions.

    uv run python tools/interop/rename_map_lerobot_interop.py --lerobot-python <LeRobot env>/bin/python

1. ours (this env): two small datasets written by our writer (``lerobot_cli.datasets.write_dataset``): one
   whose camera is ``observation.images.top``, one whose camera is ``observation.images.front`` (other
   pixels, state and actions). ``lerobot-train`` (``lerobot_cli.train.main``) trains a tiny ACT on ``top``
   (the base), then fine-tunes it on ``front`` with
   ``--rename_map='{"observation.images.front": "observation.images.top"}'``. Our loader
   (``load_pretrained`` + ``load_processors``) computes the reference: a batch keyed
   ``observation.images.front`` through the pre-processor, ``predict_action_chunk`` and the post-processor.
2. LeRobot (its env, this script with ``--lerobot-side``):
   - loads our fine-tuned ``pretrained_model/`` with ``ACTPolicy.from_pretrained`` and
     ``PolicyProcessorPipeline.from_pretrained`` (pre and post), feeds the same ``front``-keyed batch and
     compares its actions with ours (max |Δ| printed; its pre-processor must have renamed the camera);
   - fine-tunes our base on the ``front`` dataset with its own ``lerobot-train --rename_map`` (1 step) and
     writes its actions for the same batch, and which statistics its normaliser saved.
3. ours again: our loader on LeRobot's fine-tuned ``pretrained_model/`` gives LeRobot's actions.

LeRobot's ``lerobot-train`` overrides the pre-processor's statistics with the dataset's, unrenamed, so its
normaliser has none for the renamed camera and passes it through unnormalised; ours renames them (LeRobot's
``rename_stats``, as its rollout does). Either file loads the same on both sides; the driver prints which
statistics each fine-tune saved for the camera.

Exit status 0 (``PASS``) means every comparison held.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

TOP, FRONT = "observation.images.top", "observation.images.front"
RENAME = json.dumps({FRONT: TOP})
SHAPE = [24, 32, 3]
ATOL = 1e-5
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
RUN = ["--num_workers=0", "--batch_size=4", "--steps=2", "--log_freq=1"]


def pretrained(run: Path) -> Path:
    return run / "checkpoints" / "last" / "pretrained_model"


# ---------------------------------------------------------------- our side (imports lerobot_cli)


def write(root: Path, camera: str, seed: int, scale: float) -> Path:
    import numpy as np
    from lerobot_cli.datasets.writer import EpisodeData, write_dataset

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

    return write_dataset(root, 10, features, (episode(e, n) for e, n in enumerate([12, 10, 14])))


def train(argv: list[str]) -> None:
    from lerobot_cli.train import main

    print(f"[ours] lerobot-train {' '.join(argv)}", flush=True)
    if main(argv) != 0:
        raise SystemExit("[ours] lerobot-train failed")


def our_actions(directory: Path, batch: dict) -> tuple[dict, object]:
    """Our loader's pre-processor output and the post-processed action chunk for ``batch``."""
    import torch
    from lerobot_cli.policies.pretrained import load_pretrained
    from lerobot_cli.processors import load_processors

    pre, post = load_processors(directory)
    _, policy = load_pretrained(directory)
    seen = pre({k: v.clone() for k, v in batch.items()})
    with torch.no_grad():
        actions = post(policy.predict_action_chunk(seen))
    return seen, actions


def ours_write(work: Path) -> None:
    import torch
    from safetensors.torch import save_file

    top, front = write(work / "top", TOP, 10, 1.0), write(work / "front", FRONT, 20, 2.0)
    train(["--dataset.repo_id=org/top", f"--dataset.root={top}", *ACT, *RUN, f"--output_dir={work / 'base'}"])
    train(
        [
            "--dataset.repo_id=org/front",
            f"--dataset.root={front}",
            f"--policy.path={pretrained(work / 'base')}",
            f"--rename_map={RENAME}",
            *RUN,
            f"--output_dir={work / 'ours_tuned'}",
        ]
    )
    g = torch.Generator().manual_seed(7)
    batch = {
        FRONT: torch.rand((2, 3, *SHAPE[:2]), generator=g),
        "observation.state": 20 + torch.randn((2, 3)),
    }
    seen, actions = our_actions(pretrained(work / "ours_tuned"), batch)
    assert FRONT not in seen and TOP in seen, sorted(seen)
    save_file({**batch, "actions": actions.contiguous()}, str(work / "ours_reference.safetensors"))


def ours_check(work: Path) -> bool:
    """Our loader on LeRobot's fine-tune: LeRobot's actions for the same batch."""
    from safetensors.torch import load_file

    ref = load_file(str(work / "lerobot_reference.safetensors"))
    expected = ref.pop("actions")
    seen, actions = our_actions(pretrained(work / "lerobot_tuned"), ref)
    diff = float((actions - expected).abs().max())
    renamed = FRONT not in seen and TOP in seen
    print(
        f"[ours] LeRobot's --rename_map fine-tune, our loader: renamed={renamed}, max |Δaction| = {diff:.2e}"
    )
    return renamed and diff <= ATOL


# ---------------------------------------------------------------- LeRobot side (imports lerobot)


def _lerobot_load(directory: Path):
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action

    policy = ACTPolicy.from_pretrained(str(directory))
    policy.eval()
    pre = PolicyProcessorPipeline.from_pretrained(str(directory), "policy_preprocessor.json")
    post = PolicyProcessorPipeline.from_pretrained(
        str(directory),
        "policy_postprocessor.json",
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    return policy, pre, post


def _lerobot_actions(directory: Path, batch: dict):
    import torch

    policy, pre, post = _lerobot_load(directory)
    seen = pre({k: v.clone() for k, v in batch.items()})
    with torch.no_grad():
        actions = post(policy.predict_action_chunk(seen))
    return seen, actions, pre


def _camera_stats(pre) -> str:
    step = next(s for s in pre.steps if type(s).__name__ == "NormalizerProcessorStep")
    keys = sorted(k for k in step.stats if k.startswith("observation.images"))
    return ", ".join(keys) or "none"


def lerobot_side(work: Path) -> bool:
    from safetensors.torch import load_file, save_file

    ok = True
    ref = load_file(str(work / "ours_reference.safetensors"))
    expected = ref.pop("actions")
    seen, actions, pre = _lerobot_actions(pretrained(work / "ours_tuned"), ref)
    renamed = FRONT not in seen and TOP in seen
    diff = float((actions - expected).abs().max())
    print(
        f"[lerobot] our --rename_map fine-tune, LeRobot's from_pretrained: rename step "
        f"{pre.steps[0].rename_map}, renamed={renamed}, camera stats saved for {_camera_stats(pre)}, "
        f"max |Δaction| = {diff:.2e}",
        flush=True,
    )
    ok &= renamed and diff <= ATOL

    from lerobot.scripts.lerobot_train import main as lerobot_train

    argv = [
        "--dataset.repo_id=org/front",
        f"--dataset.root={work / 'front'}",
        f"--policy.path={pretrained(work / 'base')}",
        f"--rename_map={RENAME}",
        "--policy.device=cpu",
        "--policy.push_to_hub=false",
        "--wandb.enable=false",
        "--num_workers=0",
        "--batch_size=4",
        "--steps=1",
        "--log_freq=1",
        f"--output_dir={work / 'lerobot_tuned'}",
    ]
    print(f"[lerobot] lerobot-train {' '.join(argv)}", flush=True)
    sys.argv = ["lerobot-train", *argv]
    lerobot_train()
    seen, actions, pre = _lerobot_actions(pretrained(work / "lerobot_tuned"), ref)
    steps = json.loads((pretrained(work / "lerobot_tuned") / "policy_preprocessor.json").read_text())["steps"]
    saved_map = next(s["config"] for s in steps if s["registry_name"] == "rename_observations_processor")
    renamed = FRONT not in seen and TOP in seen
    raw = renamed and bool((seen[TOP] == ref[FRONT]).all())
    print(
        f"[lerobot] its own --rename_map fine-tune: saved {saved_map}, renamed={renamed}, camera stats saved "
        f"for {_camera_stats(pre)}, renamed camera left unnormalised: {raw}",
        flush=True,
    )
    ok &= renamed and saved_map == {"rename_map": {FRONT: TOP}}
    save_file({**ref, "actions": actions.contiguous()}, str(work / "lerobot_reference.safetensors"))
    return ok


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lerobot-python", help="python of an env with lerobot 0.6.x")
    parser.add_argument("--lerobot-side", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lerobot_side is not None:
        return 0 if lerobot_side(args.lerobot_side) else 1
    if not args.lerobot_python:
        parser.error("--lerobot-python is required")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ours_write(work)
        proc = subprocess.run(
            [args.lerobot_python, str(Path(__file__).resolve()), "--lerobot-side", str(work)], check=False
        )
        ok = proc.returncode == 0 and (work / "lerobot_reference.safetensors").is_file()
        if (work / "lerobot_reference.safetensors").is_file():
            ok &= ours_check(work)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
