"""A plain policy's ``pretrained_model/`` files: ``config.json`` + ``model.safetensors``, LeRobot's layout.

The weights file holds the plain ``state_dict`` (LeRobot's key names, no prefix), float tensors as they
are, one copy of each shared tensor (safetensors refuses aliases; tied names are restored on load).
``config.json`` is written through ``serialization``; "init-only" fields such as
``pretrained_backbone_weights`` are written as ``null`` because the weights they would initialise are in
``model.safetensors`` already (and a local path would not exist on the machine that loads the files).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import attrs
import torch
from lerobot_ckpt import pretrained_weights_file, read_tensors
from lerobot_ckpt.layout import MODEL_WEIGHTS
from safetensors.torch import save_file
from torch import Tensor, nn

from lerobot_cli.policies import registry
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.serialization import load_policy_config, save_policy_config

MODEL_NAME = MODEL_WEIGHTS  # LeRobot's name, spelled by lerobot_ckpt.layout
log = logging.getLogger(__name__)


def without_init_only_fields(config: PolicyConfig) -> PolicyConfig:
    """``config`` with its init-only fields cleared: what to build before loading saved weights."""
    names = [n for n in registry.spec_of(config).init_only_fields if getattr(config, n) is not None]
    return attrs.evolve(config, **{n: None for n in names}) if names else config


def build_policy(config: PolicyConfig) -> nn.Module:
    """Instantiate the module class that the registry names for ``config`` (fresh weights), then load the
    weights its ``initial_weights()`` names over them (FastWAM's base model). Those come from init-only
    fields, which every load of saved weights clears first, so a checkpoint's policy never reads them;
    a policy built on the meta device (``--dry_run``) reads no file."""
    policy = registry.policy_class(config)(config)
    if _on_meta(policy):  # shapes only: the hook is not even asked (it may look for files)
        return policy
    initial = config.initial_weights()
    if initial is not None and initial.directory is not None:
        load_initial_weights(
            policy, Path(initial.directory) / MODEL_NAME, adapt=registry.state_dict_adapter(config)
        )
    return policy


def _on_meta(module: nn.Module) -> bool:
    return any(t.device.type == "meta" for t in module.state_dict().values())


def _named(names: list[str], limit: int = 16) -> str:
    shown = ", ".join(names[:limit])
    return f"{shown}, and {len(names) - limit} more" if len(names) > limit else shown


def load_initial_weights(
    module: nn.Module, file: str | Path, *, strict: bool = False, adapt=None
) -> tuple[list[str], list[str]]:
    """Load the weights a fresh policy starts from (another policy's ``model.safetensors``: FastWAM's base
    model) over ``module``'s own, by name, with LeRobot's cross-embodiment rule (FastWAM's
    ``_load_as_safetensor``): a tensor whose shape differs from the module's (another action or state
    width) keeps its fresh initialisation, as does every tensor the file lacks, and one warning names them;
    ``strict`` refuses both instead (a ``ValueError`` naming them). The file's tensors the module lacks
    are ignored. Returns ``(other_shapes, missing)``, the names kept fresh."""
    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"no weights file at {file}")
    state, _ = read_tensors(file)  # a truncated or absurd file: one sentence naming it
    if adapt is not None:
        state = adapt(module, state)
    own = module.state_dict()
    other_shapes = sorted(k for k, t in state.items() if k in own and tuple(own[k].shape) != tuple(t.shape))
    if strict and other_shapes:
        raise ValueError(
            f"{file}: {len(other_shapes)} tensors have other shapes than {type(module).__name__}'s "
            f"(strict load): {_named(other_shapes)}"
        )
    for name in other_shapes:
        del state[name]
    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a shape mismatch under a name only the module's own load hooks know
        raise ValueError(f"{file} does not fit {type(module).__name__}: {str(exc).splitlines()[0]}") from None
    loaded_storages = {_storage_key(own[k]) for k in state if k in own}
    missing = sorted(k for k in result.missing_keys if _storage_key(own[k]) not in loaded_storages)
    if strict and (missing or result.unexpected_keys):
        raise ValueError(
            f"{file} does not fit {type(module).__name__} (strict load): {len(missing)} missing keys "
            f"{missing[:8]}, {len(result.unexpected_keys)} unexpected keys {result.unexpected_keys[:8]}"
        )
    parts = []
    if other_shapes:
        parts.append(
            f"{len(other_shapes)} tensors of other shapes (another action or state width) keep their fresh "
            f"initialisation: {_named(other_shapes)}"
        )
    if missing:
        parts.append(
            f"{len(missing)} tensors the file lacks keep their fresh initialisation: {_named(missing)}"
        )
    if result.unexpected_keys:
        parts.append(f"{len(result.unexpected_keys)} tensors of the file the policy lacks ignored")
    if parts:
        log.warning("initial weights from %s, every other tensor loaded; %s", file, "; ".join(parts))
    return other_shapes, missing


def _storage_key(t: Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def dedupe_shared_tensors(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Keep one name per set of identical aliases (the lexicographically first, as safetensors does);
    give partially overlapping views their own copy so the file can hold them."""
    groups: dict[tuple[str, int], list[str]] = defaultdict(list)
    for name, tensor in state_dict.items():
        if tensor.numel() and tensor.device.type != "meta":
            groups[_storage_key(tensor)].append(name)
    out = dict(state_dict)
    for names in groups.values():
        if len(names) < 2:
            continue
        names.sort()
        first = state_dict[names[0]]
        for name in names[1:]:
            t = state_dict[name]
            same_view = (t.storage_offset(), t.shape, t.stride()) == (
                first.storage_offset(),
                first.shape,
                first.stride(),
            )
            if same_view:
                del out[name]
            else:
                out[name] = t.clone()
    return out


def save_state_dict(state_dict: Mapping[str, Tensor], file: str | Path) -> Path:
    """Write a state dict as safetensors (CPU, contiguous, shared tensors stored once)."""
    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in dedupe_shared_tensors(state_dict).items()}
    save_file(tensors, str(file), metadata={"format": "pt"})
    return file


def load_weights(module: nn.Module, file: str | Path, *, strict: bool = True, adapt=None) -> None:
    """Load ``file`` into ``module``; names missing only because they alias a loaded tensor are fine.
    ``adapt(module, state) -> state``: the policy spec's ``state_dict_adapter`` (a file in another layout)."""
    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"no weights file at {file}")
    # A truncated file or an absurd header is the one sentence a resume gives for its weights (naming the
    # file), not safetensors' traceback; tied names come back as the shared tensor they alias.
    state, _ = read_tensors(file)
    if adapt is not None:
        state = adapt(module, state)
    result = module.load_state_dict(state, strict=False)
    own = module.state_dict()
    loaded_storages = {_storage_key(own[k]) for k in state if k in own}
    missing = [k for k in result.missing_keys if _storage_key(own[k]) not in loaded_storages]
    if strict and (missing or result.unexpected_keys):
        raise ValueError(
            f"{file} does not fit {type(module).__name__}: {len(missing)} missing keys {missing[:8]}, "
            f"{len(result.unexpected_keys)} unexpected keys {result.unexpected_keys[:8]}"
        )


def save_pretrained(
    policy: nn.Module | None,
    config: PolicyConfig,
    directory: str | Path,
    *,
    state_dict: Mapping[str, Tensor] | None = None,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into ``directory`` and return it.

    ``state_dict`` replaces ``policy.state_dict()`` when given (e.g. a full state gathered from FSDP
    shards on the main rank); then ``policy`` may be None.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if state_dict is None:
        if policy is None:
            raise ValueError("save_pretrained needs a policy or a state_dict")
        state_dict = policy.state_dict()
    save_policy_config(without_init_only_fields(config), directory)
    save_state_dict(state_dict, directory / MODEL_NAME)
    return directory


def load_policy(
    directory: str | Path,
    *,
    config: PolicyConfig | None = None,
    device: str | torch.device = "cpu",
    strict: bool = True,
) -> tuple[PolicyConfig, nn.Module]:
    """Build the (non-PEFT) policy saved in ``directory`` and load its weights; eval mode.

    ``config`` overrides the directory's ``config.json`` (e.g. with CLI flags applied).
    """
    config = without_init_only_fields(config if config is not None else load_policy_config(directory))
    policy = build_policy(config)
    load_weights(
        policy, pretrained_weights_file(directory), strict=strict, adapt=registry.state_dict_adapter(config)
    )
    return config, policy.to(device).eval()
