"""A whole (non-sharded) optimizer ``state_dict`` as one safetensors file plus a JSON file.

Key layout is LeRobot's, so either tool reads the other's files: tensors of ``state`` are
``state/<param index>/<name>`` in ``optimizer_state.safetensors`` and ``param_groups`` is a JSON list
in ``optimizer_param_groups.json``. Two additions LeRobot lacks, both invisible to its reader:
non-tensor per-parameter entries (LBFGS' counters and lists of tensors, a ``None`` momentum buffer)
go into the safetensors header as JSON under :data:`NON_TENSOR_KEY`, and any tensor found inside
such an entry or a param group (a tensor ``lr``) is stored as ``nested/<n>`` and referenced from the
JSON. With those the round trip is exact.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

from lerobot_ckpt.errors import CheckpointConfigError, CorruptCheckpointError, OptimizerMismatchError
from lerobot_ckpt.layout import CheckpointPaths
from lerobot_ckpt.safetensors.files import read_tensors, write_tensors
from lerobot_ckpt.state import json_codec
from lerobot_ckpt.state.model import few

NON_TENSOR_KEY = "lerobot_ckpt.non_tensor_state"
NESTED_PREFIX = "nested/"
# States that live alongside each parameter with its shape: a shape change means another model.
PARAM_SHAPED = {
    "exp_avg",
    "exp_avg_sq",
    "max_exp_avg_sq",
    "momentum_buffer",
    "square_avg",
    "acc_delta",
    "sum",
    "grad_avg",
    "exp_inf",
    "ax",
    "prev",
    "mu_product_buffer",
}


def save_optimizer(paths: CheckpointPaths, optimizer: torch.optim.Optimizer) -> None:
    save_optimizer_state(paths, optimizer.state_dict())


def save_optimizer_state(paths: CheckpointPaths, sd: dict[str, Any]) -> None:
    """An optimizer's ``state_dict()`` (live, or an asynchronous save's snapshot of it) as the two files."""
    tensors: dict[str, torch.Tensor] = {}

    def store(_where: str, tensor: torch.Tensor) -> str:
        key = f"{NESTED_PREFIX}{sum(k.startswith(NESTED_PREFIX) for k in tensors)}"
        tensors[key] = tensor
        return key

    non_tensor: dict[str, dict[str, Any]] = {}
    for index, entries in sd["state"].items():
        for name, value in entries.items():
            if "/" in str(name):
                raise CheckpointConfigError(f"optimizer state name {name!r} contains '/'")
            if isinstance(value, torch.Tensor):
                tensors[f"state/{index}/{name}"] = value
            else:
                non_tensor.setdefault(str(index), {})[name] = json_codec.to_json(
                    value, f"optimizer.state.{index}.{name}", store
                )
    groups = [
        json_codec.to_json(group, f"optimizer.param_groups[{g}]", store)
        for g, group in enumerate(sd["param_groups"])
    ]
    metadata = {NON_TENSOR_KEY: json.dumps(non_tensor)} if non_tensor else {}
    write_tensors(paths.optimizer_state, tensors, metadata)
    json_codec.write(paths.optimizer_param_groups, groups, "optimizer.param_groups")


def read_optimizer(paths: CheckpointPaths, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The saved ``state_dict``, typed like ``optimizer``'s own and checked to fit it."""
    tensors, metadata = read_tensors(paths.optimizer_state)
    state: dict[int, dict[str, Any]] = {}
    for key, tensor in tensors.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "state" and parts[1].isdigit():
            state.setdefault(int(parts[1]), {})[parts[2]] = tensor
        elif not key.startswith(NESTED_PREFIX):
            raise CorruptCheckpointError(paths.optimizer_state, f"unexpected tensor name {key!r}")

    def fetch(ref: Any) -> torch.Tensor:
        if ref not in tensors:
            raise CorruptCheckpointError(paths.optimizer_state, f"missing tensor {ref!r}")
        return tensors[ref]

    try:
        non_tensor = json.loads(metadata.get(NON_TENSOR_KEY, "{}"))
        for index, entries in non_tensor.items():
            state.setdefault(int(index), {}).update(json_codec.like(entries, None, fetch))
    except (ValueError, AttributeError) as exc:
        raise CorruptCheckpointError(
            paths.optimizer_state, f"bad {NON_TENSOR_KEY} header entry: {exc}"
        ) from None
    raw_groups = json_codec.read(paths.optimizer_param_groups)
    if not isinstance(raw_groups, list) or not all(isinstance(g, dict) and "params" in g for g in raw_groups):
        raise CorruptCheckpointError(
            paths.optimizer_param_groups, "expected a list of param groups with 'params'"
        )
    _check_fits(paths, raw_groups, state, optimizer)
    check_state_values(paths.optimizer_state, state)
    current = optimizer.state_dict()["param_groups"]
    groups = [json_codec.like(group, current[g], fetch) for g, group in enumerate(raw_groups)]
    check_param_groups(paths.optimizer_param_groups, groups, current)
    return {"state": {i: state[i] for i in sorted(state)}, "param_groups": groups}


def _check_fits(paths: CheckpointPaths, groups: list[dict], state: dict[int, dict], optimizer) -> None:
    """Structure first (groups, params per group), then per-parameter shapes, before any change."""
    saved_sizes = [len(g["params"]) for g in groups]
    live_sizes = [len(g["params"]) for g in optimizer.param_groups]
    if saved_sizes != live_sizes:
        raise OptimizerMismatchError(
            f"{paths.optimizer_param_groups} does not match the optimizer: the checkpoint has "
            f"{len(saved_sizes)} param group(s) of {saved_sizes} parameters, the optimizer "
            f"{len(live_sizes)} of {live_sizes}"
        )
    params = {}
    for saved, live in zip(groups, optimizer.param_groups, strict=True):
        params.update(zip(saved["params"], live["params"], strict=True))
    unknown = set(state) - set(params)
    if unknown:
        raise OptimizerMismatchError(
            f"{paths.optimizer_state} holds state for parameter indices {few(map(str, unknown))} that "
            "no param group lists"
        )
    wrong = [
        f"param {i} {name} (checkpoint {tuple(v.shape)}, parameter {tuple(params[i].shape)})"
        for i in sorted(state)
        for name, v in state[i].items()
        if name in PARAM_SHAPED and isinstance(v, torch.Tensor) and v.shape != params[i].shape
    ]
    if wrong:
        raise OptimizerMismatchError(
            f"{paths.optimizer_state} does not match the optimizer's parameters: {len(wrong)} "
            f"state tensor(s) with another shape: {few(wrong)}"
        )


# Second-moment estimates (Adam, AdamW, their AMSGrad maxima; RMSprop, Adagrad, Adadelta): squares,
# so a negative one is a crafted or corrupted file (its square root would be NaN).
SQUARES = {"exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum", "acc_delta"}


def check_state_values(source: Any, state: dict[int, dict[str, Any]]) -> None:
    """Every floating state tensor finite, every second moment non-negative, before any change: Adam
    would otherwise resume from them silently and write NaN weights. ``source`` names the file."""
    for index in sorted(state):
        for name, value in state[index].items():
            if not isinstance(value, torch.Tensor) or not (value.is_floating_point() or value.is_complex()):
                continue
            where = f"state/{index}/{name}"
            if not bool(torch.isfinite(value).all()):
                raise CorruptCheckpointError(source, f"{where} holds NaN or infinite values")
            if name in SQUARES and not value.is_complex() and bool((value < 0).any()):
                raise CorruptCheckpointError(
                    source, f"{where} holds negative values, which a second-moment estimate cannot"
                )


_NON_NEGATIVE = {"lr", "initial_lr", "max_lr", "min_lr", "weight_decay", "eps"}


def _kind_problem(saved: Any, live: Any) -> str | None:
    """Why ``saved`` cannot stand where the live optimizer holds ``live``, or None."""
    if live is None:  # an optional setting (foreach, fused) unset here
        return (
            None
            if saved is None or isinstance(saved, bool | int | float | str)
            else f"a {type(saved).__name__}"
        )
    if isinstance(live, bool):  # None: the same optional switch, unset when saved
        return None if saved is None or isinstance(saved, bool) else f"{saved!r}, not a boolean"
    if isinstance(live, int | float) or (isinstance(live, torch.Tensor) and live.ndim == 0):
        number = (isinstance(saved, int | float) and not isinstance(saved, bool)) or (
            isinstance(saved, torch.Tensor) and saved.ndim == 0 and saved.is_floating_point()
        )
        if not number:
            return f"{saved!r}, not a number"
        return None if math.isfinite(float(saved)) else f"{float(saved)}, not a finite number"
    if isinstance(live, list | tuple):
        if not isinstance(saved, list | tuple) or len(saved) != len(live):
            return f"{saved!r}, not {len(live)} values"
        return next((p for p in map(_kind_problem, saved, live) if p is not None), None)
    if isinstance(live, str):
        return None if isinstance(saved, str) else f"{saved!r}, not a string"
    return None


def check_param_groups(source: Any, saved: list[dict[str, Any]], live: list[dict[str, Any]]) -> None:
    """Each saved param-group setting has the live one's type (numbers finite, rates ≥ 0), before any
    change: a checkpoint's ``lr`` that is a string, ``None`` or a crafted object would otherwise be
    trained with silently (or read as 0). ``source`` names the file in the error."""
    for g, (group, current) in enumerate(zip(saved, live, strict=True)):
        for key, value in group.items():
            if key == "params" or key not in current:
                continue
            problem = _kind_problem(value, current[key])
            if (
                problem is None
                and key in _NON_NEGATIVE
                and isinstance(value, int | float | torch.Tensor)
                and float(value) < 0
            ):
                problem = f"{float(value)}, which is negative"
            if problem is not None:
                raise CorruptCheckpointError(
                    source,
                    f"param group {g}'s {key} is {problem}; the optimizer holds {current[key]!r} there "
                    "(the checkpoint was edited or written by another program)",
                )


def apply_optimizer(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    optimizer.load_state_dict(state_dict)
