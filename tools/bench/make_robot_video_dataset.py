"""Write a real-resolution robot dataset with LeRobot 0.6.1's own writer: 3 cameras 480x640 at 30 fps,
in LeRobot's default codec (AV1 via libsvtav1) or H.264, 14-dim state and action (a bimanual arm).

Runs in LeRobot's environment (``tools/interop/ci.sh`` builds it)::

    ~/.cache/lerobot-interop/lerobot-0.6.1-py312/bin/python tools/bench/make_robot_video_dataset.py \\
        --root /tmp/robot_av1 [--episodes 8] [--length 150] [--vcodec libsvtav1|h264]

Frames are a synthetic scene, not noise: a textured table, two arms (bars) moving smoothly, a camera
shake and a little sensor noise, so the encoder's bitrate and the decoder's work are in the range of
real tabletop footage (noise alone would be an incompressible worst case; flat colour a trivial one).
Camera names differ in style on purpose (``front``, ``wrist_left``, ``top.rgb``) and each camera sees its
own scene."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np

CAMERAS = ("observation.images.front", "observation.images.wrist_left", "observation.images.top.rgb")
HEIGHT, WIDTH, FPS, DOF = 480, 640, 30, 14


def _texture(rng: np.random.Generator) -> np.ndarray:
    """A static table/background: low-frequency colour fields plus fine grain (uint8 HxWx3)."""
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    base = np.stack(
        [
            120
            + 60 * np.sin(xx / rng.uniform(40, 90) + rng.uniform(0, 6)) * np.cos(yy / rng.uniform(50, 80)),
            110 + 50 * np.cos(xx / rng.uniform(60, 120)) + 20 * np.sin(yy / rng.uniform(20, 40)),
            100 + 40 * np.sin((xx + yy) / rng.uniform(30, 70)),
        ],
        axis=-1,
    )
    base += rng.normal(0, 6, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def _frame(background: np.ndarray, t: float, cam: int, rng: np.random.Generator) -> np.ndarray:
    dy, dx = int(3 * np.sin(2.1 * t + cam)), int(3 * np.cos(1.7 * t + cam))
    img = np.roll(background, (dy, dx), axis=(0, 1)).copy()
    for arm in range(2):  # two moving arms with a gripper block
        x = int(WIDTH * (0.3 + 0.4 * arm + 0.15 * np.sin(0.9 * t + arm + cam)))
        y = int(HEIGHT * (0.5 + 0.25 * np.cos(0.7 * t + 2 * arm)))
        img[max(0, y - 150) : y, max(0, x - 12) : x + 12] = (200 - 60 * arm, 190, 60 + 80 * cam)
        img[max(0, y - 20) : y + 20, max(0, x - 30) : x + 30] = (40, 40 + 60 * arm, 200)
    img = img.astype(np.int16) + rng.integers(-4, 5, img.shape, dtype=np.int16)
    return np.clip(img, 0, 255).astype(np.uint8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--length", type=int, default=150, help="frames per episode (5 s at 30 fps)")
    parser.add_argument("--vcodec", default="libsvtav1", help="LeRobot's default: libsvtav1 (AV1)")
    args = parser.parse_args(argv)

    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    names = [f"joint_{i}" for i in range(DOF)]
    features = {
        "observation.state": {"dtype": "float32", "shape": (DOF,), "names": names},
        "action": {"dtype": "float32", "shape": (DOF,), "names": names},
        **{
            cam: {"dtype": "video", "shape": (HEIGHT, WIDTH, 3), "names": ["height", "width", "channels"]}
            for cam in CAMERAS
        },
    }
    if args.root.exists():
        shutil.rmtree(args.root)
    encoder = RGBEncoderConfig(vcodec=args.vcodec)
    ds = LeRobotDataset.create(
        repo_id="bench/robot_video", fps=FPS, features=features, root=args.root, rgb_encoder=encoder
    )
    rng = np.random.default_rng(0)
    backgrounds = [_texture(rng) for _ in CAMERAS]
    begin = time.perf_counter()
    for episode in range(args.episodes):
        phase = rng.uniform(0, 6)
        for i in range(args.length):
            t = phase + i / FPS
            q = np.sin(t + np.arange(DOF) * 0.3).astype(np.float32)
            frame = {"observation.state": q, "action": np.roll(q, 1), "task": "fold the towel"}
            for cam, bg in enumerate(backgrounds):
                frame[CAMERAS[cam]] = _frame(bg, t, cam, rng)
            ds.add_frame(frame)
        ds.save_episode()
        print(
            f"episode {episode + 1}/{args.episodes} written ({time.perf_counter() - begin:.0f} s)", flush=True
        )
    ds.finalize()
    sizes = sum(p.stat().st_size for p in (args.root / "videos").rglob("*.mp4"))
    print(
        f"{args.root}: {args.episodes} episodes x {args.length} frames, 3 cameras {HEIGHT}x{WIDTH} "
        f"{args.vcodec}, videos {sizes / 2**20:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
