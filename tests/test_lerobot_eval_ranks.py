"""``lerobot-eval`` under torchrun: 2 processes each load the whole policy, roll out their share of the
batches (3 episodes in batches of 2: rank 0 batch 0, rank 1 batch 1) and report the episodes one process
reports; an env that raises on one rank ends the job in one line naming that rank, with nothing written.
The single-process command and its bad inputs: packages/lerobot-cli/tests/test_lerobot_eval.py.
Needs lerobot-cli[pusht]."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

pytest.importorskip("gym_pusht", reason="lerobot-cli[pusht] (uv sync installs it)")

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(  # the lerobot-cli tests' helper, loaded by path
    "lerobot_tests_pusht_checkpoint",
    HERE.parent / "packages" / "lerobot-cli" / "tests" / "pusht_checkpoint.py",
)
helper = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helper)

# rank 1's env raises on its 3rd step (a sitecustomize the launched processes import)
FAULT = """
import os
if os.environ.get("RANK") == "1":
    import gym_pusht.envs.pusht as pusht
    step = pusht.PushTEnv.step
    def failing(self, action):
        self._eval_test_steps = getattr(self, "_eval_test_steps", 0) + 1
        if self._eval_test_steps == 3:
            raise RuntimeError("injected env failure")
        return step(self, action)
    pusht.PushTEnv.step = failing
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A one-step training run of a tiny MLP, its checkpoint and the (one-process) eval of that step."""
    return helper.train_tiny(tmp_path_factory.mktemp("lerobot_eval_ranks"), helper.MLP)


def test_two_ranks_report_the_episodes_one_process_reports(run, tmp_path, launch):
    """The same episodes as ``lerobot-eval`` on one process, and as the training-time eval of the
    checkpoint's step (one process too)."""
    from lerobot_cli.eval import main

    one, two = tmp_path / "one", tmp_path / "two"
    checkpoint = f"--policy.path={run / 'checkpoints' / 'last'}"
    assert main([checkpoint, *helper.EVAL, f"--output_dir={one}"]) == 0
    script = launch.MULTIPROC / "lerobot_eval.py"
    res = launch.torchrun(script, checkpoint, *helper.EVAL, f"--output_dir={two}", timeout_s=180)
    assert not res.timed_out and res.returncode == 0, res.describe()
    assert "2 batches of 2 envs over 2 ranks" in res.stdout
    assert res.stdout.count("eval_info.json: ") == 1  # the main rank reports, once
    want = helper.read_eval_info(one)["per_episode"]
    assert [e["seed"] for e in want] == [1000, 1001, 1002]
    helper.same_episodes(want, helper.training_eval(run)["per_episode"])
    helper.same_episodes(helper.read_eval_info(two)["per_episode"], want)
    for i in range(3):  # each rank wrote its own episodes' videos (episode 2: rank 1's)
        assert helper.video_frames(two / "videos" / "pusht_0" / f"eval_episode_{i}.mp4") == [(384, 384)] * 8


def test_an_env_that_raises_on_one_rank_ends_the_job_in_one_line(run, tmp_path, launch):
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(FAULT)
    path = os.pathsep.join([str(tmp_path / "inject"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = tmp_path / "out"
    script = launch.MULTIPROC / "lerobot_eval.py"
    res = launch.torchrun(
        script,
        f"--policy.path={run / 'checkpoints' / 'last'}",
        *helper.EVAL,
        f"--output_dir={out}",
        timeout_s=180,
        env={"PYTHONPATH": path},
    )
    assert not res.timed_out and res.returncode != 0, res.describe()
    errors = [line for line in res.stderr.splitlines() if "lerobot-eval: error:" in line]
    said = "the simulation eval failed on rank 1: RuntimeError: injected env failure"
    assert errors == [f"lerobot-eval: error: {said}"], res.describe()
    # no traceback of ours: only torchrun's agent's own ChildFailedError (tests/test_bad_inputs.py)
    tracebacks = res.output.split("Traceback (most recent call last):")[1:]
    assert all("torch/distributed/run.py" in tb and "ChildFailedError" in tb for tb in tracebacks), (
        res.describe()
    )
    assert not (out / "eval_info.json").exists()
