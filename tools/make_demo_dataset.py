"""Write the demo dataset: a simulated 2-D reaching task in the exact LeRobot v3.0 layout.

A point agent in the unit square is driven by a scripted expert (proportional controller with a speed
limit, plus Gaussian action noise) towards a target; a 64x64 top camera renders both. Everything is drawn
from ``--seed``, so the same command always writes the same dataset. The shipped copy is::

    uv run python tools/make_demo_dataset.py --output data/lerobot/demo_reach --overwrite

and ``HF_LEROBOT_HOME=data uv run lerobot-train --dataset.repo_id=lerobot/demo_reach ...`` trains on it
offline. File-size limits are deliberately tiny so the copy has several data and video files.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from lerobot_cli.datasets.writer import EpisodeData, FileLimits, write_dataset

TASK = "Move the blue dot onto the red target."
SIZE = 64
CAMERA = "observation.images.top"


def render(agent: np.ndarray, target: np.ndarray) -> np.ndarray:
    """uint8 (64, 64, 3) top view: grey floor with a border, red target disk, blue agent disk."""
    image = np.full((SIZE, SIZE, 3), 48, np.uint8)
    image[[0, -1], :] = image[:, [0, -1]] = 160
    ys, xs = np.mgrid[0:SIZE, 0:SIZE] + 0.5
    for (x, y), radius, color in ((target, 6.0, (220, 40, 40)), (agent, 4.5, (40, 90, 230))):
        image[(xs - x * SIZE) ** 2 + (ys - y * SIZE) ** 2 <= radius**2] = color
    return image


def simulate_episode(rng: np.random.Generator, max_steps: int, camera: bool) -> EpisodeData:
    """One expert demonstration; it ends a few frames after the agent settles on the target."""
    agent = rng.uniform(0.1, 0.9, 2)
    target = rng.uniform(0.15, 0.85, 2)
    while np.linalg.norm(target - agent) < 0.4:
        target = rng.uniform(0.15, 0.85, 2)
    states, actions, images, settled = [], [], [], 0
    for _ in range(max_steps):
        step = target - agent
        norm = np.linalg.norm(step)
        step = step * min(1.0, 0.015 / norm) if norm > 0 else step
        action = np.clip(agent + step + rng.normal(0.0, 0.004, 2), 0.0, 1.0)
        states.append(agent.copy())
        actions.append(action)
        if camera:
            images.append(render(agent, target))
        agent = agent + 0.8 * (action - agent)
        settled = settled + 1 if np.linalg.norm(target - agent) < 0.01 else 0
        if settled >= 8:
            break
    frames = {
        "observation.state": np.asarray(states, np.float32),
        "observation.environment_state": np.repeat(target[None].astype(np.float32), len(states), axis=0),
        "action": np.asarray(actions, np.float32),
    }
    if camera:
        frames[CAMERA] = np.stack(images)
    return EpisodeData(task=TASK, frames=frames)


def features(camera: bool) -> dict[str, dict]:
    out = {
        "observation.state": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
        "observation.environment_state": {
            "dtype": "float32",
            "shape": [2],
            "names": ["target_x", "target_y"],
        },
        "action": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
    }
    if camera:
        out[CAMERA] = {"dtype": "video", "shape": [SIZE, SIZE, 3], "names": ["height", "width", "channels"]}
    return out


def build(
    root: Path,
    *,
    seed: int = 0,
    num_episodes: int = 30,
    fps: int = 10,
    max_steps: int = 100,
    camera: bool = True,
    vcodec: str = "h264",
    data_mb: float = 0.05,
    video_mb: float = 0.1,
    chunks_size: int = 1000,
) -> Path:
    """Simulate and write the dataset (deterministic in ``seed``)."""
    rng = np.random.default_rng(seed)

    def episodes() -> Iterator[EpisodeData]:
        for _ in range(num_episodes):
            yield simulate_episode(rng, max_steps, camera)

    return write_dataset(
        root,
        fps,
        features(camera),
        episodes(),
        robot_type="point2d",
        vcodec=vcodec,
        limits=FileLimits(
            chunks_size=chunks_size, data_files_size_in_mb=data_mb, video_files_size_in_mb=video_mb
        ),
    )


def verify(root: Path, seed: int, num_episodes: int, max_steps: int) -> float:
    """Largest mean |decoded - rendered| (in [0, 1]) over each episode's first and last camera frame."""
    from lerobot_cli.datasets.dataset import LeRobotDataset

    dataset = LeRobotDataset(root)
    rng = np.random.default_rng(seed)
    worst, row = 0.0, 0
    for _ in range(num_episodes):
        rendered = simulate_episode(rng, max_steps, camera=True).frames[CAMERA]
        for offset in (0, len(rendered) - 1):
            decoded = dataset[row + offset][CAMERA].permute(1, 2, 0).numpy()
            worst = max(worst, float(np.abs(decoded - rendered[offset] / 255.0).mean()))
        row += len(rendered)
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, default=Path("data/lerobot/demo_reach"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_episodes", type=int, default=30)
    parser.add_argument("--fps", type=int, default=10)
    parser.add_argument("--max_steps", type=int, default=100)
    parser.add_argument("--no_camera", action="store_true", help="state-only dataset (no video)")
    parser.add_argument("--vcodec", default="h264", choices=["h264", "hevc", "libsvtav1"])
    parser.add_argument("--data_files_size_in_mb", type=float, default=0.05)
    parser.add_argument("--video_files_size_in_mb", type=float, default=0.1)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset at --output")
    args = parser.parse_args(argv)
    if args.output.exists():
        if not args.overwrite or not (args.output / "meta" / "info.json").is_file():
            print(
                f"error: {args.output} exists (pass --overwrite to replace a dataset there)", file=sys.stderr
            )
            return 2
        shutil.rmtree(args.output)
    camera = not args.no_camera
    build(
        args.output,
        seed=args.seed,
        num_episodes=args.num_episodes,
        fps=args.fps,
        max_steps=args.max_steps,
        camera=camera,
        vcodec=args.vcodec,
        data_mb=args.data_files_size_in_mb,
        video_mb=args.video_files_size_in_mb,
    )
    files = sorted(p.relative_to(args.output) for p in args.output.rglob("*") if p.is_file())
    size = sum((args.output / p).stat().st_size for p in files)
    print(f"wrote {args.output}: {len(files)} files, {size / 1024:.0f} KiB")
    for path in files:
        print(f"  {path}")
    if camera:
        error = verify(args.output, args.seed, args.num_episodes, args.max_steps)
        print(f"video check: worst mean |decoded - rendered| = {error:.4f} (of 1.0)")
        if error > 0.05:
            print("error: decoded video frames differ from the rendered ones", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
