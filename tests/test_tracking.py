"""--trackio.enable: the main rank logs the reduced metrics and the config locally;
a clear error without trackio."""

from __future__ import annotations

import json
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
    assert proc.stderr.startswith("lerobot-train: error: --trackio.enable=true needs the trackio package")
    assert "lerobot-cli[trackio]" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_finish_ends_the_line_trackio_leaves_open(monkeypatch, capsys):
    """trackio may print "… (please wait...)" without a newline on finish:
    the next line must not be glued to it."""
    import types

    from lerobot_cli.tracking import TrackioTracker

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
