"""One rank's share of an evaluation: its batches of the episode plan rolled out one after another, their
kept episodes' results returned. The caller gathers the ranks' results by episode index
(``evaluation.ranks``) and writes ``eval_info.json`` (``results.eval_info``).

The policy is put in eval mode for the rollouts and given back in the mode it came in (LeRobot's
``eval_policy``), so an eval during training leaves training as it was.

Noise: with ``seed``, the torch RNG is seeded with ``seed + batch.index`` before each batch, so a policy
that draws noise when it acts (diffusion's denoising) draws the same for a batch whichever rank rolls it
out and whatever ran before: N ranks give the episodes one process gives. Batch 0 is seeded with ``seed``
itself, as LeRobot's ``lerobot-eval`` seeds once (``set_seed(seed)``) before its first batch; its later
batches continue that one stream, so for a noise-drawing policy only batch 0 matches LeRobot's (a
deterministic policy matches in every batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from lerobot_cli.evaluation.plan import RolloutBatch
from lerobot_cli.evaluation.results import EpisodeResult, episode_results
from lerobot_cli.evaluation.rollout import BatchRollout, Processor, rollout_batch


def evaluate_batches(
    env: Any,
    policy: torch.nn.Module,
    preprocessor: Processor,
    postprocessor: Processor,
    batches: Sequence[RolloutBatch],
    *,
    keep_stepping: Callable[[bool], bool] | None = None,
    seed: int | None = None,
    grad_mode: Callable[[], AbstractContextManager] = torch.inference_mode,
    autocast: Callable[[], AbstractContextManager] = nullcontext,
    render: Callable[[RolloutBatch], Callable[[Any], None] | None] | None = None,
    after_batch: Callable[[RolloutBatch, BatchRollout], None] | None = None,
) -> list[EpisodeResult]:
    """Roll out ``batches`` (this rank's, from ``EpisodePlan.for_rank``) in ``env``, whose number of envs
    is the plan's batch size; fillers are rolled out (lockstep) and keep nothing. ``grad_mode`` wraps
    each ``select_action`` (LeRobot's ``inference_mode``; a sharded policy needs ``no_grad``: FSDP2's
    gathered parameters must not become inference tensors the next training step would reuse),
    ``autocast`` the whole rollout (the run's mixed precision, as LeRobot's ``accelerator.autocast()``).
    ``render(batch)`` gives the batch's video callback, if any; ``after_batch(batch, rollout)`` is
    called after each batch (its videos are written then)."""
    was_training = policy.training
    policy.eval()
    results: list[EpisodeResult] = []
    try:
        with torch.no_grad():
            for batch in batches:
                if seed is not None:
                    torch.manual_seed(seed + batch.index)
                with autocast():
                    rollout = rollout_batch(
                        env,
                        policy,
                        preprocessor,
                        postprocessor,
                        batch.seeds,
                        keep_stepping=keep_stepping,
                        grad_mode=grad_mode,
                        render_callback=render(batch) if render is not None else None,
                    )
                results.extend(episode_results(batch, rollout))
                if after_batch is not None:
                    after_batch(batch, rollout)
    finally:
        policy.train(was_training)
    return results
