"""One rank's share of an evaluation: its batches of the episode plan rolled out one after another, their
kept episodes' results returned. Single process today (rank 0 of 1 rolls out every batch); the caller
gathers ranks' results by episode index and writes ``eval_info.json`` (``results.eval_info``).

The policy is put in eval mode for the rollouts and given back in the mode it came in (LeRobot's
``eval_policy``), so an eval during training leaves training as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from lerobot_cli.evaluation.plan import RolloutBatch
from lerobot_cli.evaluation.results import EpisodeResult, episode_results
from lerobot_cli.evaluation.rollout import Processor, rollout_batch


def evaluate_batches(
    env: Any,
    policy: torch.nn.Module,
    preprocessor: Processor,
    postprocessor: Processor,
    batches: Sequence[RolloutBatch],
    *,
    keep_stepping: Callable[[bool], bool] | None = None,
) -> list[EpisodeResult]:
    """Roll out ``batches`` (this rank's, from ``EpisodePlan.for_rank``) in ``env``, whose number of envs
    is the plan's batch size; fillers are rolled out (lockstep) and keep nothing."""
    was_training = policy.training
    policy.eval()
    results: list[EpisodeResult] = []
    try:
        with torch.no_grad():
            for batch in batches:
                rollout = rollout_batch(
                    env, policy, preprocessor, postprocessor, batch.seeds, keep_stepping=keep_stepping
                )
                results.extend(episode_results(batch, rollout))
    finally:
        policy.train(was_training)
    return results
