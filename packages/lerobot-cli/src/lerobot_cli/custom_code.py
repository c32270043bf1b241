"""Directories that ask transformers to run their own Python code are refused, never run.

A tokenizer directory whose ``tokenizer_config.json`` or ``config.json`` has an ``auto_map`` names
classes in ``.py`` files beside it; transformers imports (runs) those files when asked to trust them,
and asks "Do you wish to run the custom code? [y/N]" on a terminal when it is not told. A training run
must never execute code that came with its inputs, nor stop on a prompt on one rank of a job: every
loader is called with ``trust_remote_code=False``, and a local directory with an ``auto_map`` is refused
here, by reading two JSON files, before torch or transformers is imported. Torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path

from lerobot_cli.policies.location import own_file

# The files transformers reads an ``auto_map`` from when it loads a tokenizer (or its config).
AUTO_MAP_FILES = ("tokenizer_config.json", "config.json")
TOKENIZER_STEP = "tokenizer_processor"  # LeRobot's registry name of the step that loads a tokenizer
_FIX = (
    "use a tokenizer directory without custom code (one that a standard transformers tokenizer's "
    "save_pretrained wrote: tokenizer.json and tokenizer_config.json, no auto_map)"
)


class CustomCodeError(ValueError):
    """A tokenizer (directory or Hub repo) whose loading would run Python code that came with it."""

    def __init__(self, name: str, detail: str) -> None:
        self.name, self.detail = name, detail
        super().__init__(self.naming("tokenizer_name"))

    def naming(self, setting: str) -> str:
        """The sentence, with the setting that named the tokenizer spelled as its reader knows it."""
        return (
            f"{setting}={self.name}: {self.detail}, which transformers would have to run; this trainer never "
            f"runs code that comes with a tokenizer (trust_remote_code=False): {_FIX}"
        )


def _auto_map(file: Path) -> dict | None:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # unreadable: transformers' own error (one sentence, via the tokenizer loader) says so
    value = data.get("auto_map") if isinstance(data, dict) else None
    return value if value else None


def _modules(auto_map: dict) -> list[str]:
    """The ``.py`` files an ``auto_map`` points at (``"tok.MyTokenizer"`` → ``tok.py``)."""
    refs: list[str] = []
    for value in auto_map.values():
        refs += value if isinstance(value, list | tuple) else [value]
    return sorted(
        {f"{ref.split('--')[-1].rsplit('.', 1)[0]}.py" for ref in refs if isinstance(ref, str) and "." in ref}
    )


def refuse_custom_code(name: str | None) -> None:
    """Raise :class:`CustomCodeError` when ``name`` is a local directory that names custom code."""
    if not name:
        return
    directory = Path(name).expanduser()
    if not directory.is_dir():
        return  # a Hub id: loaded with trust_remote_code=False (transformers refuses custom code itself)
    for file_name in AUTO_MAP_FILES:
        auto_map = _auto_map(directory / file_name)
        if auto_map is not None:
            modules = _modules(auto_map)
            code = f" ({', '.join(modules)})" if modules else ""
            raise CustomCodeError(
                name, f"its {file_name} has an auto_map that names custom Python code{code}"
            )


def is_custom_code_refusal(exc: BaseException) -> bool:
    """Whether transformers refused to load because the repository needs its own code (it was told not
    to trust it): its ValueError, recognised by its words."""
    text = str(exc)
    return isinstance(exc, ValueError) and "custom code" in text and "trust_remote_code" in text


def tokenizers_named_in(pipeline_file: Path) -> list[str]:
    """The ``tokenizer_name`` of every tokenizer step of a processor pipeline file
    (``policy_preprocessor.json``) that a ``--policy.path`` brings; [] when the file is absent or unreadable
    (its loader says why)."""
    try:  # a symlink out of its directory is not read (its loader refuses it in one line)
        file = own_file(Path(pipeline_file).parent, Path(pipeline_file).name)
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return []
    steps = data.get("steps") if isinstance(data, dict) else None
    names = []
    for step in steps if isinstance(steps, list) else []:
        config = (
            step.get("config")
            if isinstance(step, dict) and step.get("registry_name") == TOKENIZER_STEP
            else None
        )
        if isinstance(config, dict) and isinstance(config.get("tokenizer_name"), str):
            names.append(config["tokenizer_name"])
    return names
