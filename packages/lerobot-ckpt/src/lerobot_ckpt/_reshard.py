"""Resume model and optimizer onto any topology: 1 process, DDP N, FSDP2 N, HSDP R×S, from any of them.

The live model and optimizer are asked for their FQN-keyed state (:mod:`lerobot_ckpt.state.fqn`),
whose tensors alias their storage: full tensors on a plain or DDP model, this rank's DTensor
shards on an FSDP2/HSDP one. The checkpoint is then read *into* them:

* weights from ``pytorch_model_fsdp_0/`` when the checkpoint has it (DCP reads, for each target,
  only the chunks overlapping it: that is the resharding), else from ``model.safetensors`` (each
  rank reads just its slice of every tensor);
* optimizer from ``optimizer_0/`` (DCP, same way), else from ``optimizer_state.safetensors``
  (index-keyed: re-keyed by FQN, then every rank hands the full state to
  ``set_optimizer_state_dict(full_state_dict=True)``, which keeps each rank's shard).

Everything is checked first (DCP metadata: keys, global shapes, every shard file present, long
enough and framed as ``torch.save`` records, no record whose pickle could run code; safetensors
headers; optimizer groups, shapes and the types of param-group settings), so a mismatch, a crafted
entry or a shard overwritten with other bytes raises before anything changes. After the checks, reading
happens in place: an I/O error in the middle of it (a disk failing during the resume) can leave a partly
loaded model, which the raised error makes visible.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain

import torch
from attrs import define, field
from safetensors import SafetensorError, safe_open
from torch import nn

from lerobot_ckpt.dcp.index import ChunkReader, DcpIndex, read_full_tensor
from lerobot_ckpt.dcp.save_load import (
    MODEL_KEY,
    OPTIMIZER_KEY,
    check_model,
    check_optimizer,
    load_dcp,
    stored_optimizer_fqns,
)
from lerobot_ckpt.dcp.untrusted import check_untrusted
from lerobot_ckpt.errors import (
    CheckpointConfigError,
    CorruptCheckpointError,
    MissingCheckpointFileError,
    ModelMismatchError,
)
from lerobot_ckpt.layout import CheckpointPaths
from lerobot_ckpt.safetensors.files import read_tensors
from lerobot_ckpt.state.fqn import (
    AdapterState,
    apply_optimizer_state,
    index_state_to_fqn,
    local_index,
    local_tensor,
    model_state,
    optimizer_state,
    param_fqns,
)
from lerobot_ckpt.state.model import check_tensor, mismatch, warn_converted
from lerobot_ckpt.state.optimizer import apply_optimizer, check_param_groups, read_optimizer
from lerobot_ckpt.state.record import TrainingStepRecord

Step = Callable[[], None]


@define(frozen=True)
class _Shape:
    shape: tuple[int, ...]


class _SafetensorsSlices:
    """A safetensors file checked against targets, then copied into them slice by slice."""

    def __init__(self, path, targets: dict[str, torch.Tensor], *, subset: bool = False) -> None:
        if not path.is_file():
            raise MissingCheckpointFileError(path)
        self.path = path
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                metadata = dict(f.metadata() or {})
                shapes = {name: _Shape(tuple(f.get_slice(name).get_shape())) for name in f.keys()}  # noqa: SIM118
        except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
            raise CorruptCheckpointError(path, f"not a readable safetensors file: {exc}") from None
        self.names = {k: k for k in shapes}
        self.names.update(
            {alias: kept for alias, kept in metadata.items() if alias not in shapes and kept in shapes}
        )
        found = {k: shapes[v] for k, v in self.names.items()}
        problem = mismatch(targets, found, subset=subset)
        if problem:
            raise ModelMismatchError(f"{path} does not match the model: {problem}")
        self.targets = targets
        # Read and checked now, before anything is changed: an integer tensor (cast silently by copy_)
        # or NaN/inf values are refused in one line naming the file and the tensor.
        self.values: dict[str, torch.Tensor] = {}
        converted = []
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for key, target in targets.items():
                    name, index = self.names[key], local_index(target)
                    value = f.get_tensor(name) if index is None or not index else f.get_slice(name)[index]
                    if check_tensor(path, key, value, local_tensor(target)):
                        converted.append(key)
                    self.values[key] = value
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise CorruptCheckpointError(path, f"not a readable safetensors file: {exc}") from None
        warn_converted(path, converted)

    @torch.no_grad()
    def copy(self) -> None:
        for key, target in self.targets.items():
            local_tensor(target).copy_(self.values[key])


@define(frozen=True)
class PreparedState:
    """Checked model/optimizer sources; :meth:`apply` performs the (in-place, maybe collective) reads."""

    steps: tuple[Step, ...] = field(default=(), converter=tuple)

    def apply(self) -> None:
        for step in self.steps:
            step()


def _checked_index(directory) -> tuple[DcpIndex, dict]:
    """A DCP directory's index once every shard file is present, long enough, framed as a record and
    free of records that could run code; with its decoded non-tensor entries (plain data) by path."""
    index = DcpIndex.read(directory)
    index.check_files()
    index.check_records()
    return index, check_untrusted(index)


def _stored_groups(plain: dict) -> list[dict]:
    """The param groups a DCP optimizer directory stores, from its decoded entries."""
    groups: dict[int, dict] = {}
    for path, value in plain.items():
        if len(path) == 4 and path[:2] == (OPTIMIZER_KEY, "param_groups"):
            groups.setdefault(int(path[2]), {})[str(path[3])] = value
    return [groups[g] for g in sorted(groups)]


def _weights(
    paths: CheckpointPaths,
    record: TrainingStepRecord,
    model: nn.Module | None,
    adapter_state: AdapterState | None,
    apply_adapter,
    collective: bool,
) -> Step | None:
    art = record.artifacts
    if art.peft_adapter:
        if model is not None and adapter_state is None and apply_adapter is None:
            raise CheckpointConfigError(
                f"{paths.root} holds a PEFT adapter, not full weights: pass adapter_state= "
                "(or apply_adapter= for a non-sharded model) to load it"
            )
        if adapter_state is None and apply_adapter is not None and collective:
            raise CheckpointConfigError(
                "a sharded model loads a PEFT adapter through adapter_state=, not apply_adapter="
            )
    elif adapter_state is not None or apply_adapter is not None:
        raise CheckpointConfigError(f"an adapter loader was given but {paths.root} holds no PEFT adapter")
    if model is None and apply_adapter is None:
        return None
    by_caller = art.peft_adapter and adapter_state is None  # the caller's apply_adapter gets full tensors
    if art.model_dcp:
        index, _ = _checked_index(paths.model_dcp)
        if by_caller:
            with ChunkReader(index.directory) as reader:
                tensors = {k: read_full_tensor(reader, t, k) for k, t in index.under(MODEL_KEY).items()}
            return lambda: apply_adapter(tensors)
        targets = model_state(model, adapter_state)
        check_model(index, targets)
        return lambda: load_dcp(paths.model_dcp, MODEL_KEY, targets, collective=collective)
    if not art.peft_adapter and not art.model_safetensors:
        raise CorruptCheckpointError(paths.training_step, "it records no model weights")
    file = paths.adapter_weights if art.peft_adapter else paths.model_weights
    if by_caller:
        tensors = read_tensors(file)[0]
        return lambda: apply_adapter(tensors)
    return _SafetensorsSlices(file, model_state(model, adapter_state)).copy


def _optimizer(
    paths: CheckpointPaths,
    record: TrainingStepRecord,
    model: nn.Module | None,
    optimizer: torch.optim.Optimizer,
    collective: bool,
) -> Step:
    art = record.artifacts
    if model is None:
        raise CheckpointConfigError(
            "restoring a sharded or DCP optimizer state needs model= as well (its "
            "state is keyed by parameter names)"
        )
    params = list(chain.from_iterable(g["params"] for g in optimizer.param_groups))
    fqns = param_fqns(model, optimizer)
    if art.optimizer_dcp:
        index, plain = _checked_index(paths.optimizer_dcp)
        check_optimizer(
            index, {f: tuple(p.shape) for f, p in zip(fqns, params, strict=True)}, len(optimizer.param_groups)
        )
        check_param_groups(index.directory, _stored_groups(plain), optimizer.state_dict()["param_groups"])
        stored = set(stored_optimizer_fqns(index))

        def load() -> None:
            target = optimizer_state(model, optimizer)
            for fqn in [f for f in target["state"] if f not in stored]:  # had no state when saved
                del target["state"][fqn]
            load_dcp(paths.optimizer_dcp, OPTIMIZER_KEY, target, collective=collective)
            apply_optimizer_state(model, optimizer, target)

        return load
    if art.optimizer_single_file:
        for p in (paths.optimizer_state, paths.optimizer_param_groups):
            if not p.is_file():
                raise MissingCheckpointFileError(p)
        full = read_optimizer(paths, optimizer)
        if not collective:
            return lambda: apply_optimizer(optimizer, full)
        by_fqn = index_state_to_fqn(full, fqns)
        return lambda: apply_optimizer_state(model, optimizer, by_fqn, full=True)
    raise MissingCheckpointFileError(paths.optimizer_state, "the run was saved without optimizer state")


def prepare_state(
    paths: CheckpointPaths,
    record: TrainingStepRecord,
    *,
    model: nn.Module | None,
    optimizer: torch.optim.Optimizer | None,
    adapter_state: AdapterState | None,
    apply_adapter,
    collective: bool,
    ema: dict[str, torch.Tensor] | None = None,
) -> PreparedState:
    """Check every source against the live objects; nothing is modified until ``apply()``."""
    weights = _weights(paths, record, model, adapter_state, apply_adapter, collective)
    optim = _optimizer(paths, record, model, optimizer, collective) if optimizer is not None else None
    shadow = ema_step(paths, record, model=model, ema=ema, adapter_state=adapter_state, collective=collective)
    return PreparedState(step for step in (weights, optim, shadow) if step is not None)


def _ema_targets(
    model: nn.Module, ema: dict[str, torch.Tensor], adapter_state: AdapterState | None
) -> dict[str, torch.Tensor]:
    """The shadow's tensors under the names the EMA files use: the model's FQNs (one name per tied
    tensor), or the adapter file's keys for a PEFT run (the selection the save made, applied to the
    model's state with the shadow in place)."""
    first: dict[int, str] = {}
    for name, t in ema.items():
        first.setdefault(id(t), name)
    if adapter_state is None:
        return {name: ema[name] for name in first.values()}
    selected = {k: v for k, v in adapter_state(model_state(model, None, ema)).items() if id(v) in first}
    if len({id(v) for v in selected.values()}) != len(first):
        raise CheckpointConfigError(
            "the EMA shadow covers parameters the PEFT adapter selection does not name: "
            "it must cover the trainable (adapter) parameters only"
        )
    return selected


def ema_step(
    paths: CheckpointPaths,
    record: TrainingStepRecord,
    *,
    model: nn.Module | None,
    ema: dict[str, torch.Tensor] | None,
    adapter_state: AdapterState | None,
    collective: bool,
) -> Step | None:
    """Checked source of the EMA shadow (``pretrained_model_ema/``) and the in-place read into it;
    None when none is asked for or the checkpoint has none (the caller says so).

    DCP shards when the checkpoint has them (resharded onto the shadow's placements), else the
    safetensors file (each rank reading its slice). Only the shadow's keys are read: the files
    hold the whole model state (buffers and frozen weights are the live model's)."""
    art = record.artifacts
    if ema is None or not art.ema:
        return None
    if model is None:
        raise CheckpointConfigError(
            "restoring an EMA shadow needs model= as well (its files are keyed like the model)"
        )
    ema_paths = paths.ema
    targets = _ema_targets(model, dict(ema), adapter_state)
    if art.ema_dcp:
        index, _ = _checked_index(ema_paths.model_dcp)
        check_model(index, targets, subset=True)
        return lambda: load_dcp(ema_paths.model_dcp, MODEL_KEY, targets, collective=collective)
    file = ema_paths.adapter_weights if art.peft_adapter else ema_paths.model_weights
    return _SafetensorsSlices(file, targets, subset=True).copy
