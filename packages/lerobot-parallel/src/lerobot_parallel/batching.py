"""Effective-batch arithmetic (torch-free).

Every data-parallel worker draws its own micro-batch each loop step, so the number of samples
behind one optimizer update grows with both the dp world and gradient accumulation. Nothing
rescales the learning rate or the step count for it; the banner spells the product out so a
user who changes the topology sees what changed.
"""

from __future__ import annotations

from lerobot_parallel.validators import require_count as _positive


def effective_batch_size(batch_size: int, dp_world_size: int, grad_accum_steps: int = 1) -> int:
    """Samples per optimizer update: ``batch_size × dp_world_size × grad_accum_steps``."""
    return (
        _positive("batch_size", batch_size)
        * _positive("dp_world_size", dp_world_size)
        * _positive("grad_accum_steps", grad_accum_steps)
    )


def samples_per_loop_step(batch_size: int, dp_world_size: int) -> int:
    """Samples the whole cluster consumes per loop step (the unit a step count counts in)."""
    return _positive("batch_size", batch_size) * _positive("dp_world_size", dp_world_size)


def effective_batch_line(batch_size: int, dp_world_size: int, grad_accum_steps: int = 1) -> str:
    """The banner line, e.g. ``Effective batch size: 8 x 2 dp workers x 4 grad accum = 64``."""
    total = effective_batch_size(batch_size, dp_world_size, grad_accum_steps)
    return (
        f"Effective batch size: {batch_size} x {dp_world_size} dp workers x "
        f"{grad_accum_steps} grad accum = {total}"
    )
