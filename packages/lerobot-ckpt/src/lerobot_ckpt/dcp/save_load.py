"""``torch.distributed.checkpoint`` save and load of one nested state, with our errors and checks.

The state is nested under one key, ``{"model": ...}`` in ``pretrained_model/pytorch_model_fsdp_0/``
and ``{"optimizer": ...}`` in ``training_state/optimizer_0/``: accelerate's directory names and
nesting, so its ``merge_fsdp_weights`` / ``load_fsdp_model`` read our shards and we read theirs.

DCP raises ``CheckpointException`` (a ``BaseException``, one entry per failing rank) on *every*
rank when any rank failed; it is turned into a ``CheckpointWriteError`` naming the failing rank
and the OS error, so the save's agreement reports one readable line everywhere.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from lerobot_ckpt._collective import describe
from lerobot_ckpt.dcp.index import METADATA_FILE, MODEL_KEY, OPTIMIZER_KEY, DcpIndex
from lerobot_ckpt.dcp.metadata import load_metadata
from lerobot_ckpt.dcp.safe_reader import SafePlanner, SafeReader
from lerobot_ckpt.errors import (
    CheckpointError,
    CheckpointSaveError,
    CheckpointWriteError,
    CorruptCheckpointError,
    ModelMismatchError,
    OptimizerMismatchError,
)
from lerobot_ckpt.state.model import few, mismatch
from lerobot_ckpt.state.optimizer import PARAM_SHAPED


def _lowest_failure(exc: CheckpointException) -> tuple[int, BaseException] | None:
    """The lowest failing rank and its error: DCP gathers every rank's, so all ranks pick the same."""
    failures = exc.failures or {}
    if not failures:
        return None
    rank = min(failures)
    return rank, failures[rank][0] if isinstance(failures[rank], tuple) else failures[rank]


def _translate(exc: CheckpointException, directory: Path) -> CheckpointSaveError:
    failure, failures = _lowest_failure(exc), exc.failures or {}
    if failure is None:
        return CheckpointSaveError(f"could not write {directory}: {str(exc).splitlines()[0]}")
    rank, inner = failure
    others = f" (ranks {', '.join(map(str, sorted(failures)))} failed)" if len(failures) > 1 else ""
    message = f"could not write {directory}{others}: {describe(inner)}"
    if isinstance(inner, OSError):
        error: CheckpointSaveError = CheckpointWriteError(
            message, path=getattr(inner, "filename", None) or directory, os_error=inner
        )
    else:
        error = CheckpointSaveError(message)
    error.rank = rank  # the rank that failed, so every rank reports it rather than itself
    return error


def save_dcp(directory: Path, key: str, state: dict[str, Any], *, process_group: Any = None) -> None:
    """Collective DCP save of ``{key: state}``; every rank writes its own shards (fsynced).

    ``process_group``: where DCP coordinates (None: the default group). An asynchronous save passes
    its checkpoint group and CPU copies of the state: that is ``dcp.async_save``'s own recipe
    (stage to CPU, then ``save`` on a thread with a CPU-capable group), run inside our transaction
    so the commit follows every writer (see :mod:`lerobot_ckpt.async_save`).
    """
    directory.mkdir(parents=True, exist_ok=True)
    try:
        dcp.save(
            {key: state},
            storage_writer=dcp.FileSystemWriter(directory, sync_files=True),
            process_group=process_group,
        )
    except CheckpointException as exc:
        raise _translate(exc, directory) from None


def _translate_read(exc: CheckpointException, directory: Path) -> CheckpointError:
    """A failed DCP read as one line: the lowest failing rank's error, the same on every rank."""
    failure = _lowest_failure(exc)
    if failure is None:
        return CorruptCheckpointError(directory, f"a shard could not be read: {str(exc).splitlines()[0]}")
    rank, inner = failure
    if isinstance(inner, CheckpointError):  # our own reader's verdict (e.g. an entry that could run code)
        return inner
    cause = describe(inner).split(". ")[0][:160]  # torch's own advice after the first sentence does not apply
    return CorruptCheckpointError(
        directory,
        f"rank {rank} could not decode a shard ({cause}); the files were damaged after the save: "
        "restore the directory from an intact copy of the checkpoint or resume from another one",
    )


def load_dcp(directory: Path, key: str, targets: dict[str, Any], *, collective: bool) -> None:
    """Read ``directory`` into ``targets`` in place; DCP reads only each rank's part of each tensor.

    ``collective=False`` (plain tensors: one process, or each DDP rank on its own) skips DCP's
    planning collectives, so it also works without a process group. Nothing read runs code
    (:mod:`lerobot_ckpt.dcp.safe_reader`). A shard torch cannot decode
    (damage the framing checks before the read did not see) raises :class:`CorruptCheckpointError`,
    not DCP's multi-rank traceback dump; ``targets`` may then be partly loaded.
    """
    load_metadata(directory / METADATA_FILE)  # a refusal in our words (DCP would bury it in its own)
    holder = {key: targets}
    reader = SafeReader(directory)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            dcp.load(holder, storage_reader=reader, planner=SafePlanner(directory), no_dist=not collective)
        except CheckpointException as exc:
            if reader.refusal is not None:  # torch reports it as "metadata is None": say why instead
                raise reader.refusal from None
            raise _translate_read(exc, directory) from None
    if holder[key] is not targets:  # DCP replaces non-tensor leaves; keep the caller's dict current
        targets.clear()
        targets.update(holder[key])


def check_model(index: DcpIndex, targets: dict[str, torch.Tensor], *, subset: bool = False) -> None:
    """The shards hold exactly the model's keys with the same global shapes (before any change);
    ``subset``: at least ``targets``' keys (an EMA shadow's, read from a full state)."""
    foreign = [".".join(map(str, p)) for p in index.other_paths if p[:1] == (MODEL_KEY,)]
    if foreign:
        raise ModelMismatchError(
            f"{index.directory} holds non-tensor model entries ({few(foreign)}); model "
            "weights are tensors only, so it is not a model checkpoint lerobot-ckpt loads"
        )
    stored = index.under(MODEL_KEY)
    problem = mismatch(targets, stored, subset=subset)
    if problem:
        raise ModelMismatchError(f"{index.directory} does not match the model: {problem}")


def stored_optimizer_fqns(index: DcpIndex) -> dict[str, dict[str, tuple[int, ...]]]:
    """``{fqn: {state name: shape}}`` of the saved optimizer state."""
    out: dict[str, dict[str, tuple[int, ...]]] = {}
    for t in index.tensors:
        if len(t.path) == 4 and t.path[:2] == (OPTIMIZER_KEY, "state"):
            out.setdefault(str(t.path[2]), {})[str(t.path[3])] = t.shape
    for path in index.other_paths:  # non-tensor state entries still name their parameter
        if len(path) == 4 and path[:2] == (OPTIMIZER_KEY, "state"):
            out.setdefault(str(path[2]), {})
    return out


def stored_group_count(index: DcpIndex) -> int:
    groups = {p[2] for p in index.other_paths if len(p) >= 3 and p[:2] == (OPTIMIZER_KEY, "param_groups")}
    return len(groups)


def check_optimizer(index: DcpIndex, shapes: dict[str, tuple[int, ...]], n_groups: int) -> None:
    """Saved state fits the optimizer: same number of param groups, known FQNs, parameter shapes."""
    saved_groups = stored_group_count(index)
    if saved_groups != n_groups:
        raise OptimizerMismatchError(
            f"{index.directory} has {saved_groups} param group(s), the optimizer {n_groups}"
        )
    stored = stored_optimizer_fqns(index)
    unknown = set(stored) - set(shapes)
    if unknown:
        raise OptimizerMismatchError(
            f"{index.directory} holds state for {len(unknown)} parameter(s) the optimizer does not have: "
            f"{few(unknown)}"
        )
    wrong = [
        f"{fqn} {name} (checkpoint {shape}, parameter {shapes[fqn]})"
        for fqn, entries in stored.items()
        for name, shape in entries.items()
        if name in PARAM_SHAPED and shape != shapes[fqn]
    ]
    if wrong:
        raise OptimizerMismatchError(
            f"{index.directory} does not match the optimizer's parameters: {len(wrong)} state tensor(s) with "
            f"another shape: {few(wrong)}"
        )
