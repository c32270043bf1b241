"""LoRA through the ``peft`` library: wrap a base policy, name the adapter's files, load it back.

peft does the adapting (``get_peft_model``, ``get_peft_model_state_dict``, ``PeftModel.from_pretrained``);
this module only decides what LeRobot users expect around it: the policy's default target modules,
the base recorded in ``adapter_config.json`` (a Hub id or an absolute path, so the adapter can be
loaded elsewhere), and dtypes. peft upcasts its adapters to fp32 but leaves the copies of
``modules_to_save`` in the base's dtype; FSDP2 shards a unit's trainable parameters together and
needs them in one dtype, so under mixed precision every trainable parameter becomes an fp32 master
while the frozen base keeps its stored dtype (bf16/fp16 halves its memory).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lerobot_ckpt.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from lerobot_ckpt.pretrained import pretrained_weights_file, stored_float_dtype
from lerobot_parallel.sharding import upcast_trainable
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from torch import nn

from lerobot_cli.peft.adapterfile import AdapterConfigError, read_adapter_config
from lerobot_cli.peft.basefile import (
    PeftSetupError,
    base_reference,
    check_base_precision,
    resolve_recorded_base,
)
from lerobot_cli.peft.config import PeftConfig
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.location import own_file
from lerobot_cli.policies.registry import spec_of
from lerobot_cli.policies.weights import load_policy

ADAPTER_NAME = "default"


def base_policy(model: nn.Module) -> nn.Module:
    """The policy under a PEFT wrapper (the model itself otherwise)."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


def default_target_modules(config: PolicyConfig) -> str | list[str]:
    """The policy type's default ``--peft.target_modules`` (its spec's ``peft_targets``)."""
    targets = spec_of(config).peft_targets
    if not targets:
        raise PeftSetupError(
            f"--policy.type={config.type} declares no default LoRA targets: pass --peft.target_modules "
            f"(module names or one regex matched against names like 'model.encoder.layers.0.linear1')"
        )
    return targets if isinstance(targets, str) else list(targets)


def lora_config(cfg: PeftConfig, policy_config: PolicyConfig) -> LoraConfig:
    targets: str | list[str]
    if cfg.target_modules is None:
        targets = default_target_modules(policy_config)
    elif len(cfg.target_modules) == 1:
        targets = cfg.target_modules[0]  # one string: peft reads it as a regex (fullmatch)
    else:
        targets = list(cfg.target_modules)
    init: bool | str = (
        True
        if cfg.init_type is None
        else {"true": True, "false": False}.get(cfg.init_type.lower(), cfg.init_type)
    )
    try:
        return LoraConfig(
            r=cfg.r,
            lora_alpha=cfg.r if cfg.lora_alpha is None else cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=targets,
            init_lora_weights=init,
            modules_to_save=list(cfg.full_training_modules) if cfg.full_training_modules else None,
        )
    except (ValueError, TypeError) as exc:
        raise PeftSetupError(f"--peft: {exc}") from None


def _matching_dtype(policy: nn.Module, base_dtype: str, mixed_precision: str, source: str) -> nn.Module:
    check_base_precision(base_dtype, mixed_precision, source)
    dtype = getattr(torch, base_dtype)
    return policy if dtype == torch.float32 else policy.to(dtype)


def wrap_with_peft(policy: nn.Module, cfg: PeftConfig, *, base_dir: Path, mixed_precision: str) -> PeftModel:
    """``policy`` (loaded from ``base_dir``, in fp32) with LoRA adapters;
    the base frozen in its stored dtype."""
    source = str(base_dir)
    config = lora_config(cfg, policy.config)  # a policy keeps the config it was built from (LeRobot's too)
    policy = _matching_dtype(
        policy, stored_float_dtype(pretrained_weights_file(base_dir)), mixed_precision, source
    )
    try:
        model = get_peft_model(policy, config, adapter_name=ADAPTER_NAME)
    except (
        ValueError
    ) as exc:  # e.g. target modules that match nothing: peft's message lists what it looked for
        raise PeftSetupError(f"--peft.target_modules: {str(exc).splitlines()[0]}") from None
    model.peft_config[ADAPTER_NAME].base_model_name_or_path = base_reference(base_dir)
    if mixed_precision != "no":
        upcast_trainable(model)
    return model


def adapter_state(model: nn.Module) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """``lerobot_ckpt``'s ``adapter_state=``: select and rename a state dict (any topology) the way
    peft names ``adapter_model.safetensors``; the values stay the live tensors, so loads are in place."""
    peft_model = model if isinstance(model, PeftModel) else None
    if peft_model is None:
        raise TypeError(f"adapter_state needs a PeftModel, got {type(model).__name__}")
    return lambda state: get_peft_model_state_dict(
        peft_model, state_dict=state, adapter_name=ADAPTER_NAME, save_embedding_layers=False
    )


def save_adapter_config(model: PeftModel, directory: Path) -> None:
    model.peft_config[ADAPTER_NAME].save_pretrained(str(directory))


_FLOATS = ("F64", "F32", "F16", "BF16")
_MAX_HEADER = 100 << 20  # a LoRA adapter's header is kilobytes; a larger length is a damaged file


def _refuse_non_float_tensors(file: Path) -> None:
    """LoRA weights are floats: a tensor stored as an integer (peft would cast it silently) is refused
    in one line naming the file and the tensor, from the header alone (no tensor is read)."""
    try:
        with file.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > _MAX_HEADER:
                raise ValueError(f"a header of {length} bytes")
            header = json.loads(f.read(length))
        entries = {k: v.get("dtype") for k, v in header.items() if k != "__metadata__"}
    except (OSError, struct.error, ValueError, AttributeError) as exc:
        raise AdapterConfigError(f"{file} is not a readable safetensors file ({exc})") from None
    for name, dtype in entries.items():
        if dtype not in _FLOATS:
            raise AdapterConfigError(
                f"{file}: tensor {name} is stored as {dtype}, not a float type; LoRA weights are floats, "
                "and casting it would change its values: use an adapter saved by peft"
            )


def checked_lora_config(directory: Path) -> LoraConfig:
    """The adapter's ``LoraConfig`` from its checked fields (:mod:`lerobot_cli.peft.adapterfile`), after
    checking that its weights are the directory's own ``adapter_model.safetensors`` (peft falls back to
    a pickled ``adapter_model.bin`` when that is missing)."""
    file = own_file(directory, ADAPTER_WEIGHTS)
    if not file.is_file():
        raise PeftSetupError(f"{file} is missing: the adapter's weights must be {ADAPTER_WEIGHTS}")
    _refuse_non_float_tensors(file)
    fields = read_adapter_config(directory)
    try:
        return LoraConfig.from_peft_type(**fields)
    except (TypeError, ValueError) as exc:
        raise AdapterConfigError(
            f"{directory / ADAPTER_CONFIG}: {str(exc).splitlines()[0] if str(exc) else exc!r}"
        ) from None


def load_adapter_policy(
    directory: Path,
    *,
    config=None,
    trainable: bool = False,
    mixed_precision: str = "no",
    resolve_base: Callable[[str], Path] | None = None,
):
    """``(policy config, PeftModel)`` for an adapter directory: its recorded base, then the adapter.

    ``config`` overrides the directory's ``config.json`` as in ``load_policy``;
    ``resolve_base`` maps the recorded base (path or Hub id) to a local directory (default: the way
    ``--policy.path`` is resolved, Hub download included). For inference
    (``trainable=False``) everything is fp32, like any loaded policy.
    """
    pretrained_weights_file(directory)  # a dcp-only checkpoint: one sentence saying to convert it first
    if resolve_base is None:
        from lerobot_cli.policies.location import resolve_policy_dir as resolve_base
    base_dir = resolve_recorded_base(directory, resolve_base)
    config, policy = load_policy(base_dir, config=config)  # fp32, as for any pretrained policy
    if trainable:  # training keeps the frozen base in its stored dtype, as wrap_with_peft does
        policy = _matching_dtype(
            policy, stored_float_dtype(pretrained_weights_file(base_dir)), mixed_precision, str(base_dir)
        )
    lora = checked_lora_config(directory)  # peft never reads the file itself
    try:
        model = PeftModel.from_pretrained(
            policy,
            str(directory),
            adapter_name=ADAPTER_NAME,
            is_trainable=trainable,
            autocast_adapter_dtype=True,
            config=lora,
        )
    except (ValueError, RuntimeError, KeyError) as exc:  # targets peft cannot adapt, weights of other shapes
        detail = " ".join(str(exc).split()) or type(exc).__name__
        if len(detail) > 300:
            detail = detail[:300] + " …"
        raise AdapterConfigError(
            f"{directory}: the adapter does not fit its base policy {base_dir}: {detail}"
        ) from None
    if trainable and mixed_precision != "no":
        upcast_trainable(model)
    return config, (model.train() if trainable else model.eval())
