"""The wrap plan: everything wrapping will do, decided and checked before any collective.

:func:`build_plan` looks only at the module tree, the runtime's topology and the config, so it runs
the same in every rank (same model, same answer) and in a single process for ``--dry_run`` (on a
``ParallelRuntime.preview``). It is the only place a plan is made: ``wrap_model`` applies the plan
it is given and never builds one. All refusals happen here (no units, unknown class names, tied
weights across units, an ignored-modules pattern that matches nothing, fp16 loss scaling over mixed
sharded/unsharded gradients), so a bad config ends every rank before the first all-gather instead
of hanging one of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import define, field
from torch import nn

from lerobot_parallel.config import AcceleratorConfig, CompileConfig, DDPConfig
from lerobot_parallel.errors import ShardingError
from lerobot_parallel.fsdp_precision import ShardedPrecision, resolve_sharded_precision
from lerobot_parallel.memory import MemoryEstimate, estimate_memory
from lerobot_parallel.regions import check_backend
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.tied_weights import ROOT_LABEL, TiedWeightCheck, check_tied_weights, owner_of
from lerobot_parallel.wrap_units import (
    IGNORED_MODULES,
    children_first,
    declared_groups,
    group_units,
    select_ignored,
    select_units,
)

MAX_LISTED_UNITS = 16


@define(frozen=True)
class PlannedModule:
    """A wrap unit, the root, or an ignored module: its path and the parameters it manages."""

    path: str  # "" for the root; a grouped unit's first member
    class_name: str  # a grouped unit: its members' classes joined by "+"
    num_params: int  # elements of the parameters this group owns (not those of nested units)
    members: tuple[str, ...] = ()  # a grouped unit's other modules, sharded together with ``path``

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path, *self.members)

    @property
    def label(self) -> str:
        return " + ".join(self.paths)


@define(frozen=True)
class ShardingPlan:
    """What :func:`lerobot_parallel.wrap_model` will do for this model and topology."""

    mode: str  # single, ddp, fsdp, hsdp
    dp_replicate: int
    dp_shard: int
    mesh_dim_names: tuple[str, ...]
    mesh_shape: tuple[int, ...]
    unit_source: str | None
    units: tuple[PlannedModule, ...]  # model order
    root: PlannedModule
    ignored: tuple[PlannedModule, ...]
    unmatched_unit_classes: tuple[str, ...]
    tied: TiedWeightCheck
    precision: ShardedPrecision
    reshard_after_forward: bool
    cpu_offload: bool
    memory: MemoryEstimate
    ddp: DDPConfig  # the DDP wrapper's settings (used in ddp mode only)
    # Activation checkpointing and compile (lerobot_parallel.regions): the blocks they apply to are the
    # outermost wrap units (unsharded: the units the policy declares), in model order.
    blocks: tuple[PlannedModule, ...] = ()
    activation_checkpointing: str = "none"
    compile: CompileConfig = field(factory=CompileConfig)

    @property
    def block_paths(self) -> tuple[str, ...]:
        return tuple(path for block in self.blocks for path in block.paths)

    def describe_regions(self) -> list[str]:
        """What activation checkpointing and compile do, one line each when on."""
        lines = []
        where = f"{len(self.blocks)} block(s) ({_class_counts(self.blocks)})" if self.blocks else ""
        if self.activation_checkpointing != "none":
            lines.append(f"Activation checkpointing: {self.activation_checkpointing}, on {where}")
        c = self.compile
        if c.enabled:
            how = f"regional, each of {where}" if c.regional else "the whole policy"
            lines.append(f"Compile: torch.compile backend={c.backend} mode={c.mode or 'default'}, {how}")
        return lines

    @property
    def is_sharded(self) -> bool:
        return self.mode in ("fsdp", "hsdp")

    def shard_order(self) -> list[PlannedModule]:
        """Units in ``fully_shard`` order: nested units before the units containing them."""
        by_path = {u.path: u for u in self.units}
        return [by_path[p] for p in children_first(by_path)]

    def describe_memory(self) -> list[str]:
        """The per-rank estimate, then its params split into trainable and frozen when some are frozen."""
        split = self.memory.describe_params()
        return [self.memory.describe(), *([split] if split else [])]

    def describe(self) -> list[str]:
        """Lines for ``--dry_run`` and the training banner."""
        mesh = ", ".join(f"{n}={s}" for n, s in zip(self.mesh_dim_names, self.mesh_shape, strict=True))
        lines = [f"Sharding plan: {self.mode} on mesh ({mesh})"]
        if not self.is_sharded:
            lines[0] += " - every rank holds a full copy (no sharding)"
            lines += self.describe_memory()
            return lines + self.describe_regions()
        lines.append(
            f"Wrap units from {self.unit_source}: {len(self.units)} unit(s) + the root, "
            f"fully_shard children-first then the root"
        )
        if len(self.units) <= MAX_LISTED_UNITS:
            lines += [f"  {u.label} ({u.class_name}): {u.num_params:,} params" for u in self.units]
        else:
            by_class: dict[str, list[PlannedModule]] = {}
            for u in self.units:
                by_class.setdefault(u.class_name, []).append(u)
            for cls, us in by_class.items():
                counts = sorted({u.num_params for u in us})
                each = f"{counts[0]:,}" if len(counts) == 1 else f"{counts[0]:,}-{counts[-1]:,}"
                lines.append(f"  {cls} x{len(us)} ({each} params each), first {us[0].path}")
        grouped = [u for u in self.units if u.members]
        if grouped:
            lines.append(
                f"  grouped units ({grouped[0].class_name} ...): their modules run jointly, so each group "
                "is one fully_shard call gathering all of them"
            )
        lines.append(f"  {ROOT_LABEL} ({self.root.class_name}): {self.root.num_params:,} params")
        if self.unmatched_unit_classes:
            lines.append(f"  declared but absent from this model: {', '.join(self.unmatched_unit_classes)}")
        if self.ignored:
            dp = self.dp_replicate * self.dp_shard
            lines.append(
                "Ignored modules (unsharded, full copy per rank, gradients averaged over "
                f"{dp} dp ranks): "
                + ", ".join(f"{m.path} ({m.class_name}, {m.num_params:,} params)" for m in self.ignored)
            )
        else:
            lines.append("Ignored modules: none")
        lines.append(self.tied.describe())
        lines.append(self.precision.describe())
        lines.append(
            f"Reshard after forward: {'yes (root: no)' if self.reshard_after_forward else 'no'}; "
            f"CPU offload: {'yes' if self.cpu_offload else 'no'}"
        )
        lines += self.describe_memory()
        return lines + self.describe_regions()


def _class_counts(modules: Sequence[PlannedModule]) -> str:
    counts: dict[str, int] = {}
    for m in modules:
        counts[m.class_name] = counts.get(m.class_name, 0) + 1
    return ", ".join(f"{name} x{n}" for name, n in counts.items())


def outermost(units: Sequence[PlannedModule]) -> tuple[PlannedModule, ...]:
    """Units not inside another unit: a region nested in a checkpointed one would be recomputed twice."""
    paths = [p for u in units for p in u.paths]
    return tuple(
        u
        for u in units
        if not any(other != p and p.startswith(other + ".") for p in u.paths for other in paths)
    )


def _grouped(
    model: nn.Module, paths: Sequence[str], groups: Sequence[Sequence[str]] | None
) -> list[tuple[str, ...]]:
    return list(group_units(paths, declared_groups(model, groups)))


def _unsharded_blocks(
    model: nn.Module, accelerator: AcceleratorConfig, groups: Sequence[Sequence[str]] | None, **declared
) -> tuple[PlannedModule, ...]:
    """The regions of an unsharded run: the units ``fully_shard`` would use (same sources, same order;
    ``declared``: :func:`select_units`' keyword arguments)."""
    ac, compile_ = accelerator.activation_checkpointing, accelerator.compile
    if not ac.enabled and not (compile_.enabled and compile_.regional):
        return ()
    try:
        selection = select_units(model, accelerator.fsdp, **declared)
    except ShardingError as exc:
        wanted = [f"accelerator.activation_checkpointing.mode={ac.mode}"] if ac.enabled else []
        if compile_.enabled and compile_.regional:
            wanted.append("accelerator.compile.regional=true")
        raise ShardingError(
            f"{' and '.join(wanted)} apply to the policy's blocks, and none could be chosen: {exc}"
        ) from None
    units = _grouped(model, selection.paths, groups)
    modules = dict(model.named_modules())
    planned = [
        PlannedModule(
            u[0],
            "+".join(type(modules[p]).__name__ for p in u),
            sum(p.numel() for path in u for p in modules[path].parameters()),
            members=u[1:],
        )
        for u in units
    ]
    return outermost(planned)


def _owned_parameters(model: nn.Module, units: Sequence[tuple[str, ...]], ignored: frozenset[int]):
    """``(unit key, qualified name, parameter)`` for each parameter once, outside ``ignored``: the unit
    whose ``fully_shard`` takes it (the deepest holding it, keyed by its first path; "" the root)."""
    lead = {path: unit[0] for unit in units for path in unit}
    deepest = children_first(lead)
    seen: set[int] = set()
    for mod_path, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen or id(p) in ignored:
                continue
            seen.add(id(p))
            owner = owner_of(mod_path, deepest)
            yield lead.get(owner, owner), f"{mod_path}.{name}".lstrip("."), p


def _group_sizes(
    model: nn.Module, units: Sequence[tuple[str, ...]], ignored: frozenset[int]
) -> dict[str, int]:
    """Elements each ``fully_shard`` group will own, keyed by its first path ("" the root)."""
    sizes = dict.fromkeys([*(u[0] for u in units), ""], 0)
    for unit, _, p in _owned_parameters(model, units, ignored):
        sizes[unit] += p.numel()
    return sizes


def _check_uniform_trainable_dtypes(
    model: nn.Module, units: Sequence[tuple[str, ...]], ignored: frozenset[int]
) -> None:
    """FSDP2 shards a unit's trainable parameters as one flat buffer and refuses mixed dtypes there
    (inside ``fully_shard``, rank by rank); say it here, with the unit and the way out."""
    dtypes: dict[str, dict[str, str]] = {}
    for unit, name, p in _owned_parameters(model, units, ignored):
        if p.requires_grad:
            dtypes.setdefault(unit, {}).setdefault(str(p.dtype).removeprefix("torch."), name)
    for unit, found in dtypes.items():
        if len(found) > 1:
            examples = ", ".join(f"{d} ({n})" for d, n in sorted(found.items()))
            raise ShardingError(
                f"FSDP unit {unit or ROOT_LABEL} holds trainable parameters of several dtypes: {examples}; "
                "FSDP2 shards a unit's trainable parameters as one dtype. Train with "
                "accelerator.mixed_precision=bf16 (fp32 master weights, bf16 compute), make those parameters "
                "one dtype, or freeze the ones of the other dtype"
            )


def build_plan(
    model: nn.Module,
    runtime: ParallelRuntime,
    accelerator: AcceleratorConfig | None = None,
    *,
    default_wrap_modules: Sequence[str] | None = None,
    default_unit_groups: Sequence[Sequence[str]] | None = None,
    default_no_forward_modules: Sequence[str] | None = None,
    default_wrap_modules_source: str | None = None,
    optimizer_states: int = 2,
) -> ShardingPlan:
    """Plan wrapping ``model`` for ``runtime``'s topology with ``accelerator``'s DDP, FSDP and
    precision settings (``ParallelRuntime.preview`` plans a launch from one process).

    The policy's own FSDP needs, for a trainer that keeps them in its config (lerobot-train passes its
    policy spec's); each one given (not None, empty included) replaces the class attribute, which is
    then never read, and each one left None falls back to it:
    ``default_wrap_modules`` for ``model._fsdp_wrap_modules`` (the units when neither
    ``accelerator.fsdp.wrap_modules`` nor ``accelerator.fsdp.min_num_params`` is set),
    ``default_unit_groups`` for ``model._fsdp_unit_groups``, ``default_no_forward_modules`` for the
    ``_fsdp_no_forward_modules`` of every module class in the tree (see :mod:`lerobot_parallel.wrap_units`).
    Passing them also covers a ``model`` wrapped by PEFT, whose attributes sit on the inner class.
    ``default_wrap_modules_source``: how the plan's unit source and the messages name
    ``default_wrap_modules`` (the caller's config field; default ``"default_wrap_modules"``).
    ``optimizer_states``: state tensors per trainable parameter (AdamW 2, SGD with momentum 1).
    Raises :class:`ShardingError` for every config sharding cannot honour.
    """
    accelerator = accelerator or AcceleratorConfig()
    fsdp, mixed_precision = accelerator.fsdp, accelerator.mixed_precision
    parallelism = runtime.parallelism
    names = tuple(n for n, _ in runtime.mesh_dims)
    shape = tuple(s for _, s in runtime.mesh_dims)
    params = list(model.parameters())
    groups = (
        default_unit_groups if default_unit_groups is not None else getattr(model, "_fsdp_unit_groups", None)
    )
    declared = {
        "default_wrap_modules": default_wrap_modules,
        "no_forward": default_no_forward_modules,
        "default_wrap_modules_source": default_wrap_modules_source,
    }
    check_backend(accelerator.compile)
    if not parallelism.is_sharded:
        return ShardingPlan(
            mode=parallelism.mode,
            dp_replicate=parallelism.dp_replicate,
            dp_shard=1,
            mesh_dim_names=names,
            mesh_shape=shape,
            unit_source=None,
            units=(),
            root=PlannedModule("", type(model).__name__, sum(p.numel() for p in params)),
            ignored=(),
            unmatched_unit_classes=(),
            tied=TiedWeightCheck(),
            precision=resolve_sharded_precision("no"),
            reshard_after_forward=fsdp.reshard_after_forward,
            cpu_offload=False,
            memory=estimate_memory(params, dp_shard=1, optimizer_states=optimizer_states),
            ddp=accelerator.ddp,
            blocks=_unsharded_blocks(model, accelerator, groups, **declared),
            activation_checkpointing=accelerator.activation_checkpointing.mode,
            compile=accelerator.compile,
        )
    precision = resolve_sharded_precision(mixed_precision, fsdp.mixed_precision_policy)
    ignored_paths = select_ignored(model, fsdp.ignored_modules_pattern)
    ignored_ids = frozenset(id(p) for path in ignored_paths for p in model.get_submodule(path).parameters())
    if ignored_ids and mixed_precision == "fp16":
        raise ShardingError(
            f"{IGNORED_MODULES} with accelerator.mixed_precision=fp16 is not supported: the loss scaler's "
            "inf check cannot mix sharded (DTensor) and unsharded gradients in torch's GradScaler. Use bf16, "
            "or shard those modules too"
        )
    selection = select_units(model, fsdp, skip=ignored_ids, **declared)
    units = [p for p in selection.paths if not any(p == ig or p.startswith(ig + ".") for ig in ignored_paths)]
    if not units:
        raise ShardingError(
            f"every wrap unit from {selection.source} lies inside "
            f"{IGNORED_MODULES}={fsdp.ignored_modules!r}; sharding the root alone saves no memory"
        )
    if accelerator.compile.enabled and not accelerator.compile.regional:
        raise ShardingError(
            f"accelerator.compile.regional=false compiles the whole policy, which {parallelism.mode} "
            "sharding does not support (FSDP's hooks would be traced); use "
            "accelerator.compile.regional=true, which compiles each wrap unit inside them"
        )
    grouped = _grouped(model, units, groups)
    for unit in grouped:
        inside = [m for m in unit if any(m == ig or m.startswith(ig + ".") for ig in ignored_paths)]
        if inside and len(unit) > 1:
            raise ShardingError(
                f"{IGNORED_MODULES} covers {', '.join(inside)} but not the rest of its grouped unit "
                f"({' + '.join(unit)}), whose modules run jointly; ignore all of them or none"
            )
    if not precision.upcast_trainable:
        _check_uniform_trainable_dtypes(model, grouped, ignored_ids)
    tied = check_tied_weights(model, grouped, ignored_ids)
    sizes = _group_sizes(model, grouped, ignored_ids)
    modules = dict(model.named_modules())
    planned = tuple(
        PlannedModule(u[0], "+".join(type(modules[p]).__name__ for p in u), sizes[u[0]], members=u[1:])
        for u in grouped
    )
    regions = accelerator.activation_checkpointing.enabled or accelerator.compile.enabled
    return ShardingPlan(
        mode=parallelism.mode,
        dp_replicate=parallelism.dp_replicate,
        dp_shard=parallelism.dp_shard,
        mesh_dim_names=names,
        mesh_shape=shape,
        unit_source=selection.source,
        units=planned,
        root=PlannedModule("", type(model).__name__, sizes[""]),
        ignored=tuple(
            PlannedModule(p, type(modules[p]).__name__, sum(x.numel() for x in modules[p].parameters()))
            for p in ignored_paths
        ),
        unmatched_unit_classes=selection.unmatched,
        tied=tied,
        precision=precision,
        reshard_after_forward=fsdp.reshard_after_forward,
        cpu_offload=fsdp.cpu_offload,
        memory=estimate_memory(
            params,
            dp_shard=parallelism.dp_shard,
            ignored=ignored_ids,
            upcast_trainable=precision.upcast_trainable,
            optimizer_states=optimizer_states,
            cpu_offload=fsdp.cpu_offload,
        ),
        ddp=accelerator.ddp,
        blocks=outermost(planned) if regions else (),
        activation_checkpointing=accelerator.activation_checkpointing.mode,
        compile=accelerator.compile,
    )
