"""The held-out split (``--dataset.eval_split``): which episodes train and which only evaluate.

LeRobot's rule, so a run moved between the two holds out the same episodes: per task (an episode's
first task), the last ``ceil(n * eval_split)`` of its ``n`` episodes, in dataset order. It is a pure
function of the metadata, identical on every rank and in every run, and it works on episodes, not
frames: the training dataset is built from the other episodes only, so its sampler cannot draw a
held-out frame whatever its seed, epoch or topology.
"""

from __future__ import annotations

import math

import numpy as np
from attrs import define

from lerobot_cli.datasets import layout as L
from lerobot_cli.datasets.errors import DatasetError
from lerobot_cli.datasets.metadata import DatasetMeta


@define(frozen=True)
class EpisodeSplit:
    train: tuple[int, ...]
    eval: tuple[int, ...]
    tasks: int  # distinct tasks among the episodes split
    whole_tasks: tuple[str, ...] = ()  # tasks with too few episodes to keep one for training


def _task_of(tasks) -> str:
    if tasks is None or (isinstance(tasks, float) and math.isnan(tasks)) or len(tasks) == 0:
        return ""
    return str(tasks[0])


def split_episodes(meta: DatasetMeta, eval_split: float) -> EpisodeSplit:
    """Split ``meta``'s episodes (already the ``--dataset.episodes`` selection) by task."""
    episodes = meta.episodes[L.EP_INDEX].tolist()
    task_lists = meta.episodes.get(L.EP_TASKS, np.empty(len(episodes), dtype=object))
    by_task: dict[str, list[int]] = {}
    for ep, tasks in zip(episodes, task_lists, strict=True):
        by_task.setdefault(_task_of(tasks), []).append(int(ep))
    train: list[int] = []
    held: list[int] = []
    whole = []
    for task, eps in by_task.items():
        n_eval = math.ceil(len(eps) * eval_split)
        train += eps[: len(eps) - n_eval]
        held += eps[len(eps) - n_eval :]
        if n_eval == len(eps):
            whole.append(task or "(no task)")
    if not train:
        raise DatasetError(
            f"--dataset.eval_split={eval_split} holds out every one of the {len(episodes)} episodes of "
            f"{meta.root} (per task, the last ceil(n x {eval_split}) of its n episodes): use a smaller "
            "fraction, or more episodes"
        )
    return EpisodeSplit(tuple(sorted(train)), tuple(sorted(held)), len(by_task), tuple(whole))


def eval_sample_indices(task_index: np.ndarray, max_samples: int) -> list[int]:
    """The held-out frames to evaluate on: all of them, or (``max_samples`` > 0) LeRobot's cap, the
    first ``max(1, max_samples // tasks)`` frames of each task."""
    if max_samples <= 0:
        return list(range(len(task_index)))
    tasks = sorted(set(task_index.tolist()))
    per_task = max(1, max_samples // len(tasks))
    chosen: list[int] = []
    for t in tasks:
        chosen += np.flatnonzero(task_index == t)[:per_task].tolist()
    return sorted(chosen)
