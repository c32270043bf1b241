"""Which episodes one evaluation rolls out, with which env seeds, on which data-parallel rank. Pure (no
torch, no gym): the whole plan is a function of the flags, so every rank computes it alone and agrees.

The unit is LeRobot's rollout batch, never a single episode. LeRobot 0.6.1's ``eval_policy`` rolls out
``ceil(n_episodes / batch_size)`` batches of ``batch_size`` envs one after another; batch ``b`` resets its
envs with seeds ``start_seed + b * batch_size + i`` (``i < batch_size``), the last batch too, whose envs past
``n_episodes`` run and are thrown away. A policy's action for one env depends on the whole batch (batched
kernels are chosen by batch size; a diffusion policy draws its noise for the batch), so an episode is
reproduced only inside the same batch. Rank ``r`` of ``N`` therefore rolls out the batches ``b`` with
``b % N == r``, each exactly as one process would: gathered by episode index, the per-episode results of
``N`` ranks are those of one process, and batch 0 (the episodes LeRobot renders to video) is rank 0's.

Every rank gets the same number of batches: a rank with fewer real ones gets *filler* batches (no episode
kept), so that under a sharded policy, whose every forward is a collective, all ranks keep stepping in
lockstep (``lerobot_cli.evaluation.rollout``).

Seeds: ``start_seed`` is ``seed`` under ``SEED_RULES[0]`` ("lerobot"): LeRobot's ``lerobot-train`` passes
``start_seed=cfg.seed`` at every eval step, so every eval rolls out the same episodes (successive
checkpoints are compared on equal terms) and ``lerobot-eval --seed=<seed>`` on a checkpoint reproduces
them. Under "per_step" the eval step moves the seeds too (``start_seed = seed + eval_step * padded``, where
``padded`` is the number of envs one eval resets), so evals at different steps never share an episode.
``seed=None`` leaves the envs unseeded, as LeRobot does, and then no two runs agree.
"""

from __future__ import annotations

from attrs import define, evolve, field

SEED_RULES = ("lerobot", "per_step")
MAX_SEED = 2**32 - 1  # numpy's legacy RandomState (dm_control, MuJoCo envs) takes nothing larger


def _at_least(flag: str, low: int):
    def check(inst, attribute, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{flag} must be an integer >= {low}, got {value!r}")

    return check


@define(frozen=True)
class RolloutBatch:
    """One rollout of a vector env: its index in the one-process order, one seed per env, and the
    episode indices it keeps (those of its first ``len(episodes)`` envs). A filler keeps none."""

    index: int
    seeds: tuple[int | None, ...]
    episodes: tuple[int, ...]
    filler: bool = False


@define(frozen=True, kw_only=True)
class EpisodePlan:
    """``n_episodes`` in batches of ``batch_size`` envs, seeded from ``seed`` (and ``eval_step`` under the
    "per_step" rule)."""

    n_episodes: int = field(validator=_at_least("--eval.n_episodes", 1))
    batch_size: int = field(validator=_at_least("--eval.batch_size", 1))
    seed: int | None = field(default=None)
    eval_step: int = field(default=0, validator=_at_least("the eval step", 0))
    seed_rule: str = field(default="lerobot")

    @seed.validator
    def _seed(self, attribute, value) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"--seed must be a non-negative integer to seed the eval envs, got {value!r}")

    @seed_rule.validator
    def _rule(self, attribute, value) -> None:
        if value not in SEED_RULES:
            raise ValueError(f"invalid eval seed rule {value!r} (choose from {', '.join(SEED_RULES)})")

    def __attrs_post_init__(self) -> None:
        if self.seed is not None and self.start_seed + self.padded - 1 > MAX_SEED:
            raise ValueError(
                f"--seed={self.seed}: the eval env seeds would reach {self.start_seed + self.padded - 1}, "
                f"past {MAX_SEED}, the largest an env takes"
            )

    @property
    def n_batches(self) -> int:
        return -(-self.n_episodes // self.batch_size)

    @property
    def padded(self) -> int:
        """How many envs one eval resets: every batch is full, the last one too."""
        return self.n_batches * self.batch_size

    @property
    def start_seed(self) -> int | None:
        if self.seed is None:
            return None
        return self.seed + (self.eval_step * self.padded if self.seed_rule == "per_step" else 0)

    def batches(self) -> tuple[RolloutBatch, ...]:
        """Every batch in the one-process order (LeRobot's ``eval_policy`` order and seeds)."""
        out = []
        for b in range(self.n_batches):
            first = b * self.batch_size
            seeds = tuple(
                None if self.start_seed is None else self.start_seed + first + i
                for i in range(self.batch_size)
            )
            episodes = tuple(range(first, min(first + self.batch_size, self.n_episodes)))
            out.append(RolloutBatch(index=b, seeds=seeds, episodes=episodes))
        return tuple(out)

    def for_rank(self, rank: int, world_size: int) -> tuple[RolloutBatch, ...]:
        """Rank ``rank``'s batches: ``b % world_size == rank``, then fillers up to ``ceil(n_batches /
        world_size)`` so every rank rolls out as many batches (a filler repeats the seeds of the last
        batch and keeps nothing)."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world size must be a positive integer, got {world_size!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}")
        every = self.batches()
        mine = list(every[rank::world_size])
        per_rank = -(-len(every) // world_size)
        filler = evolve(every[-1], episodes=(), filler=True)
        return tuple(mine + [filler] * (per_rank - len(mine)))
