"""The parts of the training-time simulation eval that need no env: the banner line, the check that the
policy fits the env, the vote on one process (a signal stops the eval at the next env step), and how a
failure is told from a lost peer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from lerobot_cli.cli.argv import split_argv
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.evaluation.ranks import EvalInterrupted, Lockstep, raised_in_a_collective
from lerobot_cli.features import PolicyFeature
from lerobot_cli.policies.mlp.config import MLPConfig
from lerobot_cli.sim_eval import EnvPolicyMismatch, check_policy_fits_env, describe_sim_eval

REPO = Path(__file__).resolve().parents[3]


def build(*flags: str):
    base = ["--dataset.repo_id=org/x", "--policy.type=mlp", "--env.type=pusht"]
    return build_train_config(split_argv([*base, *flags]).flags).config


def test_the_banner_says_how_the_episodes_are_split():
    cfg = build("--eval.n_episodes=50", "--env_eval_freq=5000")
    assert describe_sim_eval(cfg, 10, 4) == (
        "Sim eval: 50 episodes of pusht (PushT-v0) every 5000 steps, 5 batches of 10 envs over 4 ranks "
        "(2 each), live weights, seeds from 1000"
    )
    cfg = build("--eval.n_episodes=3", "--ema.enable=true", "--seed=7")
    assert describe_sim_eval(cfg, 3, 1).endswith(
        "1 batch of 3 envs over 1 rank (1 each), EMA weights, seeds from 7"
    )


def test_the_dry_run_prints_the_split(capsys):
    from lerobot_cli.dry_run import dry_run

    cfg = build(
        "--dataset.repo_id=lerobot/demo_pusht",
        f"--dataset.root={REPO / 'data' / 'lerobot' / 'demo_pusht'}",
        "--eval.batch_size=10",
        "--parallelism.dp_shard=4",
    ).finalized()
    assert dry_run(cfg) == 0
    assert "5 batches of 10 envs over 4 ranks (2 each)" in capsys.readouterr().out


def _policy(**inputs) -> MLPConfig:
    return MLPConfig(
        input_features={k: PolicyFeature(t, s) for k, (t, s) in inputs.items()},
        output_features={"action": PolicyFeature("ACTION", (2,))},
    )


OBSERVATION = {"observation.image": torch.zeros(1, 3, 96, 96), "observation.state": torch.zeros(1, 2)}


def test_a_policy_that_fits_the_env_passes():
    cfg = _policy(**{"observation.image": ("VISUAL", (3, 96, 96)), "observation.state": ("STATE", (2,))})
    check_policy_fits_env(cfg, {}, OBSERVATION, (2,))
    renamed = _policy(**{"observation.images.top": ("VISUAL", (3, 96, 96))})
    check_policy_fits_env(renamed, {"observation.image": "observation.images.top"}, OBSERVATION, (2,))


@pytest.mark.parametrize(
    ("inputs", "action", "says"),
    [
        (
            {"observation.images.top": ("VISUAL", (3, 96, 96))},
            (2,),
            "the policy reads observation.images.top",
        ),
        (
            {"observation.image": ("VISUAL", (3, 64, 64))},
            (2,),
            "of shape (3, 64, 64), the env gives (3, 96, 96)",
        ),
        (
            {"observation.state": ("STATE", (2,))},
            (7,),
            "the policy's action has shape (2,), the env takes (7,)",
        ),
    ],
)
def test_a_policy_that_does_not_fit_is_one_line(inputs, action, says):
    with pytest.raises(EnvPolicyMismatch) as err:
        check_policy_fits_env(_policy(**inputs), {}, OBSERVATION, action)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_one_process_votes_locally_and_a_signal_stops_at_the_next_step():
    signum = [0]
    vote = Lockstep(None, torch.device("cpu"), 1, lambda: signum[0])
    assert vote(False) is True and vote(True) is False
    vote.finish()
    signum[0] = 15
    with pytest.raises(EvalInterrupted) as err:
        vote(False)
    assert err.value.signum == 15


def test_an_error_out_of_a_collective_is_told_from_the_evals_own():
    """gloo reports a peer that died during a sharded forward's all-gather as a plain RuntimeError; the
    eval names it a lost rank (when its failure vote cannot complete either) by where it was raised."""
    assert not dist.is_initialized()
    with pytest.raises(ValueError) as err:  # raised inside torch.distributed, as gloo's errors are
        dist.all_reduce(torch.zeros(1))
    assert raised_in_a_collective(err.value)
    assert raised_in_a_collective(dist.DistNetworkError("connection closed"))

    def env_step():
        raise RuntimeError("injected env failure")

    with pytest.raises(RuntimeError) as err:
        env_step()
    assert not raised_in_a_collective(err.value)
    assert not raised_in_a_collective(RuntimeError("Connection reset by peer"))  # its text is not enough
