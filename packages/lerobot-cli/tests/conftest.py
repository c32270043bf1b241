"""Shared fixtures of lerobot-cli's tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def load_helper(name: str):
    """A helper module of this directory, loaded by path once (--import-mode=importlib does not put
    tests/ on sys.path)."""
    module_name = f"lerobot_cli_tests_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, _HERE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    """A directory holding the tiny byte-level tokenizer of vla_tokenizer.py (built once per session);
    pass it as ``tokenizer_name``."""
    return load_helper("vla_tokenizer").save_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tokenizer"))
