"""FastWAM's base model: the weights a fresh policy starts from (``base_model_id``), found offline.

Torch-free; reads a ``FastWAMConfig`` without importing it (the config imports this module).

LeRobot 0.6.1 sets ``pretrained_path`` to ``base_model_id`` (``lerobot/fastwam_base``) when a config has no
``pretrained_path``, is no PEFT run, and its networks are the base's size
(``is_fastwam_base_compatible_config``: the compatibility keys of both DiT configs equal the default
full-size ones; ``action_dim`` is not among them). Its ``from_pretrained`` then loads the base's
``model.safetensors`` over the fresh policy with ``strict=False``, where FastWAM's ``_load_as_safetensor``
leaves every tensor whose shape differs (another embodiment's action or state width: the action encoder and
head, the proprio encoder) at its fresh initialisation, with a warning naming them. A config whose sizes
differ starts from random weights, silently.

Here the same, with two choices of ours:

- **which sizes the base has.** For a Hub id the reference is LeRobot's: the default full-size DiT configs
  (``lerobot/fastwam_base`` is that size), decided before the cache is looked at, so a config of other sizes
  (the tiny variant) never needs the base at all. For a local directory the reference is the base's own
  ``config.json`` (its ``video_dit_config`` / ``action_dit_config``) when it has one, else the defaults: a
  base of another size (a tiny one in tests, one of your own) is judged by what it is. For
  ``lerobot/fastwam_base`` both give LeRobot's answer.
- **where it comes from.** A local directory, or the repo's snapshot in the Hugging Face cache, never a
  download (``local_files_only``); it must hold ``model.safetensors``. Otherwise one line naming
  ``--policy.base_model_id`` and ``hf download``, before any work (``PolicyConfig.external_sources``).

The run's banner says which (``PolicyConfig.initial_weights``): the base loaded, or why none was. The
processors are the run's own (the dataset's statistics), where LeRobot also takes the base's processor files
(with the dataset's statistics written over them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lerobot_cli.policies.config import InitialWeights, Source

FLAG = "--policy.base_model_id"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"

# The network sizes that decide whether the base's weights fit (LeRobot's compatibility keys).
VIDEO_KEYS = (
    "patch_size",
    "in_dim",
    "hidden_dim",
    "ffn_dim",
    "freq_dim",
    "text_dim",
    "out_dim",
    "num_heads",
    "attn_head_dim",
    "num_layers",
)
ACTION_KEYS = ("hidden_dim", "ffn_dim", "num_heads", "attn_head_dim", "num_layers", "text_dim", "freq_dim")


class BaseModelUnavailable(ValueError):
    """``base_model_id`` names weights that are neither a local directory nor in the Hugging Face cache."""


def _is_local_path(value: str) -> bool:
    """LeRobot's reading of a model id as a local path: absolute, ``./``, ``../``, ``~`` or existing."""
    path = Path(value)
    return path.expanduser().is_absolute() or value.startswith(("./", "../", "~")) or path.exists()


def _saved_networks(directory: Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The DiT configs of a base directory's ``config.json``; None without them (a bare weights folder)."""
    file = directory / CONFIG
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise BaseModelUnavailable(
            f"{FLAG}={directory}: its {CONFIG} is not readable JSON; give the directory of a FastWAM "
            "pretrained_model/, a Hub repo in the HF cache, or null"
        ) from None
    video = data.get("video_dit_config") if isinstance(data, dict) else None
    action = data.get("action_dit_config") if isinstance(data, dict) else None
    return (video, action) if isinstance(video, dict) and isinstance(action, dict) else None


def reference_networks(config) -> tuple[dict[str, Any], dict[str, Any], str]:
    """``(video_dit_config, action_dit_config, what they are)`` the base's weights were made for."""
    name = config.base_model_id
    directory = Path(name).expanduser()
    if directory.is_dir():
        saved = _saved_networks(directory)
        if saved is not None:
            return saved[0], saved[1], f"the base's own {directory / CONFIG}"
    video, action = config.full_size_networks()
    return video, action, "the base's full-size networks (LeRobot's default DiT configs)"


def size_difference(config) -> str | None:
    """The first network size in which ``config`` differs from its base (None: the base fits), e.g.
    ``video_dit_config.hidden_dim 32, not 3072 as in the base's full-size networks (...)``."""
    video, action, what = reference_networks(config)
    for flag, ours, theirs, keys in (
        ("video_dit_config", config.video_dit_config, video, VIDEO_KEYS),
        ("action_dit_config", config.action_dit_config, action, ACTION_KEYS),
    ):
        for key in keys:
            if _same(ours.get(key), theirs.get(key)):
                continue
            return f"--policy.{flag}.{key} is {ours.get(key)!r}, not {theirs.get(key)!r} as in {what}"
    return None


def _same(a: Any, b: Any) -> bool:
    """Equal, reading a JSON list and a tuple alike (``patch_size``)."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return list(a) == list(b)
    return a == b


def wants_base(config) -> bool:
    """Whether LeRobot would start this config from ``base_model_id`` (before asking whether it fits)."""
    return not (config.pretrained_path or config.use_peft or not config.base_model_id)


def resolve_base_model(config) -> Path | None:
    """The directory a fresh policy initialises from, or None when none is loaded (weights from
    ``--policy.path``, a PEFT run, ``base_model_id=null``, or network sizes other than the base's).

    Offline by design: a local directory, else the repo's snapshot in the Hugging Face cache, holding
    ``model.safetensors``; otherwise :class:`BaseModelUnavailable` in one line."""
    if not wants_base(config) or size_difference(config) is not None:
        return None
    name = config.base_model_id
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / WEIGHTS).is_file():
            raise BaseModelUnavailable(
                f"{FLAG}={name}: no {WEIGHTS} in that directory; give the directory of a FastWAM "
                "pretrained_model/, a Hub repo in the HF cache, or null"
            )
        return path
    if path.exists() or _is_local_path(name):
        raise BaseModelUnavailable(
            f"{FLAG}={name}: no directory there; give the directory of a FastWAM pretrained_model/, a Hub "
            "repo in the HF cache, or null"
        )
    from huggingface_hub import constants, snapshot_download

    try:
        snapshot = Path(snapshot_download(repo_id=name, repo_type="model", local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached / bad repo id / broken cache: one line, with what to do
        snapshot = None
    if snapshot is None or not (snapshot / WEIGHTS).is_file():
        raise BaseModelUnavailable(
            f"{FLAG}={name} is neither a local directory nor in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}): download it once with network access (`hf download {name}`), or "
            f"pass {FLAG}=null to start from random weights"
        )
    return snapshot


def base_model_source(config) -> Source | None:
    """The base as an external source, checked before any work; None when no base is loaded."""
    if not wants_base(config) or size_difference(config) is not None:
        return None
    return Source(FLAG, config.base_model_id, lambda: resolve_base_model(config))


def initial_weights(config) -> InitialWeights | None:
    """What a fresh policy's weights start from (the banner's line); None when its weights come from
    ``--policy.path`` or a PEFT base."""
    if config.pretrained_path or config.use_peft:
        return None
    if not config.base_model_id:
        return InitialWeights(f"as initialised ({FLAG}=null)")
    difference = size_difference(config)
    if difference is not None:
        return InitialWeights(
            f"as initialised: {FLAG}={config.base_model_id} is not loaded because {difference} (LeRobot "
            "loads a base only into networks of its size)"
        )
    directory = resolve_base_model(config)
    return InitialWeights(
        f"{FLAG}={config.base_model_id} ({directory / WEIGHTS}) over the fresh policy, by name; tensors of "
        "other shapes (another action or state width) keep their fresh initialisation (LeRobot's rule)",
        directory,
    )
