"""The batch-size check that needs the dataset: one global batch must fit in one epoch.

The sampler (``lerobot_trainloop.sampler.ShardedBatchSampler``) refuses the same case, but in its
own terms; this check runs first so the user reads the flags to change, before the model is wrapped.
"""

from __future__ import annotations

from collections.abc import Sequence

from lerobot_cli.cli.errors import UsageError


def check_batch_fits(
    batch_size: int, dp_world_size: int, frames: int, episodes: Sequence[int] | None
) -> None:
    """Raise :class:`UsageError` when ``batch_size × dp_world_size`` exceeds the ``frames`` trained on.

    ``episodes``: the ``--dataset.episodes`` selection (None for all), named in the message because a
    small selection, not the dataset, is then what is too small.
    """
    global_batch = batch_size * dp_world_size
    if global_batch <= frames:
        return
    where = f"{frames} frames" + (
        f" in the {len(episodes)} episode(s) of --dataset.episodes" if episodes else ""
    )
    fixes = [f"lower --batch_size to at most {frames // dp_world_size}"] if frames >= dp_world_size else []
    if dp_world_size > 1:
        fixes.append("launch fewer processes")
    if episodes:
        fixes.append("select more episodes")
    raise UsageError(
        f"--batch_size={batch_size} x {dp_world_size} dp workers = {global_batch} samples is larger "
        f"than the dataset ({where}); {', or '.join(fixes)}"
    )
