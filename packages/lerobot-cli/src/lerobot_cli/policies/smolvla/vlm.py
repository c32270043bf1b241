"""Where SmolVLA's VLM comes from: ``vlm_model_name``'s ``config.json``, from a local directory or the
Hugging Face cache, never downloaded by a run.

LeRobot builds the VLM with ``AutoConfig.from_pretrained(vlm_model_name)`` (and loads its processor), which
reaches the Hub for a Hub id that is not cached. Here a Hub id is looked up in the cache only; one that is
not there stops the run at start-up in one line naming the ``hf download`` command that fetches it. The
files needed are ``config.json`` and the tokenizer the pre-processor loads, and, for a fresh policy with
``load_vlm_weights=true``, the weights (``vlm_weights.py``, from the same directory).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from lerobot_cli.policies.config import Source

FLAG = "--policy.vlm_model_name"


class VLMUnavailableError(ValueError):
    """``vlm_model_name`` names no readable SmolVLM ``config.json``."""


def vlm_directory(name: str) -> Path:
    """The directory holding ``name``'s ``config.json``: ``name`` itself when it is a local directory, else
    its snapshot in the Hugging Face cache; a :class:`VLMUnavailableError` in one line otherwise."""
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        raise VLMUnavailableError(
            f"{FLAG}={name}: the directory has no config.json (a SmolVLM's, as save_pretrained writes it)"
        )
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        found = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a valid repo id
        found = None
    if isinstance(found, str):
        return Path(found).parent
    raise VLMUnavailableError(
        f"{FLAG}={name} is neither a local directory nor in the Hugging Face cache "
        f"({constants.HF_HUB_CACHE}); "
        f"download it once with network access: `hf download {name}` (or "
        f"`huggingface-cli download {name}`), or set {FLAG} to a local SmolVLM directory"
    )


def vlm_config_source(name: str) -> Source:
    return Source(FLAG, name, resolve=partial(vlm_directory, name))


def load_vlm_config(name: str):
    """``transformers.SmolVLMConfig`` of ``name`` (see :func:`vlm_directory`), read offline."""
    from transformers import AutoConfig, SmolVLMConfig

    directory = vlm_directory(name)
    config = AutoConfig.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    if not isinstance(config, SmolVLMConfig):
        raise VLMUnavailableError(
            f"{FLAG}={name}: its config.json is a {type(config).__name__} (model_type "
            f"{getattr(config, 'model_type', '?')!r}), not a SmolVLM (model_type 'smolvlm')"
        )
    return config
