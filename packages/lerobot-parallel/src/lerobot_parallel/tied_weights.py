"""Refuse tied weights that FSDP units would split.

One parameter object reachable from two FSDP units would be sharded by whichever ``fully_shard``
ran first and be a stale plain tensor for the other. torch 2.15 stops inside ``fully_shard`` with
the parameter name only; torch 2.12–2.14 at the first step; older torch splits it silently. We
check before any collective, on the module tree alone, so ``--dry_run`` can report it and the
error names both units, which is what the user has to change.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from attrs import define
from torch import nn

from lerobot_parallel.errors import ShardingError
from lerobot_parallel.wrap_units import depth

ROOT_LABEL = "<root>"


@define(frozen=True)
class SharedParameter:
    """One parameter object known under several names, all inside ``owner`` (a unit path, or "" for root)."""

    names: tuple[str, ...]
    owner: str


@define(frozen=True)
class TiedWeightCheck:
    """The passed check: parameters shared only within one unit (or within the root)."""

    shared: tuple[SharedParameter, ...] = ()

    def describe(self) -> str:
        if not self.shared:
            return "Tied weights: none"
        parts = [f"{' = '.join(s.names)} (in {s.owner or ROOT_LABEL})" for s in self.shared]
        return f"Tied weights: ok, each shared parameter stays inside one unit: {'; '.join(parts)}"


def owner_of(module_path: str, units_deepest_first: Sequence[str]) -> str:
    """The unit whose ``fully_shard`` call takes a parameter registered at ``module_path``: the
    deepest unit containing it, else the root ("")."""
    for unit in units_deepest_first:
        if module_path == unit or module_path.startswith(unit + "."):
            return unit
    return ""


def parameter_names(model: nn.Module) -> dict[int, tuple[nn.Parameter, list[tuple[str, str]]]]:
    """``id(param) -> (param, [(module path, qualified name), …])`` over every path, shared ones included."""
    found: dict[int, tuple[nn.Parameter, list[tuple[str, str]]]] = {}
    for mod_path, module in model.named_modules(remove_duplicate=False):
        for pname, p in module._parameters.items():
            if p is None:
                continue
            qualified = f"{mod_path}.{pname}" if mod_path else pname
            entry = found.setdefault(id(p), (p, []))
            if (mod_path, qualified) not in entry[1]:
                entry[1].append((mod_path, qualified))
    return found


def check_tied_weights(
    model: nn.Module, unit_paths: Sequence[str | tuple[str, ...]], ignored: frozenset[int] = frozenset()
) -> TiedWeightCheck:
    """Raise :class:`ShardingError` naming the parameter and both units when a parameter is used by
    two different units (or a unit and the root); return what is shared harmlessly otherwise.

    A unit is a module path or a tuple of paths (a grouped unit, one ``fully_shard`` call: sharing
    inside it is fine). Ignored parameters (``id`` in ``ignored``) are outside every unit.
    """
    lead = {
        path: (unit if isinstance(unit, str) else unit[0])
        for unit in unit_paths
        for path in ((unit,) if isinstance(unit, str) else unit)
    }
    units = sorted(lead, key=depth, reverse=True)
    classes = {path: type(m).__name__ for path, m in model.named_modules(remove_duplicate=False)}
    shared: list[SharedParameter] = []
    for pid, (_, places) in parameter_names(model).items():
        if len(places) < 2 or pid in ignored:
            continue
        owners: dict[str, list[str]] = defaultdict(list)
        for mod_path, qualified in places:
            owner = owner_of(mod_path, units)
            owners[lead.get(owner, owner)].append(qualified)
        if len(owners) > 1:
            (u1, n1), (u2, n2) = list(owners.items())[:2]

            def label(unit: str) -> str:
                return (
                    f"the root {ROOT_LABEL} ({type(model).__name__})"
                    if not unit
                    else f"unit {unit} ({classes[unit]})"
                )

            raise ShardingError(
                f"tied weights cannot be split between FSDP units: parameter {n1[0]} (the same tensor as "
                f"{n2[0]}) is used by {label(u1)} and by {label(u2)}. Keep both users in one unit (wrap a "
                "common parent, or drop one class from the unit list so it joins the root), untie the "
                "weights, or keep them unsharded with accelerator.fsdp.ignored_modules"
            )
        ((owner, names),) = owners.items()
        shared.append(SharedParameter(names=tuple(names), owner=owner))
    return TiedWeightCheck(shared=tuple(shared))
