"""Write the PushT demo dataset: scripted rollouts in gym-pusht, with LeRobot's ``lerobot/pusht`` features.

Each episode resets ``gym_pusht/PushT-v0`` (``obs_type="pixels_agent_pos"``) with its own seed (``--seed``
plus the episode index) and runs a scripted expert: it picks the point of the T's outline whose push moves
the block most towards the target pose (its translation and, linearised, its rotation), goes round the
block to stand behind that point, and pushes; the target positions it sends get small Gaussian noise from
a generator seeded with (``--seed``, episode index). It is no match for ``lerobot/pusht``'s human
demonstrations, but its rewards are far above a random policy's. The columns are ``lerobot/pusht``'s:
``observation.image`` (the env's 96x96 camera, as video), ``observation.state`` (``agent_pos``),
``action`` (the agent's target position, in the env's pixel coordinates 0..512), and ``next.reward`` /
``next.success`` / ``next.done`` (the env's reward and success after the action; done on each episode's
last frame), at 10 fps.

Everything is drawn from ``--seed``, so the same command always writes the same dataset: the same data
and meta files, and videos of the same frames (the mp4 bytes vary with the encoder's threads). PushT's
rewards come from a shapely intersection whose last float64 bit can change between env instances; stored
as float32, that practically never shows. ``packages/lerobot-cli/tests/test_demo_pusht.py`` checks the
shipped copy against a fresh build. The shipped copy is::

    uv run python tools/make_demo_pusht.py --output data/lerobot/demo_pusht --overwrite

and ``HF_LEROBOT_HOME=data uv run lerobot-train --dataset.repo_id=lerobot/demo_pusht ...`` trains on it
offline. Needs ``lerobot-cli[pusht]`` (gym-pusht). File-size limits are tiny so the copy has several data
and video files.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from lerobot_cli.datasets.writer import EpisodeData, FileLimits, write_dataset

TASK = "Push the T-shaped block onto the T-shaped target."
CAMERA = "observation.image"
SIZE = 96  # gym-pusht's observation_width/height default
AGENT_RADIUS = 15.0
# The T's outline in the block's local frame (gym_pusht's add_tee, scale 30): bar x in [-60, 60],
# y in [0, 30]; stem x in [-15, 15], y in [30, 120]. Each edge: start, end, outward normal.
EDGES = (
    ((-60, 0), (60, 0), (0, -1)),
    ((60, 0), (60, 30), (1, 0)),
    ((60, 30), (15, 30), (0, 1)),
    ((15, 30), (15, 120), (1, 0)),
    ((15, 120), (-15, 120), (0, 1)),
    ((-15, 120), (-15, 30), (-1, 0)),
    ((-15, 30), (-60, 30), (0, 1)),
    ((-60, 30), (-60, 0), (-1, 0)),
)
OUTLINE = np.array([edge[0] for edge in EDGES], np.float64)


def _contacts(spacing: float = 7.5) -> tuple[np.ndarray, np.ndarray]:
    """Points along the outline that the agent can touch (corners and the inner corners' near sides left
    out) and their outward normals, in the block's frame."""
    from shapely.geometry import Point, Polygon

    tee = Polygon(OUTLINE)
    points, normals = [], []
    for start, end, normal in EDGES:
        start, end = np.asarray(start, np.float64), np.asarray(end, np.float64)
        count = int(np.linalg.norm(end - start) // spacing)
        for t in (np.arange(count) + 0.5) / count:
            point = start + t * (end - start)
            if tee.distance(Point(point + np.asarray(normal) * (AGENT_RADIUS + 1))) >= AGENT_RADIUS:
                points.append(point)
                normals.append(normal)
    return np.asarray(points), np.asarray(normals, np.float64)


COM = np.array([0.0, 45.0])  # the T's centre of gravity in its frame (add_tee)


def _rotation(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s], [s, c]])


def _wrap(angle: float) -> float:
    return float((angle + np.pi) % (2 * np.pi) - np.pi)


class Expert:
    """The scripted pusher; it reads the block's pose from the env, as a teleoperator sees the scene.

    Steps are in the env's pixels: ``push_step`` / ``min_push`` bound a push (it shrinks with the
    displacement still needed), ``max_step`` a move towards the next contact, ``clearance`` is the gap
    it keeps from the block until it pushes.
    """

    def __init__(
        self, push_step: float = 50.0, max_step: float = 100.0, clearance: float = 8.0, min_push: float = 8.0
    ) -> None:
        self.push_step, self.max_step, self.clearance = push_step, max_step, clearance
        self.min_push = min_push
        self.contacts, self.normals = _contacts()
        self.contact: int | None = None

    def __call__(self, agent: np.ndarray, block_pos, block_angle: float, goal: np.ndarray) -> np.ndarray:
        """The next target position of the agent, given the block's pose and the goal's (x, y, angle)."""
        from shapely.geometry import LineString, Polygon

        rot, pos = _rotation(block_angle), np.asarray(block_pos, np.float64)
        com = pos + rot @ COM
        error = goal[:2] + _rotation(goal[2]) @ COM - com
        turn = _wrap(goal[2] - block_angle)
        points = self.contacts @ rot.T + pos
        pushes = -(self.normals @ rot.T)
        lever = points - com
        # the displacement each contact point needs, linearised: translation + turn * perp(lever)
        wanted = error + turn * np.stack([-lever[:, 1], lever[:, 0]], axis=1)
        score = np.einsum("ij,ij->i", pushes, wanted)
        best = int(np.argmax(score))
        if self.contact is None or score[best] > 1.25 * score[self.contact] + 1.0:
            self.contact = best
        i = self.contact
        behind = np.dot(points[i] - agent, pushes[i])  # agent's distance behind the point, along the push
        lateral = abs(pushes[i][0] * (agent - points[i])[1] - pushes[i][1] * (agent - points[i])[0])
        if 0 < behind < AGENT_RADIUS + 2 * self.clearance and lateral < 8:
            return agent + pushes[i] * float(np.clip(score[i], self.min_push, self.push_step))
        approach = points[i] - pushes[i] * (AGENT_RADIUS + self.clearance)
        tee = Polygon(OUTLINE @ rot.T + pos).buffer(AGENT_RADIUS + 2)
        if tee.intersects(LineString([agent, approach])):  # go round the block
            here = np.arctan2(*(agent - com)[::-1])
            delta = _wrap(np.arctan2(*(approach - com)[::-1]) - here)
            radius = 80.0 + AGENT_RADIUS + self.clearance
            arc = np.sign(delta) * min(abs(delta), self.max_step / radius)
            approach = com + radius * np.array([np.cos(here + arc), np.sin(here + arc)])
        step = approach - agent
        norm = np.linalg.norm(step)
        return agent + (step * min(1.0, self.max_step / norm) if norm > 0 else step)


def make_env(max_steps: int):
    """gym-pusht's PushT as LeRobot records it: the 96x96 camera and the agent's position."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # rgb_array needs no display
    import gym_pusht  # noqa: F401 - registers gym_pusht/PushT-v0
    import gymnasium as gym

    return gym.make(
        "gym_pusht/PushT-v0",
        obs_type="pixels_agent_pos",
        render_mode="rgb_array",
        max_episode_steps=max_steps,
    )


def simulate_episode(env, seed: int, index: int, noise: float) -> tuple[EpisodeData, float]:
    """Episode ``index``: the env reset with ``seed + index``, the action noise drawn from (seed, index).

    It ends at success (the env terminates) or after the env's ``max_episode_steps``. Returns the episode
    and its largest coverage of the target.
    """
    rng = np.random.default_rng([seed, index])
    obs, _ = env.reset(seed=seed + index)
    pusht, expert = env.unwrapped, Expert()
    columns: dict[str, list] = {k: [] for k in (CAMERA, "observation.state", "action", "next.reward")}
    columns["next.success"], coverage = [], 0.0
    while True:
        target = expert(obs["agent_pos"], pusht.block.position, pusht.block.angle, pusht.goal_pose)
        action = np.clip(target + rng.normal(0.0, noise, 2), 0.0, 512.0).astype(np.float32)
        columns[CAMERA].append(obs["pixels"])
        columns["observation.state"].append(obs["agent_pos"].astype(np.float32))
        columns["action"].append(action)
        obs, reward, terminated, truncated, info = env.step(action.astype(np.float64))
        columns["next.reward"].append(reward)
        columns["next.success"].append(info["is_success"])
        coverage = max(coverage, float(info["coverage"]))
        if terminated or truncated:
            break
    done = np.zeros(len(columns["action"]), bool)
    done[-1] = True  # as in lerobot/pusht: done on each episode's last frame
    frames = {
        CAMERA: np.stack(columns[CAMERA]),
        "observation.state": np.stack(columns["observation.state"]),
        "action": np.stack(columns["action"]),
        "next.reward": np.asarray(columns["next.reward"], np.float32),
        "next.success": np.asarray(columns["next.success"], bool),
        "next.done": done,
    }
    return EpisodeData(task=TASK, frames=frames), coverage


def features() -> dict[str, dict]:
    """lerobot/pusht's features and names; the camera at gym-pusht's observation size."""
    motors = {"motors": ["motor_0", "motor_1"]}
    return {
        CAMERA: {"dtype": "video", "shape": [SIZE, SIZE, 3], "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": [2], "names": motors},
        "action": {"dtype": "float32", "shape": [2], "names": motors},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        "next.success": {"dtype": "bool", "shape": [1], "names": None},
    }


def build(
    root: Path,
    *,
    seed: int = 0,
    num_episodes: int = 20,
    fps: int = 10,
    max_steps: int = 100,
    noise: float = 2.0,
    vcodec: str = "h264",
    data_mb: float = 0.05,
    video_mb: float = 0.1,
    chunks_size: int = 1000,
) -> tuple[Path, list[float]]:
    """Simulate and write the dataset (deterministic in ``seed``); returns its root and each episode's
    largest coverage."""
    env = make_env(max_steps)
    coverages: list[float] = []

    def episodes() -> Iterator[EpisodeData]:
        for index in range(num_episodes):
            episode, coverage = simulate_episode(env, seed, index, noise)
            coverages.append(coverage)
            yield episode

    try:
        root = write_dataset(
            root,
            fps,
            features(),
            episodes(),
            robot_type="2d pointer",
            vcodec=vcodec,
            limits=FileLimits(
                chunks_size=chunks_size, data_files_size_in_mb=data_mb, video_files_size_in_mb=video_mb
            ),
        )
    finally:
        env.close()
    return root, coverages


def verify(root: Path, seed: int, num_episodes: int, max_steps: int, noise: float) -> float:
    """Largest mean |decoded - rendered| (in [0, 1]) over each episode's first and last camera frame."""
    from lerobot_cli.datasets.dataset import LeRobotDataset

    dataset = LeRobotDataset(root)
    env = make_env(max_steps)
    worst, row = 0.0, 0
    try:
        for index in range(num_episodes):
            rendered = simulate_episode(env, seed, index, noise)[0].frames[CAMERA]
            for offset in (0, len(rendered) - 1):
                decoded = dataset[row + offset][CAMERA].permute(1, 2, 0).numpy()
                worst = max(worst, float(np.abs(decoded - rendered[offset] / 255.0).mean()))
            row += len(rendered)
    finally:
        env.close()
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, default=Path("data/lerobot/demo_pusht"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_episodes", type=int, default=20)
    parser.add_argument("--fps", type=int, default=10)
    parser.add_argument("--max_steps", type=int, default=100, help="frames per episode at most")
    parser.add_argument("--noise", type=float, default=2.0, help="action noise std, in pixels")
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
    _, coverages = build(
        args.output,
        seed=args.seed,
        num_episodes=args.num_episodes,
        fps=args.fps,
        max_steps=args.max_steps,
        noise=args.noise,
        vcodec=args.vcodec,
        data_mb=args.data_files_size_in_mb,
        video_mb=args.video_files_size_in_mb,
    )
    files = sorted(p.relative_to(args.output) for p in args.output.rglob("*") if p.is_file())
    size = sum((args.output / p).stat().st_size for p in files)
    print(f"wrote {args.output}: {len(files)} files, {size / 1024:.0f} KiB")
    for path in files:
        print(f"  {path}")
    successes = sum(c > 0.95 for c in coverages)
    print(
        f"expert: mean max coverage {np.mean(coverages):.3f}, "
        f"{successes} of {len(coverages)} episodes succeed (coverage > 0.95)"
    )
    error = verify(args.output, args.seed, args.num_episodes, args.max_steps, args.noise)
    print(f"video check: worst mean |decoded - rendered| = {error:.4f} (of 1.0)")
    if error > 0.05:
        print("error: decoded video frames differ from the rendered ones", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
