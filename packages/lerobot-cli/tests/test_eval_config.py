"""``--eval.*``: LeRobot 0.6.1's EvalConfig defaults and batch-size resolution (torch-free)."""

from __future__ import annotations

import pytest
from lerobot_cli.evaluation.config import EvalConfig


def test_defaults_are_lerobots():
    cfg = EvalConfig()
    assert (cfg.n_episodes, cfg.batch_size, cfg.use_async_envs) == (50, 0, True)
    assert (cfg.recording, cfg.recording_repo_id, cfg.recording_private) == (False, None, False)


@pytest.mark.parametrize(
    ("n_episodes", "batch_size", "cpus", "expected"),
    [
        (50, 0, 2, 1),  # floor(2 * 0.7) = 1
        (50, 0, 16, 11),  # floor(16 * 0.7)
        (50, 0, 256, 50),  # capped by n_episodes
        (100, 0, 256, 64),  # and by 64
        (4, 0, 16, 4),
        (3, 8, 16, 3),  # an explicit size is capped by n_episodes too
        (10, 4, 1, 4),  # and otherwise kept, whatever the machine
    ],
)
def test_batch_size_resolves_as_lerobots(n_episodes, batch_size, cpus, expected):
    cfg = EvalConfig(n_episodes=n_episodes, batch_size=batch_size)
    assert cfg.resolved_batch_size(cpu_count=cpus) == expected


@pytest.mark.parametrize(
    ("kwargs", "line"),
    [
        ({"n_episodes": 0}, "--eval.n_episodes must be an integer >= 1, got 0"),
        ({"batch_size": -1}, "--eval.batch_size must be an integer >= 0, got -1"),
        ({"recording_repo_id": "me/evals"}, "--eval.recording_repo_id requires --eval.recording=true"),
    ],
)
def test_bad_values_are_one_line(kwargs, line):
    with pytest.raises(ValueError) as info:
        EvalConfig(**kwargs)
    assert str(info.value) == line


def test_configs_and_plan_import_neither_torch_nor_gymnasium():
    """A run validates --env.*/--eval.* and plans the episodes before it imports torch or an env."""
    import subprocess
    import sys

    code = (
        "import sys; import lerobot_cli.envs, lerobot_cli.envs.make, lerobot_cli.evaluation.config, "
        "lerobot_cli.evaluation.plan; from lerobot_cli.envs import env_config; env_config('pusht'); "
        "from lerobot_cli.evaluation import EpisodePlan; "
        "EpisodePlan(n_episodes=3, batch_size=2).for_rank(1, 2); "
        "heavy = sorted({'torch', 'gymnasium', 'numpy', 'gym_pusht'} & set(sys.modules)); "
        "assert not heavy, f'imported {heavy}'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_env_errors_are_user_errors():
    """The CLI prints a ConfigError (the domain error under its UsageError) as one line and exits 2: a
    missing extra or task is one."""
    from lerobot_cli import runner
    from lerobot_cli.envs.make import EnvUnavailableError
    from lerobot_cli.errors import ConfigError

    assert issubclass(EnvUnavailableError, ConfigError) and ConfigError in runner.USER_ERRORS
