"""LeRobot's eval videos: the first ``max_episodes`` episodes of an eval (``lerobot-eval``: 10,
``lerobot-train``: 4, LeRobot's numbers), each an mp4 of the frames its env renders after the reset and
after every step, cut as LeRobot 0.6.1's ``eval_policy`` cuts them (``frames[: done_index + 1]``), at the
env's ``render_fps``, in ``<videos_dir>/eval_episode_<i>.mp4``.

Each video is written by one rank, the one that rolled its episode out (the episodes' batches are dealt
to the ranks), so N ranks write the files one process writes, and every file is whole once the results
are gathered. Written atomically (a staged file renamed over the name), never through a symlink planted
at the name or the directory. Unlike LeRobot, the envs a last partial batch runs and
throws away get no video: ``video_paths`` lists the first ``min(10, n_episodes)`` episodes, in order.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lerobot_cli.evaluation.plan import RolloutBatch
from lerobot_cli.evaluation.rollout import BatchRollout
from lerobot_cli.filewrites import writing

MAX_EPISODES_RENDERED = 10  # LeRobot's lerobot-eval (max_episodes_rendered)
DEFAULT_FPS = 30  # LeRobot's, for an env whose metadata has no render_fps
LIBX264 = {"g": 250, "crf": 23}  # libx264's defaults, which LeRobot's write_video keeps


def video_path(videos_dir: Path | str, episode_ix: int) -> Path:
    return Path(videos_dir) / f"eval_episode_{episode_ix}.mp4"


def video_paths(
    videos_dir: Path | str, n_episodes: int, max_episodes: int = MAX_EPISODES_RENDERED
) -> list[str]:
    """The ``video_paths`` of ``eval_info.json``: one per rendered episode, in order."""
    return [str(video_path(videos_dir, i)) for i in range(min(max_episodes, n_episodes))]


class EpisodeVideos:
    """``render(batch)`` for :func:`~lerobot_cli.evaluation.run.evaluate_batches` (the batch's frame
    callback, or None when it keeps no episode to render) and ``write(batch, rollout)`` after it."""

    def __init__(self, videos_dir: Path | str, max_episodes: int = MAX_EPISODES_RENDERED) -> None:
        self.videos_dir = Path(videos_dir)
        self.max_episodes = max_episodes
        self._frames: list[np.ndarray] = []
        self._fps = DEFAULT_FPS

    def render(self, batch: RolloutBatch) -> Callable[[Any], None] | None:
        n = sum(1 for ep in batch.episodes if ep < self.max_episodes)  # the batch's first n envs
        self._frames = []
        if n == 0:
            return None

        def render_frame(env: Any) -> None:
            self._fps = env.metadata.get("render_fps", DEFAULT_FPS)
            self._frames.append(np.stack(env.call("render")[:n]))

        return render_frame

    def write(self, batch: RolloutBatch, rollout: BatchRollout) -> None:
        if not self._frames:
            return
        from lerobot_ckpt.commit.filesystem import staged_sibling
        from lerobot_ckpt.paths import refuse_link

        from lerobot_cli.datasets.mp4 import encode_episode

        stacked = np.stack(self._frames, axis=1)  # (n, t, h, w, c)
        self._frames = []
        done_indices = torch.argmax(rollout.dones.to(int), dim=1).tolist()
        for i, frames in enumerate(stacked):
            path = video_path(self.videos_dir, batch.episodes[i])
            with writing(path):
                path.parent.mkdir(parents=True, exist_ok=True)
                refuse_link(path.parent, "writing eval videos")
                refuse_link(path, "writing an eval video")
                tmp, f = staged_sibling(path)
                try:
                    with f:
                        f.write(encode_episode(frames[: done_indices[i] + 1], int(self._fps), **LIBX264))
                    os.replace(tmp, path)
                except BaseException:
                    tmp.unlink(missing_ok=True)
                    raise
