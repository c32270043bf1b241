"""Every row of ``tests/data/bad_inputs.json`` must end with one clear error and touch nothing.

The table is data so that a bug report becomes a row, not a test function. Each row is a real
console-script run in its own process (torchrun for ``nproc`` rows): a bad input can only be judged
by what a user sees (exit code, first stderr line, no traceback) and by what is left on disk.

Rows that get past parsing pay for importing torch (~5-10 s each), so the selected rows are
started two at a time, in test order, ahead of the test that checks each one (see ``RowRunner``).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TABLE = json.loads((HERE / "data" / "bad_inputs.json").read_text())
BIN = Path(sys.executable).parent
TIMEOUT_S = {1: 150, 2: 240}  # by process count; a parse error answers in ~1 s, a dataset error in ~10 s
PARALLEL_ROWS = 2  # the machine has 2 cores; most of a heavy row is one core importing torch


def _load_setup():
    # --import-mode=importlib keeps tests/ off sys.path: load the helper by path (as conftest does).
    spec = importlib.util.spec_from_file_location(
        "lerobot_tests_bad_input_setup", HERE / "bad_input_setup.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


setup_lib = _load_setup()


def _param(case: dict) -> pytest.param:
    marks = []
    if case.get("xfail"):
        marks.append(pytest.mark.xfail(strict=True, reason=case["xfail"]))
    if case.get("nproc", 1) > 1:
        marks.append(pytest.mark.slow)
    return pytest.param(case, id=f"{case['category']}-{case['id']}", marks=marks)


def _script(program: str) -> str | None:
    """The console script's path; None when its package is not installed (its rows are skipped)."""
    return shutil.which(program) or (str(BIN / program) if (BIN / program).exists() else None)


class RowRunner:
    """Runs rows (setup, snapshot, launch) on a small thread pool, in the order the tests will ask.

    Each result waits in a future until its test checks it, so the table costs about half its
    sequential time on 2 cores. The checkpoint a row may copy is made once, under a lock.
    """

    def __init__(self, root: Path, launch) -> None:
        self.root, self.launch = root, launch
        self.pool = ThreadPoolExecutor(max_workers=PARALLEL_ROWS)
        self.futures: dict[str, object] = {}
        self._lock = threading.Lock()
        self._run_dir: Path | None = None

    def checkpoint_run(self) -> Path:
        """A real 2-step MLP run with its checkpoint, made once and only if a row copies it."""
        with self._lock:
            if self._run_dir is None:
                out = self.root / "checkpoint_source"
                args = setup_lib.fill(
                    [*TABLE["bases"]["train"], "--steps=2"],
                    {"demo": setup_lib.DEMO, "out": out, "setup": out},
                )
                res = self.launch.run_command([_script("lerobot-train"), *args], timeout_s=TIMEOUT_S[1])
                assert res.returncode == 0 and (out / "checkpoints" / "last").is_dir(), res.describe()
                self._run_dir = out
            return self._run_dir

    def submit(self, cases: list[dict]) -> None:
        for case in cases:
            if case["id"] not in self.futures:
                self.futures[case["id"]] = self.pool.submit(self._run, case)

    def result(self, case: dict):
        self.submit([case])
        return self.futures[case["id"]].result()

    def _run(self, case: dict):
        script = _script(case.get("program", "lerobot-train"))
        row = self.root / case["id"]
        places = {"setup": row / "setup", "out": row / "out", "demo": setup_lib.DEMO}
        row.mkdir()
        if "setup" in case:
            setup_lib.build_setup(case["setup"], places["setup"], self.checkpoint_run, places)
        args = setup_lib.fill([*TABLE["bases"].get(case.get("base"), []), *case.get("args", [])], places)
        env = setup_lib.fill(case.get("env", {}), places)
        before = {str(p): setup_lib.snapshot(p) for p in (places["setup"], setup_lib.DEMO)}
        nproc = case.get("nproc", 1)
        if nproc == 1:
            res = self.launch.run_command([script, *args], timeout_s=TIMEOUT_S[1], env=env)
        else:
            res = self.launch.torchrun(script, *args, nproc=nproc, timeout_s=TIMEOUT_S[2], env=env)
        return places, before, res


@pytest.fixture(scope="session")
def rows(request, tmp_path_factory, launch):
    """The row runner, already started on every selected row of the table."""
    runner = RowRunner(tmp_path_factory.mktemp("bad_inputs"), launch)
    selected = [
        item.callspec.params["case"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_bad_input_gives_one_clear_error_and_changes_nothing"
    ]
    runner.submit([c for c in selected if _script(c.get("program", "lerobot-train"))])
    yield runner
    runner.pool.shutdown(wait=True, cancel_futures=True)


def without_launcher_traceback(text: str) -> str:
    """``text`` minus torchrun's own ChildFailedError traceback, the one traceback we do not own.

    torchrun's agent ends every failed job by raising ChildFailedError; the ranks' output, which
    this table judges, is everything else.
    """
    header = "Traceback (most recent call last):"
    first, *tracebacks = text.split(header)
    return first + "".join(
        header + tb
        for tb in tracebacks
        if not ("torch/distributed/run.py" in tb and "ChildFailedError" in tb)
    )


def _expected_exit(res, nproc: int) -> None:
    if nproc == 1:
        assert res.returncode == 2, res.describe()
        return
    # torchrun exits 1 for any failed worker; the worker's own code is in its failure summary.
    assert res.returncode != 0, res.describe()
    root = re.search(r"Root Cause.*?exitcode\s*:\s*(-?\d+)", res.stderr, re.DOTALL)
    assert root and root.group(1) == "2", res.describe()


@pytest.mark.parametrize("case", [_param(c) for c in TABLE["cases"]])
def test_bad_input_gives_one_clear_error_and_changes_nothing(case, rows):
    program = case.get("program", "lerobot-train")
    if _script(program) is None:
        pytest.skip(f"console script {program} is not installed")
    places, before, res = rows.result(case)

    assert not res.timed_out, res.describe()
    _expected_exit(res, case.get("nproc", 1))
    first = res.stderr.strip().splitlines()[0] if res.stderr.strip() else ""
    assert first.startswith(f"{program}: error: "), res.describe()
    assert case["fragment"] in first, f"{case['fragment']!r} not in {first!r}"
    for fragment in case.get("also", []):
        assert fragment in res.stderr, f"{fragment!r} not in stderr:\n{res.stderr}"
    if case.get("once"):  # an error every rank raises is printed by one of them
        assert res.stderr.count(f"{program}: error: ") == 1, res.describe()
    assert "Traceback" not in without_launcher_traceback(res.output), res.describe()
    after = {path: setup_lib.snapshot(Path(path)) for path in before}
    assert after == before, "a refused run modified files it was given"
    assert not places["out"].exists(), f"a refused run created {places['out']}"


def test_table_is_large_distinct_and_well_formed():
    """The issue asks for ≥ 25 distinct bad inputs; ids are test names, so they must be unique."""
    cases = TABLE["cases"]
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids)) and len(cases) >= 30
    allowed = {
        "id",
        "category",
        "program",
        "base",
        "args",
        "env",
        "nproc",
        "setup",
        "fragment",
        "also",
        "once",
        "xfail",
        "note",
    }
    for c in cases:
        assert set(c) <= allowed and c["fragment"], c
        assert c.get("base") is None or c["base"] in TABLE["bases"], c
