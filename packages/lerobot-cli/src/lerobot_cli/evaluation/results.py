"""Per-episode results of rollouts and the ``eval_info.json`` they make, with LeRobot 0.6.1's arithmetic
and names.

Per episode (LeRobot's ``eval_policy``): the rollout's records are masked from the step after the first
done on (``arange(n_steps) <= done_index + 1``: LeRobot keeps one step past the done step, and so does
this, or the sums would differ where a batch ran on), then ``sum_reward`` = sum, ``max_reward`` = max,
``success`` = any success, with the env's ``seed``. Reduced in torch as LeRobot reduces, so the floats are
LeRobot's to the bit.

``eval_info.json`` is LeRobot 0.6.1's ``lerobot-eval`` file (``eval_policy_all``'s ``per_task``,
``per_group`` and ``overall``) plus ``per_episode`` and ``aggregated`` as its ``eval_policy`` returns them
(``episode_ix``, ``sum_reward``, ``max_reward``, ``success``, ``seed``): the seeds are what makes a run's
episodes reproducible, and LeRobot's own file drops them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from attrs import asdict, define
from lerobot_ckpt.commit.filesystem import replace_json

from lerobot_cli.evaluation.plan import RolloutBatch
from lerobot_cli.evaluation.rollout import BatchRollout
from lerobot_cli.filewrites import writing

EVAL_INFO = "eval_info.json"


@define(frozen=True)
class EpisodeResult:
    episode_ix: int
    sum_reward: float
    max_reward: float
    success: bool
    seed: int | None


def episode_results(batch: RolloutBatch, rollout: BatchRollout) -> list[EpisodeResult]:
    """The results of ``batch``'s kept episodes (none for a filler) from its ``rollout``."""
    n_steps = rollout.dones.shape[1]
    done_indices = torch.argmax(rollout.dones.to(int), dim=1)  # the first done (argmax takes the first)
    mask = (torch.arange(n_steps) <= (done_indices + 1).unsqueeze(1).expand(-1, n_steps)).int()
    sums = (rollout.rewards * mask).sum(dim=1).tolist()
    maxes = (rollout.rewards * mask).amax(dim=1).tolist()
    successes = (rollout.successes * mask).any(dim=1).tolist()
    return [
        EpisodeResult(
            episode_ix=ep, sum_reward=sums[i], max_reward=maxes[i], success=successes[i], seed=batch.seeds[i]
        )
        for i, ep in enumerate(batch.episodes)
    ]


def _mean(values: Sequence[float | bool]) -> float:
    return float(np.nanmean(np.array(values, dtype=float))) if values else float("nan")


def eval_info(
    results: Iterable[EpisodeResult],
    *,
    task_group: str,
    eval_s: float,
    video_paths: Sequence[str] = (),
    task_id: int = 0,
) -> dict[str, Any]:
    """The ``eval_info.json`` content for one task's episodes (any order in; sorted by episode index)."""
    episodes = sorted(results, key=lambda r: r.episode_ix)
    if [r.episode_ix for r in episodes] != list(range(len(episodes))):
        raise ValueError(
            f"eval results must cover episodes 0..n-1 once each, got {[r.episode_ix for r in episodes]}"
        )
    n = len(episodes)
    sums = [r.sum_reward for r in episodes]
    maxes = [r.max_reward for r in episodes]
    successes = [r.success for r in episodes]
    paths = list(video_paths)
    per_group = {
        "avg_sum_reward": _mean(sums),
        "avg_max_reward": _mean(maxes),
        "pc_success": _mean(successes) * 100 if successes else float("nan"),
        "n_episodes": n,
    }
    return {
        "per_task": [
            {
                "task_group": task_group,
                "task_id": task_id,
                "metrics": {
                    "sum_rewards": sums,
                    "max_rewards": maxes,
                    "successes": successes,
                    "video_paths": paths,
                    "predicted_video_paths": [],
                },
            }
        ],
        "per_group": {task_group: {**per_group, "video_paths": paths, "predicted_video_paths": []}},
        "overall": {
            **per_group,
            "eval_s": eval_s,
            "eval_ep_s": eval_s / max(1, n),
            "video_paths": paths,
            "predicted_video_paths": [],
        },
        "per_episode": [asdict(r) for r in episodes],
        "aggregated": {
            "avg_sum_reward": float(np.nanmean(sums)),
            "avg_max_reward": float(np.nanmean(maxes)),
            "pc_success": float(np.nanmean(successes) * 100),
            "eval_s": eval_s,
            "eval_ep_s": eval_s / max(1, n),
        },
    }


def write_eval_info(directory: Path | str, info: dict[str, Any]) -> Path:
    """Write ``<directory>/eval_info.json`` (``indent=2``, as LeRobot writes it) atomically: a reader never
    sees half a file, and a symlink planted at the name is refused, never written through."""
    path = Path(directory) / EVAL_INFO
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_json(path, info)
    return path
