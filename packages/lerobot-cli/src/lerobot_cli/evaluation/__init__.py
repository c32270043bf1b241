"""Simulation evaluation: which episodes with which seeds on which rank (``plan``), one batched rollout as
LeRobot's (``rollout``), a rank's batches (``run``), per-episode results and ``eval_info.json``
(``results``)."""

from lerobot_cli.evaluation.plan import SEED_RULES, EpisodePlan, RolloutBatch

__all__ = ["SEED_RULES", "EpisodePlan", "RolloutBatch"]
