"""``lerobot-eval`` (``lerobot_cli.eval.main``, the console script's entry point, in process) on a tiny
PushT ACT checkpoint written by ``lerobot-train``: it writes LeRobot's ``eval_info.json`` and videos where
LeRobot would, reports exactly the episodes the training-time eval of the same step reported, takes
``--rename_map``, ``--policy.use_amp`` and ``--policy.<field>`` as LeRobot does, and refuses bad input in
one line with exit code 2, writing nothing. Rolled out on 2 ranks: tests/test_lerobot_eval_ranks.py.
Needs lerobot-cli[pusht]."""

from __future__ import annotations

import importlib.util
import json
import shutil
import warnings
from pathlib import Path

import pytest

pytest.importorskip("gym_pusht", reason="lerobot-cli[pusht] (uv sync installs it)")

from lerobot_cli.eval import main

_spec = importlib.util.spec_from_file_location(  # the tests are not a package: loaded by path
    "lerobot_cli_tests_pusht_checkpoint", Path(__file__).with_name("pusht_checkpoint.py")
)
helper = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helper)
EVAL = helper.EVAL


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A one-step training run of a tiny ACT with its checkpoint and the eval of that step."""
    return helper.train_tiny(tmp_path_factory.mktemp("lerobot_eval"), helper.ACT)


def test_writes_lerobots_eval_info_under_lerobots_default_directory(run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([f"--policy.path={run / 'checkpoints' / 'last' / 'pretrained_model'}", *EVAL]) == 0
    # LeRobot's defaults: outputs/eval/<date>/<time>_<job_name>, job_name <env type>_<policy type>
    (written,) = tmp_path.glob("outputs/eval/*/*_pusht_act/eval_info.json")
    info = json.loads(written.read_text())
    assert [e["seed"] for e in info["per_episode"]] == [1000, 1001, 1002]  # --seed's default, LeRobot's
    assert [e["episode_ix"] for e in info["per_episode"]] == [0, 1, 2]
    overall = info["overall"]
    for key in ("pc_success", "avg_sum_reward", "avg_max_reward", "eval_s", "eval_ep_s", "n_episodes"):
        assert key in overall, key
    assert overall["n_episodes"] == 3 and list(info["per_group"]) == ["pusht"]
    assert info["per_task"][0]["task_group"] == "pusht"
    # LeRobot's videos: <output_dir>/videos/<task group>_<task id>/eval_episode_<i>.mp4, the frames the env
    # rendered after its reset and each step up to the done one (8 steps: the last is the time limit's)
    videos = [
        str(written.parent.relative_to(tmp_path) / f"videos/pusht_0/eval_episode_{i}.mp4") for i in range(3)
    ]
    assert overall["video_paths"] == info["per_task"][0]["metrics"]["video_paths"] == videos
    for video in videos:
        assert helper.video_frames(tmp_path / video) == [(384, 384)] * 8, video
    out = capsys.readouterr().out
    assert "2 batches of 2 envs over 1 rank, seeds from 1000" in out
    assert f"pc_success={overall['pc_success']:.1f} avg_sum_reward={overall['avg_sum_reward']:.4f}" in out
    assert f"eval_info.json: {written.relative_to(tmp_path)}\n" in out


def test_reports_the_episodes_the_training_time_eval_reported(run, tmp_path):
    """The same checkpoint (named by its step directory this time), the same eval flags: the same
    episodes, action for action; an eval_info.json already there is replaced."""
    out = tmp_path / "eval"
    out.mkdir()
    (out / "eval_info.json").write_text("{}")
    assert main([f"--policy.path={run / 'checkpoints' / '000001'}", *EVAL, f"--output_dir={out}"]) == 0
    got = helper.read_eval_info(out)["per_episode"]
    want = helper.training_eval(run)["per_episode"]
    assert len({e["actions_sha256"] for e in want}) == 3  # the episodes differ
    helper.same_episodes(got, want)


def test_use_amp_rolls_out_under_autocast(run, tmp_path, capsys):
    """``--policy.use_amp=true`` (LeRobot's flag): the rollout runs under ``torch.autocast`` (bfloat16 on
    the CPU), so the actions differ from the float32 ones, and a bfloat16 action still reaches the env.
    One short episode each (bfloat16 convolutions are slow on a CPU)."""
    short = [*EVAL, "--eval.n_episodes=1", "--eval.batch_size=1", "--env.episode_length=2"]
    policy = f"--policy.path={run}/checkpoints/last"
    assert main([policy, *short, f"--output_dir={tmp_path / 'fp32'}"]) == 0
    assert main([policy, *short, "--policy.use_amp=true", f"--output_dir={tmp_path / 'amp'}"]) == 0
    assert "device cpu, amp" in capsys.readouterr().out
    (fp32,) = helper.read_eval_info(tmp_path / "fp32")["per_episode"]
    (amp,) = helper.read_eval_info(tmp_path / "amp")["per_episode"]
    assert amp["seed"] == fp32["seed"] == 1000 and amp["actions_sha256"] != fp32["actions_sha256"]


def test_policy_fields_are_lerobots_overrides_of_the_saved_config(run, tmp_path):
    """``--policy.n_action_steps`` (LeRobot's override of a ``--policy.path`` config): the saved value
    changes nothing, another one changes the actions (ACT re-plans every step instead of every 4)."""
    short = [f"--policy.path={run}/checkpoints/last", *EVAL, "--eval.n_episodes=1", "--eval.batch_size=1"]
    digests = []
    for steps in ("", "4", "1"):
        out = tmp_path / f"steps{steps}"
        flags = [f"--policy.n_action_steps={steps}"] if steps else []
        assert main([*short, *flags, "--env.episode_length=4", f"--output_dir={out}"]) == 0
        digests.append(helper.read_eval_info(out)["per_episode"][0]["actions_sha256"])
    assert digests[0] == digests[1] != digests[2]


def _camera_renamed(directory: Path) -> None:
    """The same policy reading its camera as ``observation.images.top`` (its config, its normalizer's
    features and statistics; ACT takes its cameras by type, whatever their names), its pre-processor saved
    with the ``--rename_map`` of the dataset it was fine-tuned on (``observation.images.front`` ->
    ``observation.images.top``)."""
    from safetensors.torch import load_file, save_file

    old, new = "observation.image", "observation.images.top"

    def renamed(features: dict) -> dict:
        return {new if k == old else k: v for k, v in features.items()}

    config = json.loads((directory / "config.json").read_text())
    config["input_features"] = renamed(config["input_features"])
    (directory / "config.json").write_text(json.dumps(config))
    for pipeline in ("policy_preprocessor.json", "policy_postprocessor.json"):
        data = json.loads((directory / pipeline).read_text())
        for step in data["steps"]:
            if "features" in step["config"]:
                step["config"]["features"] = renamed(step["config"]["features"])
            if step["registry_name"] == "rename_observations_processor":
                step["config"]["rename_map"] = {"observation.images.front": new}
            if "state_file" in step:
                stats = load_file(directory / step["state_file"])
                save_file(
                    {new + k[len(old) :] if k.startswith(old + ".") else k: v for k, v in stats.items()},
                    directory / step["state_file"],
                )
        (directory / pipeline).write_text(json.dumps(data))


def test_rename_map_is_lerobots_override_of_the_saved_one(run, tmp_path, capsys):
    """A policy whose camera is ``observation.images.top``, saved with a map from another name: without
    ``--rename_map`` the env's ``observation.image`` feeds nothing and the eval is refused in one line;
    with the map, it replaces the saved one (LeRobot's override) and the episodes are those of the same
    weights under the env's name."""
    policy = _spoilt(run, tmp_path, _camera_renamed)
    out = tmp_path / "eval"
    with pytest.raises(SystemExit) as exited:
        main([policy, *EVAL, f"--output_dir={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1, err
    assert "the policy reads observation.images.top, which the env does not observe" in err[0]
    assert not out.exists()
    rename = '--rename_map={"observation.image": "observation.images.top"}'
    assert main([policy, *EVAL, rename, f"--output_dir={out}"]) == 0
    helper.same_episodes(helper.read_eval_info(out)["per_episode"], helper.training_eval(run)["per_episode"])


def _spoilt(run: Path, tmp: Path, spoil) -> str:
    """``--policy.path`` of a copy of the checkpoint's ``pretrained_model/``, spoilt by ``spoil(dir)``."""
    copy = tmp / "spoilt"
    shutil.copytree(run / "checkpoints" / "000001" / "pretrained_model", copy)
    spoil(copy)
    return f"--policy.path={copy}"


def _unknown_type(directory: Path) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "type": "nope"}))


def _truncated_weights(directory: Path) -> None:
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])


BAD = {
    "no policy": (lambda run, tmp: [*EVAL], "--policy.path is required"),
    "no config.json": (
        lambda run, tmp: [_spoilt(run, tmp, lambda d: (d / "config.json").unlink()), *EVAL],
        "no config.json there",
    ),
    "unknown policy type": (
        lambda run, tmp: [_spoilt(run, tmp, _unknown_type), *EVAL],
        "config.json: --policy.type: invalid choice 'nope'",
    ),
    "truncated weights": (  # found when the policy is loaded, in the process group
        lambda run, tmp: [_spoilt(run, tmp, _truncated_weights), *EVAL],
        "model.safetensors: not a readable safetensors file",
    ),
    "unknown env": (
        lambda run, tmp: [f"--policy.path={run}/checkpoints/last", "--env.type=nope"],
        "--env.type: invalid choice 'nope' (choose from pusht, aloha)",
    ),
    "unknown flag": (
        lambda run, tmp: [f"--policy.path={run}/checkpoints/last", *EVAL, "--eval.n_episode=2"],
        "unknown flag --eval.n_episode; did you mean --eval.n_episodes?",
    ),
    "unknown policy field": (
        lambda run, tmp: [f"--policy.path={run}/checkpoints/last", *EVAL, "--policy.n_action_step=2"],
        "has no such field; did you mean --policy.n_action_steps?",
    ),
    "policy field its weights do not fit": (  # found when the weights load, in the process group
        lambda run, tmp: [f"--policy.path={run}/checkpoints/last", *EVAL, "--policy.dim_model=64"],
        "model.safetensors does not match the model (ACTPolicy)",
    ),
    "env it does not fit": (
        lambda run, tmp: [
            f"--policy.path={run}/checkpoints/last",
            *EVAL,
            "--env.obs_type=environment_state_agent_pos",
        ],
        "the policy reads observation.image, which the env does not observe",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_writes_nothing(run, tmp_path, capsys, case):
    argv, said = BAD[case]
    out = tmp_path / "eval"
    with pytest.raises(SystemExit) as exited:
        main([*argv(run, tmp_path), f"--output_dir={out}"])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lerobot-eval: error: ") and said in lines[0], captured.err
    assert "Traceback" not in captured.err and not out.exists()


def test_a_config_key_it_does_not_know_is_one_warning(run, tmp_path, capsys):
    """A newer LeRobot's config field: said once, as lerobot-train says it, and the eval runs."""

    def newer(directory: Path) -> None:
        config = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**config, "future_field": 3}))

    out = tmp_path / "eval"
    with warnings.catch_warnings(record=True) as caught:  # none left as a Python warning (said twice)
        warnings.simplefilter("always")
        assert main([_spoilt(run, tmp_path, newer), *EVAL, f"--output_dir={out}"]) == 0
    assert not [w for w in caught if "future_field" in str(w.message)]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lerobot-eval: warning: --policy.path "), err
    assert err[0].endswith("ignoring keys it does not define: future_field")
    assert (out / "eval_info.json").is_file()


def test_help_lists_ours_the_envs_and_the_policys_flags(run, capsys):
    assert main(["--help"]) == 0
    plain = capsys.readouterr().out
    assert "--eval.n_episodes" in plain and "--env.episode_length" not in plain
    assert main(["--help", "--env.type=pusht", f"--policy.path={run}/checkpoints/last"]) == 0
    full = capsys.readouterr().out
    for flag in (
        "--policy.path",
        "--seed",
        "--rename_map",
        "--trust_remote_code",
        "--env.episode_length",
        "--policy.n_action_steps",
    ):
        assert f"  {flag}  " in full, flag
