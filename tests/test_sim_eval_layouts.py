"""Simulation evaluation inside ``lerobot-train`` on every rank: one process, DDP x2, FSDP2 x2 and HSDP 2x2
roll out the same PushT episodes (gym-pusht, a tiny Diffusion Policy whose weights stay at their seeded
init: lr 0) and report the same per-episode results: successes, the actions of each episode bit for bit
(their SHA-256), rewards to gym-pusht's reproducibility (1e-12; test_env_pusht.py). Five episodes in
batches of 2 make three batches: on 2 ranks rank 0 rolls out batches 0 and 2, rank 1 batch 1 and a filler;
on 4, rank 3 a filler only; every rank votes at every env step. With an EMA the sharded eval acts with the
EMA's weights (as lerobot-eval on the step's pretrained_model_ema/). Faults: an env that raises stops the
job in one line naming the rank, with the step's checkpoint saved; SIGTERM during an eval stops it on
every rank and the run saves; a rank killed during an eval is one line; nothing hangs.
Needs lerobot-cli[pusht]."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("gym_pusht", reason="lerobot-cli[pusht] (uv sync installs it)")

pytestmark = pytest.mark.slow

DEMO_PUSHT = Path(__file__).resolve().parents[1] / "data" / "lerobot" / "demo_pusht"

TINY_DIFFUSION = [
    "--num_workers=0",
    "--policy.type=diffusion",
    "--policy.pretrained_backbone_weights=null",
    "--policy.use_group_norm=true",
    "--policy.down_dims=[16,32]",
    "--policy.horizon=8",
    "--policy.n_action_steps=4",
    "--policy.spatial_softmax_num_keypoints=8",
    "--policy.diffusion_step_embed_dim=16",
    "--policy.num_train_timesteps=10",
    "--policy.scheduler_warmup_steps=0",
    "--policy.optimizer_lr=0",
    "--policy.push_to_hub=false",
]
EVAL = [
    "--env.type=pusht",
    "--env.episode_length=10",
    "--eval.n_episodes=5",
    "--eval.batch_size=2",
    "--env_eval_freq=1",
    "--steps=1",
    "--batch_size=2",
]
# the env of the ranks in {failing} raises on its 3rd step (a sitecustomize the launched processes import)
FAULT = """
import os
if os.environ.get("RANK") in {failing}:
    import gym_pusht.envs.pusht as pusht
    step = pusht.PushTEnv.step
    def failing(self, action):
        self._sim_eval_test_steps = getattr(self, "_sim_eval_test_steps", 0) + 1
        if self._sim_eval_test_steps == 3:
            raise RuntimeError("injected env failure")
        return step(self, action)
    pusht.PushTEnv.step = failing
"""


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def per_episode(out: Path, step: str = "000001") -> list[dict]:
    info = json.loads((out / "eval" / f"step_{step}" / "eval_info.json").read_text())
    return info["per_episode"]


@pytest.fixture(scope="module")
def dataset() -> list[str]:
    """The bundled PushT demo (tools/make_demo_pusht.py): gym-pusht's observation.image and state."""
    return ["--dataset.repo_id=lerobot/demo_pusht", f"--dataset.root={DEMO_PUSHT}"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launch, dataset) -> dict[str, tuple[Path, str]]:
    root = tmp_path_factory.mktemp("sim_eval")
    out = {name: root / name for name in ("single", "ddp", "fsdp", "ema", "hsdp")}
    common = [*dataset, *TINY_DIFFUSION, *EVAL, "--save_checkpoint=false", "--log_freq=1"]
    one = launch.lerobot_train(*common, f"--output_dir={out['single']}")  # async envs (LeRobot's default)
    # learning, with an EMA, under FSDP2: the eval of step 2 must use the EMA's weights
    learning = [f for f in common if f not in ("--policy.optimizer_lr=0", "--steps=1", "--env_eval_freq=1")]
    learning = [f.replace("--save_checkpoint=false", "--save_freq=2") for f in learning]
    two = launch.lerobot_train_runs(
        [*common, "--eval.use_async_envs=false", f"--output_dir={out['ddp']}"],
        [*common, "--parallelism.dp_shard=2", f"--output_dir={out['fsdp']}"],
        [
            *learning,
            "--policy.optimizer_lr=1e-3",
            "--steps=2",
            "--env_eval_freq=2",
            "--ema.enable=true",
            "--parallelism.dp_shard=2",
            "--eval.use_async_envs=false",
            f"--output_dir={out['ema']}",
        ],
        nproc=2,
    )
    # HSDP 2x2: 3 batches over 4 ranks, rank 3 rolls out a filler only
    hsdp = [
        *common,
        "--parallelism.dp_replicate=2",
        "--parallelism.dp_shard=2",
        "--eval.use_async_envs=false",
    ]
    four = launch.lerobot_train(*hsdp, f"--output_dir={out['hsdp']}", nproc=4)
    stdout = {
        "single": one.stdout,
        "ddp": two[0].stdout,
        "fsdp": two[1].stdout,
        "ema": two[2].stdout,
        "hsdp": four.stdout,
    }
    return {name: (out[name], stdout[name]) for name in out}


def test_every_layout_rolls_out_the_same_episodes(runs):
    reference = per_episode(runs["single"][0])
    assert [e["episode_ix"] for e in reference] == [0, 1, 2, 3, 4]
    assert [e["seed"] for e in reference] == [1000, 1001, 1002, 1003, 1004]  # LeRobot's: start_seed=--seed
    assert len({e["actions_sha256"] for e in reference}) == 5  # the episodes differ
    for name in ("ddp", "fsdp", "hsdp"):
        got = per_episode(runs[name][0])
        assert [(e["episode_ix"], e["seed"], e["success"], e["actions_sha256"]) for e in got] == [
            (e["episode_ix"], e["seed"], e["success"], e["actions_sha256"]) for e in reference
        ], name
        for a, b in zip(got, reference, strict=True):
            assert (
                abs(a["sum_reward"] - b["sum_reward"]) <= 1e-12
                and abs(a["max_reward"] - b["max_reward"]) <= 1e-12
            )


def test_the_eval_is_split_over_the_ranks_and_logged_under_lerobots_names(runs):
    assert "3 batches of 2 envs over 1 rank (3 each)" in runs["single"][1]
    assert "3 batches of 2 envs over 2 ranks (2 each)" in runs["fsdp"][1]
    assert "3 batches of 2 envs over 4 ranks (1 each)" in runs["hsdp"][1]
    assert "topology dp_replicate=2 x dp_shard=2 (HSDP)" in runs["hsdp"][1]
    for name, (out, stdout) in runs.items():
        if name == "ema":
            continue
        evals = [r for r in records(out) if "eval/pc_success" in r]
        assert len(evals) == 1 and evals[0]["step"] == 1, name
        info = json.loads((out / "eval" / "step_000001" / "eval_info.json").read_text())
        overall = info["overall"]
        for key in ("pc_success", "avg_sum_reward", "avg_max_reward", "eval_s"):
            assert evals[0][f"eval/{key}"] == overall[key], (name, key)
        assert overall["n_episodes"] == 5 and "sim eval step 1/1 eval/pc_success=" in stdout


def test_the_first_4_episodes_have_videos_on_every_layout(runs):
    """LeRobot's 4 first episodes (lerobot-train's number), each written by the rank that rolled it out: on 2
    ranks rank 0 writes episodes 0 and 1 (batch 0), rank 1 episodes 2 and 3 (batch 1); episode 4 has none."""
    import av

    for name in ("single", "ddp", "fsdp", "hsdp"):
        episodes = [0, 1, 2, 3]
        step = runs[name][0] / "eval" / "step_000001"
        paths = [str(step / "videos" / f"eval_episode_{i}.mp4") for i in episodes]
        info = json.loads((step / "eval_info.json").read_text())
        assert info["overall"]["video_paths"] == paths, name
        assert sorted(p.name for p in (step / "videos").iterdir()) == sorted(Path(p).name for p in paths)
        with av.open(
            paths[0]
        ) as video:  # the reset's frame and each step's until the done one (LeRobot's cut)
            stream = video.streams.video[0]
            assert (stream.frames, stream.width, stream.height) == (10, 384, 384), name


def test_the_eval_uses_the_ema_weights_under_fsdp2(runs, tmp_path, launch):
    """--ema.enable (use_for_eval by default): the sharded eval of step 2 acted as lerobot-eval, on one
    process, acts with that step's pretrained_model_ema/, and not as it acts with pretrained_model/. (In a
    launched process, as the training ran: one intra-op thread each, so the reductions' order is the same.)"""
    out, stdout = runs["ema"]
    assert "live weights" not in stdout and "EMA weights" in stdout
    want = [(e["episode_ix"], e["actions_sha256"]) for e in per_episode(out, "000002")]
    got = {}
    flags = [f for f in EVAL if f.startswith(("--env.", "--eval."))] + ["--eval.use_async_envs=false"]
    for name in ("pretrained_model_ema", "pretrained_model"):
        path, target = out / "checkpoints" / "000002" / name, tmp_path / name
        cmd = [
            launch.PYTHON,
            "-m",
            "lerobot_cli.eval",
            f"--policy.path={path}",
            *flags,
            f"--output_dir={target}",
        ]
        res = launch.run_command(cmd, timeout_s=120)
        assert res.returncode == 0 and not res.timed_out, res.describe()
        info = json.loads((target / "eval_info.json").read_text())
        got[name] = [(e["episode_ix"], e["actions_sha256"]) for e in info["per_episode"]]
    assert got["pretrained_model_ema"] == want
    assert all(a != b for a, b in zip(got["pretrained_model"], want, strict=True))


@pytest.mark.parametrize(("failing", "named"), [(("1",), 1), (("0", "1"), 0)], ids=["rank-1", "every-rank"])
def test_an_env_that_raises_stops_the_job_in_one_line(tmp_path, launch, dataset, failing, named):
    """Under FSDP2 (the vote is the same on every layout; lerobot-eval's torchrun test fails an unsharded
    rank the same way). On one rank, that rank says why; on every rank alike (a policy's bug would fail
    so), the lowest one says it, once."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(FAULT.replace("{failing}", repr(set(failing))))
    out = tmp_path / "out"
    flags = [*dataset, *TINY_DIFFUSION, *EVAL, "--eval.use_async_envs=false", "--parallelism.dp_shard=2"]
    flags.append(f"--output_dir={out}")
    path = os.pathsep.join([str(tmp_path / "inject"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    res = launch.torchrun(launch.LEROBOT_TRAIN, *flags, nproc=2, timeout_s=240, env={"PYTHONPATH": path})
    assert not res.timed_out and res.returncode != 0, res.describe()
    errors = [line for line in res.stderr.splitlines() if "lerobot-train: error:" in line]
    said = f"the simulation eval at step 1 failed on rank {named}: RuntimeError: injected env failure"
    assert errors == [f"lerobot-train: error: {said}"], res.describe()
    # no traceback of ours: only torchrun's agent's own ChildFailedError (tests/test_bad_inputs.py)
    tracebacks = res.output.split("Traceback (most recent call last):")[1:]
    assert all("torch/distributed/run.py" in tb and "ChildFailedError" in tb for tb in tracebacks), (
        res.describe()
    )
    assert (
        out / "checkpoints" / "000001" / "pretrained_model" / "model.safetensors"
    ).is_file()  # saved first
    assert not (out / "eval").exists()


def _drill_job():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "sim_eval_drill_job", Path(__file__).parent / "drill_job.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sigterm_during_an_eval_stops_it_on_every_rank_and_the_run_saves(tmp_path, launch, dataset):
    """SIGTERM to torchrun (forwarded to each rank) while the ranks roll out a long eval (200 episodes of
    300 steps, about a minute here): the eval is abandoned at the next env step on both ranks, the run stops
    at the following step as during training and saves it; nothing is left running."""
    import signal
    import time

    out = tmp_path / "run"
    port = launch.free_port()
    cmd = [
        launch.PYTHON, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={port}",
        "--monitor-interval=0.2", launch.LEROBOT_TRAIN, *dataset, "--num_workers=0", "--policy.type=mlp",
        "--policy.hidden_dim=16", "--policy.push_to_hub=false", "--env.type=pusht", "--eval.n_episodes=200",
        "--eval.batch_size=2", "--eval.use_async_envs=false", "--env_eval_freq=1", "--steps=100",
        "--batch_size=2", "--save_freq=1000", "--log_freq=1", f"--output_dir={out}",
    ]  # fmt: skip
    drill_job = _drill_job()
    job = drill_job.DrillJob(cmd, tmp_path, launch.clean_env(), port, launch)
    try:
        job.wait_for(lambda: "Sim eval:" in job.stdout_path.read_text(), 180, "the sim eval banner")
        job.wait_for(lambda: drill_job.metrics_lines(out) >= 1, 60, "the first step")
        time.sleep(1.0)  # inside the eval of step 1 (its first batches take seconds)
        signalled = time.monotonic()
        os.kill(job.proc.pid, signal.SIGTERM)
        ended = job.wait_end(60, dump_after_s=30)  # still running by then: hung, its stacks shown
        stdout, output = job.stdout_path.read_text(), job.output()
        left = job.alive_workers()
    finally:
        job.close()
    assert ended is not None and not left, output
    assert time.monotonic() - signalled < 45, output  # far less than the eval's minute
    assert "sim eval step 1 abandoned: SIGTERM during the eval" in stdout, output
    stops = re.findall(r"interrupted by SIGTERM at step (\d+)", stdout)
    assert len(stops) == 1, output
    step = json.loads((out / "checkpoints" / "last" / "training_state" / "training_step.json").read_text())
    assert step["step"] == int(stops[0]) and not (out / "eval" / "step_000001" / "eval_info.json").exists()
    assert "error:" not in output, output


# rank 1 SIGKILLs itself (the OOM killer's way) at its {n}th call of {target}: in an env step (rank 0 is
# then in a vote, or about to be) or in the policy's forward (rank 0 is then in the forward's all-gather,
# where gloo says "Connection reset by peer" as a plain RuntimeError)
KILL = """
import os
if os.environ.get("RANK") == "1":
    import signal
    from {module} import {cls} as patched
    original = patched.{method}
    def killing(self, *args, **kwargs):
        patched._sim_eval_test_calls = getattr(patched, "_sim_eval_test_calls", 0) + 1
        if patched._sim_eval_test_calls == {n}:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, *args, **kwargs)
    patched.{method} = killing
"""
KILLED_IN = {
    "env-step": {"module": "gym_pusht.envs.pusht", "cls": "PushTEnv", "method": "step", "n": 5},
    "forward": {
        "module": "lerobot_cli.policies.mlp.modeling",
        "cls": "MLPPolicy",
        "method": "predict_action_chunk",
        "n": 3,
    },
}


@pytest.mark.parametrize("where", list(KILLED_IN))
def test_a_rank_killed_during_an_eval_stops_the_job_in_one_line(tmp_path, launch, dataset, where):
    """Rank 1 killed while both ranks roll out an eval under FSDP2: rank 0 stops at once with one line
    saying a rank was lost, whether its peer died before a vote or inside a sharded forward (where the
    failure vote that follows cannot complete either); torchrun ends the job, nothing hangs."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(KILL.format(**KILLED_IN[where]))
    path = os.pathsep.join([str(tmp_path / "inject"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    flags = [
        *dataset, "--num_workers=0", "--policy.type=mlp", "--policy.hidden_dim=16",
        "--policy.push_to_hub=false", "--env.type=pusht", "--eval.n_episodes=4", "--eval.batch_size=2",
        "--eval.use_async_envs=false", "--env_eval_freq=1", "--steps=1", "--batch_size=2",
        "--parallelism.dp_shard=2", f"--output_dir={tmp_path / 'run'}",
    ]  # fmt: skip
    res = launch.torchrun(launch.LEROBOT_TRAIN, *flags, nproc=2, timeout_s=120, env={"PYTHONPATH": path})
    assert not res.timed_out and res.returncode != 0, res.describe()
    assert "exitcode  : -9" in res.output, res.describe()  # rank 1 was killed, as injected
    errors = [line for line in res.stderr.splitlines() if "lerobot-train: error:" in line]
    assert len(errors) == 1, res.describe()
    said = "the simulation eval at step 1 stopped on rank 0: another rank was lost"
    assert said in errors[0], res.describe()
    tracebacks = res.output.split("Traceback (most recent call last):")[1:]
    assert all("torch/distributed/run.py" in tb and "ChildFailedError" in tb for tb in tracebacks), (
        res.describe()
    )
