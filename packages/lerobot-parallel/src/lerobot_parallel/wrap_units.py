"""Which submodules become FSDP units, and which stay unsharded.

FSDP2 gathers one unit's parameters at a time, so the unit list *is* the memory saving: with
only the root wrapped, every rank all-gathers the whole model for each forward. That is why a
missing unit list is an error here and never a silent fallback to the root.

Three sources, first one given wins (the order of the user docs):
``accelerator.fsdp.wrap_modules`` (class names; each must match), ``accelerator.fsdp.min_num_params``
(size-based, bottom-up), the policy's declared units (at least one must match: a policy may declare
units for optional sub-architectures it did not build this time). The declared units are the caller's
``default_wrap_modules`` when it passes them (a trainer keeping its policies' needs in its own config),
else the model class's ``_fsdp_wrap_modules`` attribute.

Grouped units: a policy whose layers run *jointly* (pi0's PaliGemma layer i and action-expert layer i
attend over one sequence, and the code calls layer i's method with expert layer i as an argument, never
the expert layer's ``forward``) declares ``_fsdp_unit_groups``, tuples of class names whose i-th modules
(model order) form one unit: ``fully_shard([vlm_i, expert_i])`` gathers both at once. A module class
lists in ``_fsdp_forward_methods`` the methods that run instead of ``forward``; they are registered with
``register_fsdp_forward_method`` so calling them gathers the unit. Whatever the unit source, when any
member of a declared group becomes a unit the whole group becomes that one unit: wrapping the members one
by one (the naive wrap) would leave the partner's shards ungathered inside the joint call.

Modules whose ``forward`` the model never calls (it calls their parts or other methods directly) can
never be units either: FSDP would gather them in a hook that never fires. The caller names such classes
with ``no_forward`` (``build_plan``'s ``default_no_forward_modules``); when it passes none (None), any
module class in the tree may list them in ``_fsdp_no_forward_modules``, and all those lists count. An
explicit list replaces the attributes, never adds to them. The size rule passes over these classes
(their parameters count towards the parent) and naming one is refused.

Container modules (``ModuleList`` …) never become units: they have no ``forward``, so FSDP's
pre-forward hook that gathers their parameters would never run.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

from attrs import define
from torch import nn

from lerobot_parallel.config import FSDPConfig
from lerobot_parallel.errors import ShardingError

NO_FORWARD: tuple[type[nn.Module], ...] = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)
# The settings' config paths, as messages and plan sources name them (see lerobot_parallel.errors).
WRAP_MODULES = "accelerator.fsdp.wrap_modules"
MIN_NUM_PARAMS = "accelerator.fsdp.min_num_params"
IGNORED_MODULES = "accelerator.fsdp.ignored_modules"


@define(frozen=True)
class UnitSelection:
    """The chosen unit paths (model order) and a human-readable account of where they came from."""

    paths: tuple[str, ...]
    source: str
    unmatched: tuple[str, ...] = ()  # declared class names that matched no module (policy attribute only)


def never_called(model: nn.Module, no_forward: Iterable[str] | None = None) -> frozenset[str]:
    """Class names never run through ``forward``: ``no_forward`` when given, else those the model's module
    classes declare in ``_fsdp_no_forward_modules`` (see module docstring)."""
    if no_forward is not None:
        return frozenset([no_forward] if isinstance(no_forward, str) else no_forward)
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(type(module), "_fsdp_no_forward_modules", ()))
    return frozenset(names)


def class_census(model: nn.Module) -> str:
    """``"Block x3, Linear x7, …"``: what a user can put in ``accelerator.fsdp.wrap_modules``."""
    counts = Counter(type(m).__name__ for _, m in model.named_modules())
    return ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))


def _unique_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``named_modules`` without the root, each module object once (a shared module is one unit)."""
    return [(path, m) for path, m in model.named_modules() if path]


def depth(path: str) -> int:
    return 0 if not path else path.count(".") + 1


def children_first(paths: Iterable[str]) -> list[str]:
    """Order for ``fully_shard``: a unit must be wrapped before any unit that contains it."""
    return sorted(paths, key=depth, reverse=True)  # stable: model order within one depth


def select_by_class(
    model: nn.Module,
    names: Sequence[str],
    *,
    source: str,
    require_each: bool,
    no_forward: Iterable[str] | None = None,
) -> UnitSelection:
    """Every non-root module whose class ``__name__`` is in ``names``.

    ``no_forward``: see :func:`never_called`.
    """
    wanted = tuple(dict.fromkeys(names))
    present = {type(m).__name__ for _, m in model.named_modules()}
    unmatched = tuple(n for n in wanted if n not in present)
    if require_each and unmatched:
        raise ShardingError(
            f"{source}: class name(s) {', '.join(unmatched)} match no module of {type(model).__name__}; "
            f"class names present: {class_census(model)}"
        )
    uncalled = sorted(set(wanted) & never_called(model, no_forward))
    if uncalled:
        raise ShardingError(
            f"{source}: {', '.join(uncalled)} never runs its forward() in {type(model).__name__} (its parts "
            "are called directly), so FSDP would never gather it; name the layer classes inside it instead"
        )
    containers = sorted(
        {
            type(m).__name__
            for _, m in _unique_modules(model)
            if type(m).__name__ in wanted and isinstance(m, NO_FORWARD)
        }
    )
    if containers:
        raise ShardingError(
            f"{source}: {', '.join(containers)} is a container without forward(); FSDP gathers a unit's "
            "parameters in its forward hook, so name the block class it holds instead"
        )
    paths = tuple(path for path, m in _unique_modules(model) if type(m).__name__ in wanted)
    if not paths:
        only_root = type(model).__name__ in wanted
        raise ShardingError(
            f"{source}: {'only the root module' if only_root else 'no module'} of {type(model).__name__} "
            f"matches {', '.join(wanted)}; sharding the root alone saves no memory. "
            f"Class names present: {class_census(model)}"
        )
    return UnitSelection(paths=paths, source=source, unmatched=unmatched)


def select_by_size(
    model: nn.Module,
    min_num_params: int,
    skip: frozenset[int] = frozenset(),
    no_forward: Iterable[str] | None = None,
) -> UnitSelection:
    """Bottom-up: a module becomes a unit when the parameters not already in a unit below it
    number ``≥ min_num_params``; its whole subtree then counts as taken (units never overlap
    except by nesting, which ``fully_shard`` resolves children-first). Parameters in ``skip``
    (ignored ones, by ``id``) never count; modules without ``forward`` (containers, and the classes
    :func:`never_called` gives for ``no_forward``) never wrap."""
    chosen: list[str] = []
    seen: set[int] = set(skip)
    uncalled = never_called(model, no_forward)

    def visit(path: str, module: nn.Module) -> int:
        free = 0
        for name, child in module.named_children():
            free += visit(f"{path}.{name}" if path else name, child)
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                free += p.numel()
        if (
            path
            and free >= min_num_params
            and not isinstance(module, NO_FORWARD)
            and type(module).__name__ not in uncalled
        ):
            chosen.append(path)
            return 0
        return free

    visit("", model)
    source = f"{MIN_NUM_PARAMS}={min_num_params}"
    if not chosen:
        total = sum(p.numel() for p in model.parameters())
        raise ShardingError(
            f"{source}: no submodule of {type(model).__name__} holds that many parameters (the whole model "
            f"has {total}); lower it, or name the block classes with {WRAP_MODULES}"
        )
    order = {path: i for i, (path, _) in enumerate(model.named_modules())}
    return UnitSelection(paths=tuple(sorted(chosen, key=order.__getitem__)), source=source)


def no_units_message(model: nn.Module, source: str | None = None) -> str:
    """Why FSDP cannot start without units, and the three ways out. ``source``: what the caller calls the
    (empty) declared units it passed, e.g. its own config field; None: the model class's attribute."""
    cls = type(model).__name__
    if source is None:
        empty = "it declares no _fsdp_wrap_modules"
        declare = 'declare _fsdp_wrap_modules = ["BlockClass"] on the policy class'
    else:
        empty, declare = f"{source} lists no block class", f"name the block classes in {source}"
    return (
        f"FSDP needs wrap units, and {cls} gives none: {empty} and neither "
        f"{WRAP_MODULES} nor {MIN_NUM_PARAMS} was passed. Sharding only the root would all-gather the whole "
        "model on every rank and save no memory, so the run stops here. Choose one of: "
        f"{WRAP_MODULES}='[\"BlockClass\"]' (class names present: {class_census(model)}); "
        f"{MIN_NUM_PARAMS}=N (wrap every submodule holding ≥ N parameters); "
        f"or {declare}."
    )


def select_units(
    model: nn.Module,
    fsdp: FSDPConfig,
    default_wrap_modules: Sequence[str] | None = None,
    skip: frozenset[int] = frozenset(),
    *,
    default_wrap_modules_source: str | None = None,
    no_forward: Iterable[str] | None = None,
) -> UnitSelection:
    """The unit paths for ``model`` from the first source given (see module docstring).

    ``default_wrap_modules`` (None: not given) replaces the model's own ``_fsdp_wrap_modules``, which is then
    never read: the caller's list of the policy's units (needed too when the policy is wrapped, e.g. by
    PEFT, and the attribute sits on the inner class); empty means the policy declares none.
    ``default_wrap_modules_source`` names that list in the plan and in messages (the caller's config
    field; default ``"default_wrap_modules"``). ``no_forward``: see :func:`never_called`.
    """
    if fsdp.wrap_modules is not None:
        return select_by_class(
            model, fsdp.wrap_modules, source=WRAP_MODULES, require_each=True, no_forward=no_forward
        )
    if fsdp.min_num_params is not None:
        return select_by_size(model, fsdp.min_num_params, skip, no_forward)
    if default_wrap_modules is not None:
        declared, source = default_wrap_modules, default_wrap_modules_source or "default_wrap_modules"
        named = source
    else:
        declared, named = getattr(model, "_fsdp_wrap_modules", None), None
        source = f"{type(model).__name__}._fsdp_wrap_modules"
    if isinstance(declared, str):
        declared = [declared]
    if not declared:
        raise ShardingError(no_units_message(model, named))
    return select_by_class(model, list(declared), source=source, require_each=False, no_forward=no_forward)


def declared_groups(model: nn.Module, groups: Sequence[Sequence[str]] | None) -> list[tuple[str, ...]]:
    """Member paths of each grouped unit: the i-th module of each named class, zipped in model order."""
    found: list[tuple[str, ...]] = []
    for names in groups or ():
        per_class = [
            [path for path, m in _unique_modules(model) if type(m).__name__ == name] for name in names
        ]
        counts = {name: len(paths) for name, paths in zip(names, per_class, strict=True)}
        if len(set(counts.values())) > 1:
            raise ShardingError(
                f"grouped FSDP units {' + '.join(names)}: the classes occur a different number of times "
                f"({', '.join(f'{n} x{c}' for n, c in counts.items())}), "
                "so their i-th modules cannot be paired"
            )
        found.extend(zip(*per_class))
    return found


def group_units(paths: Sequence[str], groups: Sequence[tuple[str, ...]]) -> tuple[tuple[str, ...], ...]:
    """Units as path tuples, in the order of ``paths``: a declared group whose member was selected becomes
    one unit of all its members, placed where its first selected member was."""
    group_of = {member: members for members in groups for member in members}
    units: list[tuple[str, ...]] = []
    for path in paths:
        unit = group_of.get(path, (path,))
        if unit not in units:
            units.append(unit)
    return tuple(units)


def select_ignored(model: nn.Module, pattern: re.Pattern[str] | None) -> tuple[str, ...]:
    """Top-most module paths that ``pattern`` matches as a whole (``re.fullmatch``).

    A matched module takes its whole subtree with it, so matches below another match are
    dropped. A pattern that matches nothing is an error: a typo would otherwise shard the
    modules the user meant to keep whole, and nobody would notice.
    """
    if pattern is None:
        return ()
    matched: list[str] = []
    for path, _ in _unique_modules(model):
        if pattern.fullmatch(path) and not any(path.startswith(m + ".") for m in matched):
            matched.append(path)
    if not matched:
        sample = [p for p, _ in _unique_modules(model)][:12]
        raise ShardingError(
            f"{IGNORED_MODULES}={pattern.pattern!r} matches no module path (the whole path must match, "
            f"re.fullmatch; start with .* to match a suffix). Paths look like: {', '.join(sample)}"
        )
    return tuple(matched)
