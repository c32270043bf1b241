"""Which parts of a policy are frozen, named for ``--dry_run`` and the sharded banner.

The plan's per-rank estimate says how many bytes are frozen; this says which modules they are (SmolVLA's
VLM under LeRobot's ``train_expert_only``, its vision tower, pi0's unused heads), so that a reader can tell
that a frozen tower is still held (sharded with its units under FSDP2) but costs no gradient and no
optimizer state. Works on the meta device: only ``requires_grad`` and shapes are read.
"""

from __future__ import annotations

import re

from torch import nn

_INDEX = re.compile(r"\.\d+(?=\.|$)")


def frozen_parts(model: nn.Module) -> list[tuple[str, int]]:
    """``(path, parameter count)`` of the largest submodules whose parameters are all frozen, in model
    order (a frozen parameter held directly by a module that also trains is listed by its own name)."""
    found: list[tuple[str, int]] = []

    def visit(module: nn.Module, path: str) -> None:
        params = list(module.parameters())
        if params and not any(p.requires_grad for p in params):
            found.append((path, sum(p.numel() for p in params)))
            return
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                found.append((f"{path}.{name}" if path else name, p.numel()))
        for name, child in module.named_children():
            visit(child, f"{path}.{name}" if path else name)

    visit(model, "")
    return found


def describe_frozen(model: nn.Module) -> str | None:
    """One line naming the frozen parts (numbered siblings as one ``.*`` entry), or None when nothing is
    frozen."""
    parts = frozen_parts(model)
    if not parts:
        return None
    grouped: dict[str, list[tuple[str, int]]] = {}
    for path, count in parts:
        grouped.setdefault(_INDEX.sub(".*", path), []).append((path, count))
    entries = [
        f"{members[0][0]} ({members[0][1]:,} params)"
        if len(members) == 1
        else f"{pattern} x{len(members)} ({sum(c for _, c in members):,} params)"
        for pattern, members in grouped.items()
    ]
    total = sum(count for _, count in parts)
    return (
        f"Frozen: {total:,} params, held (sharded with their units when sharded) with no grads and no "
        f"optimizer state: {', '.join(entries)}"
    )
