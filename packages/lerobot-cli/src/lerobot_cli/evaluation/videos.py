"""Videos of an evaluation's first episodes, as LeRobot 0.6.1's ``eval_policy`` renders them: the envs'
``render()`` after the reset and after every step, each episode cut at its first done step
(``frames[:done_index + 1]``, LeRobot's cut), one ``eval_episode_<i>.mp4`` per episode (H.264, yuv420p),
``i`` the episode's index in the plan. LeRobot records the first ``max_episodes`` episodes it rolls out;
so does the one rank that records here (rank 0, which rolls out batch 0): on one process the plan's first
episodes, LeRobot's; on N ranks rank 0's first ones (batch 0, then batch N, ...), still one rank writing
every video.

Written atomically (a staged file renamed over the name), never through a symlink planted at it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lerobot_ckpt.commit.filesystem import staged_sibling
from lerobot_ckpt.paths import refuse_link

from lerobot_cli.evaluation.plan import RolloutBatch
from lerobot_cli.evaluation.rollout import BatchRollout
from lerobot_cli.filewrites import writing


class EpisodeRecorder:
    """Records the first ``max_episodes`` episodes of the batches it is shown."""

    def __init__(self, directory: Path | str, max_episodes: int, fps: int) -> None:
        self.directory, self.max_episodes, self.fps = Path(directory), max_episodes, fps
        self.paths: list[str] = []
        self._frames: list[np.ndarray] = []
        self._count = 0

    def start(self, batch: RolloutBatch) -> Callable[[Any], None] | None:
        """The render callback for ``batch``'s rollout, or None when none of its episodes is recorded."""
        self._count = min(len(batch.episodes), self.max_episodes - len(self.paths))
        self._frames = []
        if self._count == 0:
            return None

        def render(env: Any) -> None:
            self._frames.append(np.stack(env.call("render")[: self._count]))

        return render

    def finish(self, batch: RolloutBatch, rollout: BatchRollout) -> None:
        """Write the recorded episodes of ``batch`` (LeRobot's cut at each one's done step)."""
        if self._count == 0 or not self._frames:
            return
        from lerobot_cli.datasets.mp4 import encode_episode

        frames = np.stack(self._frames, axis=1)  # (envs, steps + 1, h, w, c)
        done = torch.argmax(rollout.dones.to(int), dim=1).tolist()
        self.directory.mkdir(parents=True, exist_ok=True)
        refuse_link(self.directory, "writing eval videos")
        for i, episode in enumerate(batch.episodes[: self._count]):
            path = self.directory / f"eval_episode_{episode}.mp4"
            _write_atomically(path, encode_episode(frames[i, : done[i] + 1], self.fps))
            self.paths.append(str(path))
        self._frames = []


def _write_atomically(path: Path, data: bytes) -> None:
    with writing(path):
        refuse_link(path, "writing an eval video")
        tmp, f = staged_sibling(path)
        try:
            with f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
