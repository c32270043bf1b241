"""lerobot-cli's optional parts (its pip extras, where LeRobot makes them extras) and the one line a run
that needs a missing one stops with.

Checked with ``importlib.util.find_spec`` before the run starts (no heavy import at start-up): a pi0 run
without transformers would otherwise fail deep in the model build with a traceback naming a module,
not the extra that brings it. The workspace root installs every extra, so ``uv sync`` gives them all.
"""

from __future__ import annotations

import importlib.util

# extra -> the modules it brings (lerobot-cli's pyproject.toml [project.optional-dependencies]); a run
# needing the extra stops on the first one missing
EXTRAS: dict[str, tuple[str, ...]] = {
    "pi": ("transformers",),
    "peft": ("peft",),
    "trackio": ("trackio",),
    "wandb": ("wandb",),
    "fastwam": ("diffusers", "transformers"),  # the Wan2.2 VAE; the UMT5 text encoder and its tokenizer
    "pusht": ("gym_pusht", "pymunk"),  # --env.type=pusht: simulation evaluation in gym-pusht
}


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        return False


def missing_extra_message(extra: str, needed_by: str) -> str | None:
    """The line saying ``needed_by`` needs ``lerobot-cli[extra]``, or None when its modules are installed."""
    module = next((name for name in EXTRAS[extra] if not installed(name)), None)
    if module is None:
        return None
    return (
        f"{needed_by} needs lerobot-cli[{extra}] ({module} is not installed): pip install "
        f"'lerobot-cli[{extra}]' (in this repository: uv sync)"
    )
