"""The episode plan of a simulation eval: LeRobot's batches and seeds, dealt to data-parallel ranks so that
N ranks roll out exactly the batches one process does (pure: no env, no torch)."""

from __future__ import annotations

import itertools

import pytest
from lerobot_cli.evaluation.plan import MAX_SEED, EpisodePlan


def test_batches_and_seeds_are_lerobots():
    """LeRobot's eval_policy: batch b resets envs with start_seed + b*B + i, the last batch padded."""
    plan = EpisodePlan(n_episodes=5, batch_size=2, seed=1000)
    batches = plan.batches()
    assert [b.seeds for b in batches] == [(1000, 1001), (1002, 1003), (1004, 1005)]
    assert [b.episodes for b in batches] == [(0, 1), (2, 3), (4,)]
    assert [b.index for b in batches] == [0, 1, 2]
    assert not any(b.filler for b in batches)


@pytest.mark.parametrize(("n_episodes", "batch_size"), [(1, 1), (5, 2), (7, 3), (8, 4), (3, 8), (50, 10)])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_ranks_roll_out_exactly_the_one_process_batches(n_episodes, batch_size, world_size):
    plan = EpisodePlan(n_episodes=n_episodes, batch_size=batch_size, seed=7, eval_step=300)
    shares = [plan.for_rank(rank, world_size) for rank in range(world_size)]
    real = sorted((b for share in shares for b in share if not b.filler), key=lambda b: b.index)
    assert real == list(plan.batches())  # each batch once, with the one-process seeds and episodes
    assert len({len(share) for share in shares}) == 1  # lockstep: every rank rolls out as many batches
    episodes = [ep for b in real for ep in b.episodes]
    assert episodes == list(range(n_episodes))
    for share in shares:
        for batch in share:
            assert len(batch.seeds) == batch_size
            if batch.filler:
                assert batch.episodes == ()
    assert shares[0][0].index == 0  # batch 0 (LeRobot's rendered episodes) is rank 0's


def test_fillers_pad_ranks_with_fewer_batches():
    plan = EpisodePlan(n_episodes=3, batch_size=1, seed=0)
    shares = [plan.for_rank(r, 2) for r in range(2)]
    assert [b.filler for b in shares[0]] == [False, False]
    assert [b.filler for b in shares[1]] == [False, True]
    lonely = [EpisodePlan(n_episodes=1, batch_size=4, seed=0).for_rank(r, 3) for r in range(3)]
    assert [[b.filler for b in share] for share in lonely] == [[False], [True], [True]]


def test_lerobot_rule_evaluates_the_same_episodes_at_every_step():
    """LeRobot's lerobot-train passes start_seed=cfg.seed at every eval: same episodes each time."""
    seeds = {EpisodePlan(n_episodes=4, batch_size=2, seed=5, eval_step=s).batches() for s in (0, 100, 200)}
    assert len(seeds) == 1


def test_per_step_rule_never_shares_an_episode_between_steps():
    seen: set[int] = set()
    for step in (0, 1, 2, 500, 1000):
        plan = EpisodePlan(n_episodes=5, batch_size=2, seed=9, eval_step=step, seed_rule="per_step")
        seeds = [s for b in plan.batches() for s in b.seeds]
        assert len(set(seeds)) == len(seeds) == plan.padded
        assert not seen & set(seeds)
        seen |= set(seeds)
    assert EpisodePlan(n_episodes=5, batch_size=2, seed=9, seed_rule="per_step").start_seed == 9


def test_no_seed_leaves_envs_unseeded():
    plan = EpisodePlan(n_episodes=3, batch_size=2, seed=None)
    assert all(s is None for b in plan.batches() for s in b.seeds)


@pytest.mark.parametrize(
    ("kwargs", "line"),
    [
        ({"n_episodes": 0, "batch_size": 1}, "--eval.n_episodes must be an integer >= 1, got 0"),
        ({"n_episodes": 2, "batch_size": 0}, "--eval.batch_size must be an integer >= 1, got 0"),
        ({"n_episodes": 2, "batch_size": True}, "--eval.batch_size must be an integer >= 1, got True"),
        ({"n_episodes": 2, "batch_size": 1, "seed": -1}, "--seed must be a non-negative integer"),
        ({"n_episodes": 2, "batch_size": 1, "seed_rule": "random"}, "invalid eval seed rule 'random'"),
        (
            {"n_episodes": 2, "batch_size": 1, "seed": MAX_SEED},
            f"--seed={MAX_SEED}: the eval env seeds would reach {MAX_SEED + 1}, past {MAX_SEED}",
        ),
    ],
)
def test_bad_input_is_one_line(kwargs, line):
    with pytest.raises(ValueError, match="^" + line.replace("(", r"\(").replace(")", r"\)")) as info:
        EpisodePlan(**kwargs)
    assert "\n" not in str(info.value)


def test_bad_rank_is_one_line():
    plan = EpisodePlan(n_episodes=2, batch_size=1, seed=0)
    for rank, world in itertools.product((-1, 2), (2,)):
        with pytest.raises(ValueError, match=r"rank must be in \[0, 2\)"):
            plan.for_rank(rank, world)
    with pytest.raises(ValueError, match="world size must be a positive integer"):
        plan.for_rank(0, 0)
