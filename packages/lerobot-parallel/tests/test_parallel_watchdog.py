"""The launcher watch: a process whose parent dies must exit by itself, and a stopped watch never fires.

The real case is built from three processes, the way torchrun lays them out: a *harness* that
makes itself a child subreaper (so the orphan is reparented to it and its exit status can be
read), a *launcher* it SIGKILLs, and the *rank* the launcher started in a session of its own
(as torchrun does). The whole-job drill with ``lerobot-train`` is in tests/test_drills.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from lerobot_parallel import LAUNCHER_GONE_EXIT_CODE, LaunchEnv, LauncherWatch, launcher_watch_wanted
from lerobot_parallel.watchdog import parent_at_start

INTERVAL_S = 0.2

RANK = """
import os, sys, time
from lerobot_parallel.watchdog import LauncherWatch
watch = LauncherWatch(label="[rank 0/1] ", interval_s={interval}).start()
parent = watch.parent_pid
if sys.argv[1] == "stopped":
    watch.stop()
print("armed", flush=True)
deadline = time.monotonic() + 30
while os.getppid() == parent and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(5 * {interval})  # a stopped watch would have fired by now
sys.exit(0)
"""

LAUNCHER = """
import subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)
print("rank", rank.pid, flush=True)
time.sleep(600)
"""

HARNESS = """
import ctypes, json, os, signal, subprocess, sys, time
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
launcher = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]],
                            stdout=subprocess.PIPE, text=True)
rank_pid, armed = None, False
while rank_pid is None or not armed:  # the launcher and its rank share this pipe
    line = launcher.stdout.readline()
    assert line, "launcher output ended early"
    if line.startswith("rank "):
        rank_pid = int(line.split()[1])
    armed = armed or line.startswith("armed")
os.kill(launcher.pid, signal.SIGKILL)
launcher.wait()
t0 = time.monotonic()
while True:  # the orphaned rank is now our child
    pid, status = os.waitpid(rank_pid, os.WNOHANG)
    if pid:
        break
    if time.monotonic() - t0 > 40:
        os.kill(rank_pid, signal.SIGKILL)
        os.waitpid(rank_pid, 0)
        status = None
        break
    time.sleep(0.05)
code = None if status is None else os.waitstatus_to_exitcode(status)
print(json.dumps({"exit_code": code, "after_s": time.monotonic() - t0}), flush=True)
"""


def _orphan(mode: str) -> tuple[dict, str]:
    rank = RANK.format(interval=INTERVAL_S)
    res = subprocess.run(
        [sys.executable, "-c", HARNESS, LAUNCHER, rank, mode],
        check=False,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1]), res.stderr


needs_subreaper = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux-only"
)


@needs_subreaper
def test_a_rank_whose_launcher_is_killed_exits_with_one_line():
    result, stderr = _orphan("armed")
    assert result["exit_code"] == LAUNCHER_GONE_EXIT_CODE, (result, stderr)
    assert result["after_s"] < 5 * INTERVAL_S + 2, result
    lines = [ln for ln in stderr.splitlines() if "is gone" in ln]
    assert len(lines) == 1 and lines[0].startswith("[rank 0/1] the launcher (pid "), stderr
    assert lines[0].endswith(") is gone; exiting"), stderr


@needs_subreaper
def test_a_stopped_watch_lets_the_orphan_finish():
    result, stderr = _orphan("stopped")
    assert result["exit_code"] == 0, (result, stderr)
    assert "is gone" not in stderr


def test_a_changed_parent_calls_on_gone_once():
    fired: list[str] = []
    done = threading.Event()

    def on_gone(message: str) -> None:
        fired.append(message)
        done.set()

    watch = LauncherWatch(parent_pid=-1, label="[rank 3/4] ", interval_s=0.01, on_gone=on_gone).start()
    assert done.wait(5)
    time.sleep(0.1)
    watch.stop()
    assert fired == ["[rank 3/4] the launcher (pid -1) is gone; exiting"]
    assert not watch.running


def test_stop_ends_the_thread_without_firing():
    fired: list[str] = []
    with LauncherWatch(interval_s=0.01, on_gone=fired.append) as watch:
        assert watch.running and watch.parent_pid == os.getppid() == parent_at_start()
        time.sleep(0.05)
    assert not watch.running and fired == []


@pytest.mark.parametrize(
    ("launch", "environ", "wanted"),
    [
        (
            LaunchEnv(),
            {},
            False,
        ),  # one process, no launcher: its parent is a shell (nohup, a closed terminal)
        (
            LaunchEnv(world_size=1),
            {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
            False,
        ),  # plain accelerate launch
        (LaunchEnv(rank=1, world_size=2), {}, True),
        (LaunchEnv(), {"TORCHELASTIC_RUN_ID": "x"}, True),  # torchrun --nproc-per-node=1
    ],
)
def test_armed_only_under_a_launcher(launch, environ, wanted):
    assert launcher_watch_wanted(launch, environ) is wanted


@pytest.mark.parametrize(("watch_launcher", "armed"), [(None, False), (True, True), (False, False)])
def test_parallel_session_arms_the_watch_and_stops_it_in_teardown(monkeypatch, watch_launcher, armed):
    from lerobot_parallel import teardown

    started: list[LauncherWatch] = []

    def start(launch: LaunchEnv, **_kw) -> LauncherWatch:
        started.append(LauncherWatch(interval_s=0.01, on_gone=pytest.fail).start())
        return started[-1]

    monkeypatch.setattr(teardown, "start_launcher_watch", start)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    with teardown.parallel_session(
        launch=LaunchEnv(), device="cpu", settle_s=0, watch_launcher=watch_launcher
    ):
        assert [w.running for w in started] == ([True] if armed else [])
    assert [w.running for w in started] == ([False] if armed else [])
