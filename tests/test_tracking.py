"""The trackers: --trackio.enable and --wandb.enable log what metrics.jsonl says, from the main rank,
reduced over ranks; wandb through the real library (offline runs read back with wandb's own reader), its
run id saved for the resume, checkpoints as artifacts; a clear line without the extra or a login; a
tracker failing mid-run is dropped with one warning."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "lerobot" / "demo_reach"
SCRIPT = shutil.which("lerobot-train") or str(Path(sys.executable).parent / "lerobot-train")
ARGS = [
    "--dataset.repo_id=lerobot/demo_reach",
    f"--dataset.root={DEMO}",
    "--num_workers=0",
    "--policy.type=mlp",
    "--steps=6",
    "--log_freq=2",
    "--save_checkpoint=false",
    "--trackio.enable=true",
]


@pytest.mark.slow
def test_trackio_logs_what_metrics_jsonl_says_from_the_main_rank(launch, tmp_path):
    out, store = tmp_path / "run", tmp_path / "trackio"
    res = launch.torchrun(
        SCRIPT,
        *ARGS,
        "--trackio.project=demo",
        f"--output_dir={out}",
        nproc=2,
        env={"TRACKIO_DIR": str(store)},
        timeout_s=180,
    )
    assert res.returncode == 0, res.describe()
    code = (
        "import json; from trackio.sqlite_storage import SQLiteStorage as S; runs = S.get_runs('demo');"
        "print(json.dumps({'runs': runs, 'logs': S.get_logs('demo', runs[0]),"
        " 'config': S.get_run_config('demo', runs[0])}, default=str))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={"TRACKIO_DIR": str(store), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["runs"] == ["lerobot_demo_reach_mlp"]  # one run: only the main rank logged
    jsonl = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in data["logs"]] == [r["step"] for r in jsonl] == [2, 4, 6]
    assert [r["loss"] for r in data["logs"]] == [r["loss"] for r in jsonl]
    # peak memory per rank, max over the ranks (CPU: peak RSS), in both and growing monotonically
    peaks = [r["peak_rss_gb"] for r in jsonl]
    assert [r["peak_rss_gb"] for r in data["logs"]] == peaks and 0 < peaks[0] <= peaks[-1] < 64
    assert "gpu_mem_gb" not in jsonl[0]
    assert data["config"]["parallelism"] == {"dp_replicate": 1, "dp_shard": 1}


def test_trackio_missing_is_a_usage_error(tmp_path):
    argv = [*ARGS, f"--output_dir={tmp_path / 'run'}"]
    code = (
        "import sys; sys.modules['trackio'] = None\n"  # as if the extra were not installed
        "from lerobot_cli.train import main\n"
        f"main({argv!r})\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("lerobot-train: error: --trackio.enable=true needs lerobot-cli[trackio]")
    assert "lerobot-cli[trackio]" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_finish_ends_the_line_trackio_leaves_open(monkeypatch, capsys):
    """trackio may print "… (please wait...)" without a newline on finish:
    the next line must not be glued to it."""
    import types

    from lerobot_cli.trackers.trackio import TrackioTracker

    fake = types.SimpleNamespace(
        init=lambda **_kw: object(),
        log=lambda *_a, **_kw: None,
        finish=lambda: print("* Run finished. Uploading logs (please wait...)", end=""),
    )
    monkeypatch.setitem(sys.modules, "trackio", fake)
    tracker = TrackioTracker("p", "r", {})
    tracker.finish()
    print("checkpoint: next line")
    assert (
        capsys.readouterr().out == "* Run finished. Uploading logs (please wait...)\ncheckpoint: next line\n"
    )
    fake.finish = lambda: print("* done")  # a line already ended gets no blank line after it
    tracker.finish()
    assert capsys.readouterr().out == "* done\n"


def wandb_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """wandb's own directories under the test's (nothing under ~); no key (offline needs none)."""
    env = {
        f"WANDB_{name}_DIR": str(tmp_path / "wandb-home" / name.lower())
        for name in ("CACHE", "CONFIG", "DATA")
    }
    assert "WANDB_API_KEY" not in os.environ and "WANDB_MODE" not in os.environ
    return {**env, **extra}


def read_offline_runs(output_dir: Path) -> list[dict]:
    """Every offline run under ``output_dir/wandb``, oldest first, as wandb's reader (``wandb sync``'s)
    sees its ``.wandb`` file: the run record, the history rows, the artifacts."""
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal import datastore

    runs = []
    for path in sorted(output_dir.glob("wandb/offline-run-*/run-*.wandb")):
        store = datastore.DataStore()
        store.open_for_scan(str(path))
        run: dict = {"history": [], "artifacts": []}
        while (data := store.scan_data()) is not None:
            record = pb.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["id"], run["project"] = record.run.run_id, record.run.project
                run["name"], run["tags"] = record.run.display_name, list(record.run.tags)
                run["config"] = {u.key: json.loads(u.value_json) for u in record.run.config.update}
            elif kind == "history":
                run["history"].append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                )
            elif kind == "artifact":
                files = [e.path for e in record.artifact.manifest.contents]
                run["artifacts"].append((record.artifact.name, record.artifact.type, files))
        runs.append(run)
    return runs


@pytest.mark.slow
def test_wandb_offline_run_holds_what_metrics_jsonl_says_and_a_resume_continues_it(launch, tmp_path):
    out = tmp_path / "run"
    flags = [a for a in ARGS if not a.startswith(("--trackio", "--save_checkpoint", "--steps"))] + [
        f"--output_dir={out}",
        "--wandb.enable=true",
        "--wandb.mode=offline",
        "--wandb.project=demo",
        "--wandb.notes=a note",
        "--dataset.eval_split=0.5",
        "--eval_steps=3",
        "--save_freq=3",
    ]
    env = wandb_env(tmp_path)
    first = launch.torchrun(SCRIPT, *flags, "--steps=6", nproc=2, env=env, timeout_s=240)
    assert first.returncode == 0, first.describe()
    saved = json.loads((out / "checkpoints" / "last" / "pretrained_model" / "train_config.json").read_text())
    cfg = out / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
    second = launch.torchrun(
        SCRIPT, "--resume=true", f"--config_path={cfg}", "--steps=9", nproc=2, env=env, timeout_s=240
    )
    assert second.returncode == 0, second.describe()
    assert "wandb" not in first.stderr + second.stderr  # nothing of wandb's on the console

    frames = int(
        re.search(r"^Dataset: lerobot/demo_reach: (\d+) frames", first.stdout, re.MULTILINE).group(1)
    )
    runs = read_offline_runs(out)
    assert len(runs) == 2  # the first run and its resume, one folder each, on the main rank only
    run_id = saved["wandb"]["run_id"]
    assert [r["id"] for r in runs] == [run_id, run_id]  # the resume continues the same run
    assert runs[0]["project"] == "demo" and runs[0]["name"] == "lerobot_demo_reach_mlp"
    assert runs[0]["tags"] == ["policy:mlp", "seed:1000", "dataset:lerobot/demo_reach"]
    assert runs[0]["config"]["wandb"]["notes"] == "a note"
    assert runs[0]["config"]["parallelism"] == {"dp_replicate": 1, "dp_shard": 1}

    jsonl = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    history = [row for run in runs for row in run["history"]]
    train = [r for r in jsonl if "loss" in r]
    logged = [h for h in history if "train/loss" in h]
    assert [h["_step"] for h in logged] == [r["step"] for r in train] == [2, 4, 6, 8]
    for row, rec in zip(logged, train, strict=True):  # LeRobot's names, the file's values
        assert row["train/loss"] == rec["loss"] and row["train/grad_norm"] == rec["grad_norm"]
        assert row["train/lr"] == rec["lr"] and row["train/dataloading_s"] == rec["data_s"]
        assert row["train/update_s"] == rec["update_s"] and row["train/samples_per_s"] == rec["samples_per_s"]
        samples = rec["step"] * 8 * 2  # batch 8 on each of 2 ranks
        assert row["train/steps"] == rec["step"] and row["train/samples"] == samples
        assert row["train/epochs"] == pytest.approx(samples / frames)  # of the training episodes
    evals = [r for r in jsonl if "eval/loss" in r]
    eval_rows = [h for h in history if "eval/eval_loss" in h]
    assert [h["_step"] for h in eval_rows] == [r["step"] for r in evals] == [3, 6, 9]
    assert [h["eval/eval_loss"] for h in eval_rows] == [r["eval/loss"] for r in evals]
    # each committed checkpoint's weights as a model artifact named as LeRobot names them
    artifacts = [a for run in runs for a in run["artifacts"]]
    assert artifacts == [
        (f"policy_mlp-seed_1000-dataset_lerobot_demo_reach-{step:06d}", "model", ["model.safetensors"])
        for step in (3, 6, 9)
    ]


@pytest.mark.slow
def test_wandb_gets_the_sim_eval_under_lerobots_names_and_its_first_video(launch, tmp_path):
    """--env.type: the eval's LeRobot metrics (eval/pc_success, eval/avg_sum_reward, ...) with the values
    metrics.jsonl holds, and the first episode's video as eval/video (LeRobot's log_video), at its step."""
    pytest.importorskip("gym_pusht", reason="lerobot-cli[pusht] (uv sync installs it)")
    out = tmp_path / "run"
    demo_pusht = DEMO.parent / "demo_pusht"
    flags = [
        "--dataset.repo_id=lerobot/demo_pusht",
        f"--dataset.root={demo_pusht}",
        "--num_workers=0",
        "--policy.type=mlp",
        "--steps=1",
        "--save_checkpoint=false",
        "--env.type=pusht",
        "--env.episode_length=5",
        "--eval.n_episodes=2",
        "--eval.batch_size=2",
        "--eval.use_async_envs=false",
        "--env_eval_freq=1",
        "--wandb.enable=true",
        "--wandb.mode=offline",
        f"--output_dir={out}",
    ]
    res = launch.run_command([SCRIPT, *flags], timeout_s=240, env=wandb_env(tmp_path))
    assert res.returncode == 0, res.describe()
    (run,) = read_offline_runs(out)
    (record,) = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "eval/" in line
    ]
    (row,) = [h for h in run["history"] if "eval/pc_success" in h]
    assert row["_step"] == record["step"] == 1
    for name in ("pc_success", "avg_sum_reward", "avg_max_reward", "eval_s"):
        assert row[f"eval/{name}"] == record[f"eval/{name}"], name
    # the video in the same row (wandb's reader flattens it: eval/video/_type, eval/video/path, ...)
    assert row["eval/video/_type"] == "video-file" and row["eval/video/path"].endswith(".mp4"), row


def test_wandb_that_cannot_start_is_one_line_and_leaves_no_run(tmp_path):
    """Online without a login: the job stops before step 1 with one line saying what to do."""
    argv = [a for a in ARGS if not a.startswith("--trackio")] + [
        f"--output_dir={tmp_path / 'run'}",
        "--wandb.enable=true",
    ]
    code = f"from lerobot_cli.train import main\nmain({argv!r})\n"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **wandb_env(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("lerobot-train: error: --wandb.enable=true: wandb could not start the run")
    assert "--wandb.mode=offline" in lines[0] and "wandb login" in lines[0]
    assert "step 1/" not in proc.stdout and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_wandb_missing_is_a_usage_error(tmp_path):
    argv = [a for a in ARGS if not a.startswith("--trackio")] + [
        f"--output_dir={tmp_path / 'run'}",
        "--wandb.enable=true",
    ]
    code = f"import sys; sys.modules['wandb'] = None\nfrom lerobot_cli.train import main\nmain({argv!r})\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("lerobot-train: error: --wandb.enable=true needs lerobot-cli[wandb]")
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


def test_wandb_flags_are_checked_in_one_line():
    for flags, expected in (
        (["--wandb.mode=online_please"], "--wandb.mode: invalid choice 'online_please'"),
        (["--wandb.enable=true", "--wandb.project=null"], "--wandb.project must name a project"),
    ):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "lerobot_cli.train",
                *[a for a in ARGS if not a.startswith("--trackio")],
                "--dry_run=true",
                *flags,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        assert expected in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_tracker_failing_mid_run_is_dropped_with_one_warning(tmp_path, caplog):
    """A dashboard never stops training: the failing tracker is said once and dropped, the others go on."""
    from lerobot_cli.trackers import Record, Trackers
    from lerobot_cli.trackers.jsonl import MetricsFile

    class Flaky:
        name = "flaky"

        def __init__(self) -> None:
            self.logged, self.finished = [], []

        def log(self, record):
            if record.step == 2:
                raise ConnectionError("the network went away")
            self.logged.append(record.step)

        def checkpoint(self, directory):
            pass

        def saved_config(self):
            return {}

        def finish(self, failed):
            self.finished.append(failed)

    flaky = Flaky()
    trackers = Trackers([MetricsFile(tmp_path), flaky])
    with caplog.at_level("WARNING"):
        for step in (1, 2, 3):
            trackers.log(Record(step, 0.0, "train", {"loss": 1.0 / step}))
        trackers.finish()
    assert flaky.logged == [1] and flaky.finished == [True]  # dropped at step 2, its run ended as failed
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        (
            "flaky failed to log step 2 (ConnectionError: the network went away); it is off for the rest "
            "of the run (metrics.jsonl has every record)"
        )
    ]
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
