"""The writers a save runs between staging and finishing: each writes one part of the state.

A writer is either the main rank's alone (the non-sharded weights and optimizer files) or
*collective*, called on every rank in the same order (DCP shards, the tensor-by-tensor gather of a
sharded model). :mod:`lerobot_ckpt.save` runs them in one transaction and only has to know which
kind each is: collective writers get the staging path broadcast and an agreement before and after,
main-rank writers run inside the main rank's part of it. Each returns the :class:`Artifacts` it
wrote, so ``training_step.json`` records exactly what is on disk. An EMA shadow is the weights
writer of its topology again, with the shadow in place of the live parameters (``override``),
redirected into ``pretrained_model_ema/`` by :class:`InEma`.

An asynchronous save (:mod:`lerobot_ckpt.async_save`) asks each writer for its
:meth:`Writer.snapshot` on the training thread at the save step: the writers it returns hold CPU
copies and touch no live object, so they may run in the background while training mutates the
model. Whatever is collective over the *training* state happens in ``snapshot`` (the gather of a
sharded model into the main rank's memory); the snapshot writers' own collectives (DCP planning)
run on the group they are handed, the save's checkpoint group.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, Protocol

import torch
from attrs import define
from safetensors import SafetensorError
from torch import nn

from lerobot_ckpt._collective import Collective, describe
from lerobot_ckpt._snapshot import snapshot
from lerobot_ckpt.dcp.save_load import MODEL_KEY, OPTIMIZER_KEY, save_dcp
from lerobot_ckpt.errors import CheckpointConfigError, CheckpointWriteError
from lerobot_ckpt.layout import CheckpointPaths
from lerobot_ckpt.safetensors.files import write_tensors
from lerobot_ckpt.safetensors.gather import gather_to_cpu, write_gathered, write_planned
from lerobot_ckpt.safetensors.stream import SafetensorsPlan
from lerobot_ckpt.state.fqn import AdapterState, model_state, optimizer_state, tied_aliases, with_override
from lerobot_ckpt.state.model import unwrap_model
from lerobot_ckpt.state.optimizer import save_optimizer_state
from lerobot_ckpt.state.record import Artifacts, RunInfo


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Name the file in the error: safetensors' own errors do not, and the user needs the path."""
    try:
        yield
    except (OSError, SafetensorError) as exc:
        raise CheckpointWriteError(
            f"could not write {path}: {describe(exc)}", path=path, os_error=exc
        ) from exc


class Writer(Protocol):
    """One part of a checkpoint, written into the staging tree ``paths`` points at."""

    collective: ClassVar[bool]  # True: every rank calls write(); False: the main rank alone

    def write(self, paths: CheckpointPaths, comm: Collective) -> Artifacts: ...

    def snapshot(self, comm: Collective) -> tuple[Writer, ...]:
        """Writers of the same files from copies taken now (every rank, training thread)."""
        ...


@define(frozen=True, eq=False)
class WholeWeights:
    """Non-sharded weights: ``model.safetensors``, or the PEFT adapter's file through ``adapter_state``.

    Weights the caller's ``write_pretrained`` already wrote (a PEFT ``save_pretrained``) count too;
    a checkpoint with none at all is refused, since it could never be loaded.
    """

    model: nn.Module | Mapping[str, torch.Tensor] | None
    adapter_state: AdapterState | None
    override: Mapping[str, torch.Tensor] | None = None  # an EMA shadow, in place of the live parameters
    collective: ClassVar[bool] = False

    def _state(self) -> tuple[dict[str, torch.Tensor], bool] | None:
        """The tensors to write and whether they are the adapter's (None: no model given)."""
        if self.model is None:
            return None
        state = (
            unwrap_model(self.model).state_dict() if isinstance(self.model, nn.Module) else dict(self.model)
        )
        state = with_override(state, self.override)
        if self.adapter_state is not None:
            return self.adapter_state(state), True
        return state, False

    def write(self, paths: CheckpointPaths, comm: Collective) -> Artifacts:
        return _write_weights(paths, self._state())

    def snapshot(self, comm: Collective) -> tuple[Writer, ...]:
        state = self._state()
        return (StagedWeights(None if state is None else (snapshot(state[0]), state[1])),)


def _write_weights(
    paths: CheckpointPaths, state: tuple[Mapping[str, torch.Tensor], bool] | None
) -> Artifacts:
    if state is not None:
        tensors, adapter = state
        path = paths.adapter_weights if adapter else paths.model_weights
        with writing(path):
            write_tensors(path, tensors)
    if not (paths.model_weights.is_file() or paths.adapter_weights.is_file()):
        raise CheckpointConfigError(
            "the checkpoint would hold no weights: pass model=, or write model.safetensors or a PEFT "
            "adapter (adapter_model.safetensors) from write_pretrained"
        )
    return Artifacts(
        model_safetensors=paths.model_weights.is_file(), peft_adapter=paths.adapter_weights.is_file()
    )


@define(frozen=True, eq=False)
class StagedWeights:
    """:class:`WholeWeights` from a snapshot: CPU copies of the tensors, and whether they are an adapter's."""

    state: tuple[Mapping[str, torch.Tensor], bool] | None
    collective: ClassVar[bool] = False

    def write(self, paths: CheckpointPaths, comm: Collective) -> Artifacts:
        return _write_weights(paths, self.state)


@define(frozen=True, eq=False)
class WholeOptimizer:
    """A non-sharded optimizer: ``optimizer_state.safetensors`` + ``optimizer_param_groups.json``."""

    optimizer: torch.optim.Optimizer
    collective: ClassVar[bool] = False

    def write(self, paths: CheckpointPaths, comm: Collective) -> Artifacts:
        return StagedOptimizer(self.optimizer.state_dict()).write(paths, comm)

    def snapshot(self, comm: Collective) -> tuple[Writer, ...]:
        return (StagedOptimizer(snapshot(self.optimizer.state_dict())),)


@define(frozen=True, eq=False)
class StagedOptimizer:
    """:class:`WholeOptimizer` from a ``state_dict()`` (the live one, or a snapshot of it)."""

    state_dict: dict
    collective: ClassVar[bool] = False

    def write(self, paths: CheckpointPaths, comm: Collective) -> Artifacts:
        with writing(paths.optimizer_state):
            save_optimizer_state(paths, self.state_dict)
        return Artifacts(optimizer_single_file=True)


@define(frozen=True, eq=False)
class ShardedState:
    """A sharded (FSDP2/HSDP) model and its optimizer, from every rank.

    The weights per ``run.checkpoint_format`` (DCP into ``pytorch_model_fsdp_0/`` and/or the gathered
    ``model.safetensors``), the optimizer as DCP into ``optimizer_0/``. DCP fails symmetrically (it
    raises on every rank when any failed). The gather's write can fail on the main rank alone; that
    error is held until the optimizer's collective save has been joined too, so no peer is left
    waiting in it.
    """

    run: RunInfo
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    adapter_state: AdapterState | None
    override: Mapping[str, torch.Tensor] | None = None  # an EMA shadow's shards, in place of the live ones
    collective: ClassVar[bool] = True

    def write(self, paths: CheckpointPaths, comm: Collective) -> Artifacts:
        state = model_state(self.model, self.adapter_state, self.override)
        fmt, peft = self.run.checkpoint_format, self.adapter_state is not None
        weights = paths.adapter_weights if peft else paths.model_weights
        if fmt.writes_dcp:
            save_dcp(paths.model_dcp, MODEL_KEY, state)
        held: Exception | None = None
        if fmt.writes_safetensors:
            aliases = {} if peft else tied_aliases(self.model, state)
            try:
                with writing(weights):
                    write_gathered(
                        weights if comm.is_main else None, state, aliases=aliases, is_main=comm.is_main
                    )
            except Exception as exc:  # noqa: BLE001 - raised below, after the remaining collectives
                held = exc
        del state
        if self.optimizer is not None:
            try:
                save_dcp(paths.optimizer_dcp, OPTIMIZER_KEY, optimizer_state(self.model, self.optimizer))
            except Exception:
                if held is None:
                    raise
        if held is not None:
            raise held
        return Artifacts(
            model_safetensors=fmt.writes_safetensors and not peft,
            model_dcp=fmt.writes_dcp,
            optimizer_dcp=self.optimizer is not None,
            peft_adapter=peft,
        )

    def snapshot(self, comm: Collective) -> tuple[Writer, ...]:
        """The DCP parts as CPU copies of this rank's shards; the gathered file as whole tensors on the
        main rank (the gather is collective over the training group, so it happens here)."""
        state = model_state(self.model, self.adapter_state, self.override)
        fmt, peft = self.run.checkpoint_format, self.adapter_state is not None
        out: list[Writer] = []
        if fmt.writes_dcp:
            out.append(
                StagedDcp(
                    "model_dcp", MODEL_KEY, snapshot(state), Artifacts(model_dcp=True, peft_adapter=peft)
                )
            )
        if fmt.writes_safetensors:
            aliases = {} if peft else tied_aliases(self.model, state)
            plan, tensors = gather_to_cpu(state, aliases=aliases, is_main=comm.is_main)
            out.append(
                StagedGathered(
                    "adapter_weights" if peft else "model_weights",
                    plan,
                    tensors,
                    Artifacts(model_safetensors=not peft, peft_adapter=peft),
                )
            )
        del state
        if self.optimizer is not None:
            out.append(
                StagedDcp(
                    "optimizer_dcp",
                    OPTIMIZER_KEY,
                    snapshot(optimizer_state(self.model, self.optimizer)),
                    Artifacts(optimizer_dcp=True),
                )
            )
        return tuple(out)


@define(frozen=True, eq=False)
class StagedDcp:
    """One DCP directory of a sharded snapshot (``where``: its :class:`CheckpointPaths` attribute).

    Collective over the group of ``comm`` (the asynchronous save's checkpoint group): DCP's
    planning gathers every rank's plan there. The state is CPU DTensors of the training mesh;
    DCP reads only their local shards and metadata, so nothing runs on the training group.
    """

    where: str
    key: str
    state: dict
    artifacts: Artifacts
    collective: ClassVar[bool] = True

    def write(self, paths: CheckpointPaths, comm: Collective) -> Artifacts:
        save_dcp(getattr(paths, self.where), self.key, self.state, process_group=comm.group)
        return self.artifacts


@define(frozen=True, eq=False)
class StagedGathered:
    """The gathered ``model.safetensors`` (or adapter file) of a sharded snapshot: the main rank's
    whole tensors, written with the synchronous save's plan (byte-identical file)."""

    where: str
    plan: SafetensorsPlan
    tensors: Mapping[str, torch.Tensor] | None  # None on ranks other than the main one
    artifacts: Artifacts
    collective: ClassVar[bool] = False

    def write(self, paths: CheckpointPaths, comm: Collective) -> Artifacts:
        path = getattr(paths, self.where)
        with writing(path):
            write_planned(path, self.plan, self.tensors)
        return self.artifacts


@define(frozen=True, eq=False)
class InEma:
    """``inner`` (a weights writer given the EMA shadow as its override) writing into
    ``pretrained_model_ema/`` instead of ``pretrained_model/``; ``artifacts`` says what that is."""

    inner: Writer
    artifacts: Artifacts

    @property
    def collective(self) -> bool:
        return self.inner.collective

    def write(self, paths: CheckpointPaths, comm: Collective) -> Artifacts:
        self.inner.write(paths.ema, comm)
        return self.artifacts

    def snapshot(self, comm: Collective) -> tuple[Writer, ...]:
        return tuple(InEma(w, self.artifacts) for w in self.inner.snapshot(comm))
