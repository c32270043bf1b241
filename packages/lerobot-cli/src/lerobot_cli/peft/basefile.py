"""What a PEFT run's files say, read without torch or peft (the CLI checks them before starting).

A PEFT ``pretrained_model/`` is recognised by ``adapter_config.json``, and its base policy is the
path that file records in ``base_model_name_or_path``. The base's storage dtype decides whether
mixed precision is required; it is read from the safetensors header alone
(``lerobot_ckpt.pretrained.stored_float_dtype``), so the check costs no tensor reads and happens
before any process group exists.
"""

from __future__ import annotations

import re
from pathlib import Path

from lerobot_ckpt.layout import ADAPTER_CONFIG

from lerobot_cli.peft.adapterfile import read_adapter_config
from lerobot_cli.peft.errors import BASE_KEY, PeftSetupError  # PeftSetupError's users import it from here

_HF_CACHE_SNAPSHOT = re.compile(r"models--(?P<owner>[^/]+?)--(?P<name>[^/]+)/snapshots/[^/]+/?$")


def is_adapter_dir(directory: str | Path) -> bool:
    return (Path(directory) / ADAPTER_CONFIG).is_file()


def recorded_base(directory: str | Path) -> str:
    """The base policy an adapter directory was trained on (local path or Hub repo id)."""
    # Every field's value is checked before the base is resolved (a download, maybe); the keys only a
    # load needs are required by the load.
    base = read_adapter_config(directory, complete=False).get(BASE_KEY)
    if base is None:
        raise PeftSetupError(
            f"{Path(directory) / ADAPTER_CONFIG} records no {BASE_KEY}: the base policy of this adapter is "
            "unknown"
        )
    return base


def resolve_recorded_base(directory: str | Path, resolve) -> Path:
    """The local directory of the base an adapter directory names (``resolve``: path or Hub id → dir)."""
    base = recorded_base(directory)
    try:
        return Path(resolve(base))
    except ValueError as exc:
        raise PeftSetupError(
            f"{Path(directory) / ADAPTER_CONFIG} names its base policy {base!r}, which cannot be "
            f"loaded: {exc}"
        ) from None


def base_reference(directory: str | Path) -> str:
    """How ``adapter_config.json`` names the base: the Hub repo id when the base came from the Hub
    cache (so the adapter loads on another machine), else the absolute local path."""
    resolved = Path(directory).expanduser().resolve()
    match = _HF_CACHE_SNAPSHOT.search(resolved.as_posix())
    if match:
        return f"{match['owner']}/{match['name']}"
    return str(resolved)


def check_base_precision(base_dtype: str, mixed_precision: str, source: str) -> None:
    """A low-precision base trains only under mixed precision: FSDP2 shards the trainable parameters
    of a unit together and needs them in one dtype (fp32 masters), which only autocast keeps fast."""
    if base_dtype in ("bfloat16", "float16") and mixed_precision == "no":
        flag = "bf16" if base_dtype == "bfloat16" else "fp16"
        raise PeftSetupError(
            f"the base policy {source} is stored in {base_dtype}: enable "
            f"--accelerator.mixed_precision={flag} so the frozen base keeps {base_dtype} while the adapters "
            f"and --peft.full_training_modules train in fp32"
        )
