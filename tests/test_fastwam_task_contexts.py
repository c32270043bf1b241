"""``--policy.precompute_task_contexts=true`` through ``lerobot-train`` on FSDP2 x2, against encoding on the
fly.

A dataset of three tasks and two cameras with names of their own (written by the test: the bundled demo has
one task, so it could not tell one task's context from another's). Rank 0 encodes each task once and
broadcasts the table; each rank then picks its samples' rows. The losses and held-out losses are the on-the-
fly run's at every step (1e-5 relative: the contexts come from a differently sized matrix product,
``contexts.py``), the banner says no rank holds the text encoder, the EMA shadow (which shares the contexts)
follows its updates, and the saved policy still encodes its prompt (``config.json``'s ``load_text_encoder``
stays true; the switch is in ``config_extensions.json``). One launch of two runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from fastwam_flags import TINY_FASTWAM

BIN = Path(sys.executable).parent
TASKS = ("stack the red cube on the blue one", "open the top drawer", "wipe the table")
CAMERAS = ("observation.images.wrist_left", "observation.images.scene")

pytestmark = pytest.mark.slow


def _episode(index: int, rng: np.random.Generator):
    from lerobot_cli.datasets.writer import EpisodeData

    length = 14
    t = np.linspace(0.0, 1.0, length, dtype=np.float32)
    state = np.stack([t * (index + 1), np.sin(3 * t + index)], axis=1).astype(np.float32)
    frames = {camera: rng.integers(0, 256, (length, 24, 40, 3), dtype=np.uint8) for camera in CAMERAS}
    return EpisodeData(
        task=TASKS[index % len(TASKS)],
        frames={**frames, "observation.state": state, "action": np.roll(state, -1, axis=0)},
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    from lerobot_cli.datasets.writer import write_dataset

    vector = {"dtype": "float32", "shape": [2], "names": None}
    features = {
        **{
            camera: {"dtype": "image", "shape": [24, 40, 3], "names": ["height", "width", "channel"]}
            for camera in CAMERAS
        },
        "observation.state": vector,
        "action": vector,
    }
    rng = np.random.default_rng(0)
    episodes = [_episode(i, rng) for i in range(6)]
    return write_dataset(tmp_path_factory.mktemp("tasks") / "ds", 10, features, episodes)


@pytest.fixture(scope="module")
def runs(dataset, tmp_path_factory, launch) -> dict[str, Path | str]:
    root = tmp_path_factory.mktemp("runs")
    flags = [
        "--dataset.repo_id=local/three_tasks",
        f"--dataset.root={dataset}",
        "--dataset.eval_split=0.5",  # one episode of each task held out
        "--eval_steps=3",  # on the EMA weights
        "--ema.enable=true",  # the shadow shares the policy's contexts
        "--num_workers=0",
        "--policy.type=fastwam",
        "--policy.torch_dtype=float32",
        *TINY_FASTWAM,
        "--policy.image_size=[32,64]",  # two cameras, each 32 x 32
        "--policy.optimizer_lr=1e-3",
        "--parallelism.dp_shard=2",
        "--batch_size=3",
        "--steps=3",
        "--log_freq=1",
    ]
    out: dict[str, Path | str] = {"encoded": root / "encoded", "precomputed": root / "precomputed"}
    both = [
        [*flags, f"--output_dir={out['encoded']}"],
        [
            *flags,
            "--policy.precompute_task_contexts=true",
            "--save_freq=1",
            f"--output_dir={out['precomputed']}",
        ],
    ]
    printed = launch.lerobot_train_runs(*both, nproc=2, env={"HF_HUB_OFFLINE": "1"})
    out.update(
        {f"{name}.stdout": p.stdout for name, p in zip(("encoded", "precomputed"), printed, strict=True)}
    )
    return out


def _metrics(out: Path) -> dict[tuple[int, str], float]:
    found = {}
    for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()):
        for key, value in row.items():
            if "loss" in key and isinstance(value, (int, float)):
                found[row["step"], key] = float(value)
    return found


def test_precomputed_contexts_give_the_encoded_losses_with_no_encoder_on_any_rank(runs):
    stdout = runs["precomputed.stdout"]
    assert (
        "Task contexts: 3 task(s) encoded once on rank 0, 0.05 MiB per rank; the text encoder (0.13 MiB) is "
        "held by 0 of 2 rank(s) while training (--policy.precompute_task_contexts=true)"
    ) in stdout, stdout[-3000:]
    assert "Task contexts" not in runs["encoded.stdout"]
    reference, got = _metrics(runs["encoded"]), _metrics(runs["precomputed"])
    assert {step for step, _ in reference} == {1, 2, 3}
    assert any("eval" in key for _, key in reference), sorted(reference)
    assert got.keys() == reference.keys()
    for key, value in reference.items():
        assert abs(got[key] - value) <= 1e-5 * max(1.0, abs(value)), (key, got[key], value)


def test_the_saved_policy_still_encodes_its_prompt(runs):
    saved = runs["precomputed"] / "checkpoints" / "000003" / "pretrained_model"
    assert json.loads((saved / "config.json").read_text())["load_text_encoder"] is True
    assert json.loads((saved / "config_extensions.json").read_text())["precompute_task_contexts"] is True


def test_the_ema_of_a_sharded_fastwam_follows_its_updates(runs):
    """``--ema.enable=true`` on FSDP2 x2: each rank's shadow of its shards, merged at every save, is the EMA
    recurrence of the live weights (tests/ema_replay.py), bitwise after the first update."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "lerobot_tests_ema_replay", Path(__file__).with_name("ema_replay.py")
    )
    replay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay)
    replay.assert_ema_replays(runs["precomputed"], [1, 2, 3])
