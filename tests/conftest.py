"""Shared fixtures of the cross-package tests: the real-process launcher (see launch.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
# Shared flag lists (fastwam_flags.py) import by name; test modules themselves stay in importlib mode.
if str(_HERE) not in sys.path:
    sys.path.append(str(_HERE))


def _load_launch():
    # --import-mode=importlib does not put tests/ on sys.path; load the helper by path, once.
    if "lerobot_tests_launch" not in sys.modules:
        spec = importlib.util.spec_from_file_location("lerobot_tests_launch", _HERE / "launch.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["lerobot_tests_launch"]


@pytest.fixture(scope="session")
def launch():
    """The launch helper module: ``launch.torchrun(...)``, ``launch.accelerate_launch(...)``,
    ``launch.MULTIPROC``."""
    return _load_launch()
