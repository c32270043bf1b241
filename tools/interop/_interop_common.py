"""What several LeRobot interop drivers share (imported as a sibling module: both interpreters run a driver
as a script, which puts tools/interop/ first on ``sys.path``). Needs torch and safetensors only, so it
imports in our environment and in LeRobot's alike."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file


def load_inputs(file: Path) -> dict[str, torch.Tensor]:
    """The inputs file as fresh tensors: ``load_file``'s tensors can sit at addresses CPU kernels split
    differently into vector lanes than a fresh allocation's, which moves the last bit of some reductions."""
    return {key: value.clone() for key, value in load_file(str(file)).items()}


def perturb_constants(module: torch.nn.Module, seed: int) -> None:
    """Random values for parameters built constant (norm scales, zero biases, a zero head), which would hide
    a dropped bias or a norm scale applied twice."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(module.named_parameters()):
            if param.numel() == 1 or bool((param == param.flatten()[0]).all()):
                param.add_(0.1 * torch.randn(param.shape, generator=g))


def compare_exact(
    tag: str,
    ref: dict[str, torch.Tensor],
    got: dict[str, torch.Tensor],
    groups: dict[str, str],
    print_mismatches: bool,
) -> tuple[bool, dict]:
    """Exact equality of every reference tensor (same keys, shapes, dtypes, values). Figures: max |Δ| per
    key, except keys starting with a prefix of ``groups`` (prefix -> name), reported as one max |Δ| per
    group under its name. ``print_mismatches``: print each unequal key's max |Δ| too."""
    ok, figures, grouped = True, {}, dict.fromkeys(groups.values(), 0.0)
    if set(ref) != set(got):
        print(
            f"[{tag}] different outputs: only in the reference {sorted(set(ref) - set(got))[:5]}, only "
            f"computed {sorted(set(got) - set(ref))[:5]}"
        )
        ok = False
    for key in sorted(set(ref) & set(got)):
        a, b = ref[key], got[key]
        if a.shape != b.shape or a.dtype != b.dtype:
            print(f"[{tag}] {key}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
            ok = False
            continue
        diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        group = next((name for prefix, name in groups.items() if key.startswith(prefix)), None)
        if group:
            grouped[group] = max(grouped[group], diff)
        else:
            figures[key] = diff
        if not torch.equal(a, b):
            if print_mismatches:
                print(f"[{tag}] {key}: max |Δ| {diff:.3e}")
            ok = False
    figures.update(grouped)
    return ok, figures
