"""An ordered list of processor steps, saved as ``<name>.json`` + one safetensors file per stateful step.

File format (LeRobot's): ``{"name": ..., "steps": [{"registry_name": ..., "config": {...},
"state_file": "<name>_step_<i>_<registry_name>.safetensors"}, ...]}``; ``state_file`` only for steps
with state. Loading resolves ``registry_name`` through ``STEP_REGISTRY`` (a name not yet registered first
imports every known policy's ``PolicySpec.processors`` module, which registers that policy's own steps:
pi0's newline, pi05's state-in-prompt) and fails on names it still does not know, since silently
skipping a step (say, a normaliser) would feed a policy garbage. A step LeRobot
names by its Python class (``"class": "module.Name"``) is never imported: only registered steps load.
A ``state_file`` is read only as a plain relative name inside the pipeline's own directory
(``lerobot_ckpt.paths``; symlinks only in a Hub cache snapshot): a crafted file cannot make a run load,
and then save into its own checkpoint, a file from elsewhere on the disk.

Every problem with the files (not JSON, an unknown step, a config the step refuses, a missing or
damaged state file) is a :class:`ProcessorFileError` naming the file: a ``CheckpointError``, so the CLI
prints it as one line, as it does for the weights (a damaged state file gets the weights' own sentence,
from ``lerobot_ckpt.read_tensors``).
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lerobot_ckpt import CheckpointError, read_tensors
from lerobot_ckpt.paths import check_name, resolve_inside
from safetensors.torch import save_file
from torch import Tensor

from lerobot_cli.filewrites import writing
from lerobot_cli.policies.location import links_root, own_file
from lerobot_cli.policies.registry import available, config_class, spec_of
from lerobot_cli.processors.steps import STEP_REGISTRY, Batch, ProcessorStep


class ProcessorFileError(CheckpointError):
    """A processor pipeline file, or a state file it names, that cannot be loaded (named in the message)."""


class MissingProcessorFileError(ProcessorFileError, FileNotFoundError):
    """The pipeline file, or a state file it names, does not exist."""


def register_policy_steps() -> None:
    """Register every known policy's own steps: import the module its ``PolicySpec.processors`` names,
    whose imports register the steps its pipelines use (the registry names LeRobot's files carry), so a
    saved pipeline loads in a process that never built that policy. A policy whose config or step-list
    module cannot be imported (a plugin that fails, a missing extra) registers nothing: a file naming its
    steps is then refused as naming an unknown step."""
    for name in available():
        try:
            target = spec_of(config_class(name)).processors
            if target:
                importlib.import_module(target.partition(":")[0])
        except (ImportError, ValueError, TypeError):  # UnknownPolicyError is a ValueError
            continue


def _step_entry(path: Path, i: int, entry: Any) -> str:
    """The registry name of step ``i``, or a :class:`ProcessorFileError` saying why it cannot be loaded."""
    if not isinstance(entry, dict):
        raise ProcessorFileError(f"{path}: step {i} is {type(entry).__name__}, not a JSON object")
    name = entry.get("registry_name")
    if isinstance(name, str) and name not in STEP_REGISTRY:
        register_policy_steps()
    if name in STEP_REGISTRY:
        return name
    known = ", ".join(sorted(STEP_REGISTRY))
    if name is None and entry.get("class"):
        raise ProcessorFileError(
            f"{path}: step {i} names the Python class {entry['class']!r}, which is never imported (a "
            f"pipeline file may only use the registered steps: {known}); remove that step, "
            "or save the pipeline with this trainer"
        )
    raise ProcessorFileError(
        f"{path}: step {i} is {name!r}, which this trainer does not implement (known: {known})"
    )


def _state_file(directory: Path, path: Path, i: int, name: str, value: object) -> Path:
    """Where step ``i``'s ``state_file`` is, checked before a byte of it is read: a plain relative name
    inside ``directory`` (``lerobot_ckpt.paths``' rule), so a crafted pipeline file cannot load (and a
    new run then save) a file from elsewhere on the disk. Symlinks only in a Hub cache snapshot."""
    entry = f"steps[{i}].state_file"
    check_name(value, named_by=path, entry=entry)
    if not os.path.lexists(directory / str(value)):
        raise MissingProcessorFileError(
            f"{path}: step {i} ({name}) needs {directory / str(value)}, which is missing"
        )
    return resolve_inside(
        directory, value, named_by=path, entry=entry, allow_links_within=links_root(directory)
    )


class ProcessorPipeline:
    def __init__(self, steps: Sequence[ProcessorStep], name: str) -> None:
        self.steps = list(steps)
        self.name = name

    def __call__(self, data: Batch | Tensor) -> Batch | Tensor:
        """Run the steps on a batch dict; a bare tensor is treated as the ``action`` and returned as one."""
        if isinstance(data, Tensor):
            return self({"action": data})["action"]
        batch = dict(data)
        for step in self.steps:
            batch = step(batch)
        return batch

    def __repr__(self) -> str:
        return (
            f"ProcessorPipeline(name={self.name!r}, steps=[{', '.join(s.registry_name for s in self.steps)}])"
        )

    def step(self, registry_name: str) -> ProcessorStep:
        """The first step with this registry name (e.g. to swap a normaliser's statistics)."""
        for s in self.steps:
            if s.registry_name == registry_name:
                return s
        raise KeyError(f"{self.name} has no {registry_name!r} step ({self!r})")

    def to(self, device: str | torch.device) -> ProcessorPipeline:
        for s in self.steps:
            s.to(device)
        return self

    @property
    def config_filename(self) -> str:
        return f"{self._file_stem()}.json"

    def _file_stem(self) -> str:
        return re.sub(r"[^a-zA-Z0-9_]", "_", self.name.lower())

    def state_filename(self, index: int) -> str:
        return f"{self._file_stem()}_step_{index}_{self.steps[index].registry_name}.safetensors"

    def get_config(self) -> dict[str, Any]:
        entries = []
        for i, s in enumerate(self.steps):
            entry: dict[str, Any] = {"registry_name": s.registry_name, "config": s.get_config()}
            if s.state_dict():
                entry["state_file"] = self.state_filename(i)
            entries.append(entry)
        return {"name": self.name, "steps": entries}

    def save_pretrained(self, directory: str | Path) -> list[Path]:
        """Write the JSON and the state files into ``directory``; returns the paths written."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = self.get_config()
        written = []
        for i, s in enumerate(self.steps):
            state = s.state_dict()
            if state:
                path = directory / config["steps"][i]["state_file"]
                with writing(path):  # a full disk names the file
                    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
                written.append(path)
        path = directory / self.config_filename
        with writing(path):
            path.write_text(json.dumps(config, indent=2))  # byte-equal to LeRobot's file
        return [path, *written]

    @classmethod
    def from_pretrained(cls, directory: str | Path, config_filename: str) -> ProcessorPipeline:
        """Load ``directory/config_filename`` and the state files it names."""
        directory = Path(directory)
        path = directory / config_filename
        if not path.is_file():
            raise MissingProcessorFileError(f"no processor pipeline at {path}")
        own_file(directory, config_filename)  # not a symlink out of the directory (a Hub snapshot's may)
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ProcessorFileError(f"{path} is not a readable JSON file: {exc}") from None
        entries = config.get("steps", []) if isinstance(config, dict) else None
        if not isinstance(entries, list):
            raise ProcessorFileError(
                f"{path} must hold a JSON object with a 'steps' list (LeRobot's pipeline file)"
            )
        steps = []
        for i, entry in enumerate(entries):
            name = _step_entry(path, i, entry)
            try:
                step = STEP_REGISTRY[name].from_config(entry.get("config") or {})
            except (TypeError, ValueError) as exc:  # unknown keys, refused values
                raise ProcessorFileError(f"{path}: step {i} ({name}): {exc}") from None
            if entry.get("state_file"):
                state_path = _state_file(directory, path, i, name, entry["state_file"])
                state, _ = read_tensors(state_path)  # a damaged file: the weights' one sentence, naming it
                try:
                    step.load_state_dict(state)
                except (KeyError, RuntimeError, ValueError) as exc:
                    raise ProcessorFileError(
                        f"{state_path}: does not fit step {i} ({name}) of {path}: {exc}"
                    ) from None
            steps.append(step)
        return cls(steps, name=config.get("name", path.stem))
