"""A plain policy's ``pretrained_model/`` files: ``config.json`` + ``model.safetensors``, LeRobot's layout.

The weights file holds the plain ``state_dict`` (LeRobot's key names, no prefix), float tensors as they
are, one copy of each shared tensor (safetensors refuses aliases; tied names are restored on load).
``config.json`` is written through ``serialization``; "init-only" fields such as
``pretrained_backbone_weights`` are written as ``null`` because the weights they would initialise are in
``model.safetensors`` already (and a local path would not exist on the machine that loads the files).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import attrs
import torch
from lerobot_ckpt import pretrained_weights_file, read_tensors
from lerobot_ckpt.errors import CheckpointError, ModelMismatchError
from lerobot_ckpt.layout import MODEL_WEIGHTS, POLICY_CONFIG
from lerobot_ckpt.state.model import few
from safetensors.torch import save_file
from torch import Tensor, nn

from lerobot_cli.policies import registry
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.location import own_file
from lerobot_cli.policies.serialization import load_policy_config, save_policy_config

MODEL_NAME = MODEL_WEIGHTS  # LeRobot's name, spelled by lerobot_ckpt.layout
log = logging.getLogger(__name__)


def without_init_only_fields(config: PolicyConfig) -> PolicyConfig:
    """``config`` with its init-only fields cleared: what to build before loading saved weights."""
    names = [n for n in registry.spec_of(config).init_only_fields if getattr(config, n) is not None]
    return attrs.evolve(config, **{n: None for n in names}) if names else config


def build_policy(config: PolicyConfig, *, initialise: bool = True) -> nn.Module:
    """Instantiate the module class that the registry names for ``config`` (fresh weights), then load the
    weights its ``initial_weights()`` names over them (FastWAM's base model, SmolVLA's VLM). Those come
    from init-only fields, which every load of saved weights clears first, or (``initialise=False``, what
    a load of saved weights passes) are not asked for at all, so a checkpoint's policy never reads them;
    a policy built on the meta device (``--dry_run``) reads no file."""
    policy = registry.policy_class(config)(config)
    if _on_meta(policy) or not initialise:  # the hook is not even asked (it may look for files)
        return policy
    initial = config.initial_weights()
    if initial is not None and initial.load is not None:
        initial.load(policy)
    elif initial is not None and initial.directory is not None:
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


def check_dtypes(file: Path, state: Mapping[str, Tensor], own: Mapping[str, Tensor]) -> None:
    """Refuse a tensor whose kind differs from the policy's (an integer where it holds a float, or
    the reverse: ``load_state_dict`` would cast it silently, so a crafted or mis-converted file would
    load as garbage), in one line naming the file and the tensor; say in one warning when floats are
    converted (an fp16 file into an fp32 policy keeps fp16's precision)."""
    converted = []
    for name, tensor in state.items():
        mine = own.get(name)
        if mine is None or tensor.dtype == mine.dtype:
            continue
        if tensor.is_floating_point() and mine.is_floating_point():
            converted.append(name)
            continue
        raise ModelMismatchError(
            f"{file}: tensor {name} is stored as {str(tensor.dtype).removeprefix('torch.')} where the "
            f"policy holds {str(mine.dtype).removeprefix('torch.')}; it is not loaded, since casting it "
            "would change its values: use weights saved from this policy"
        )
    if converted:
        kinds = sorted({f"{state[n].dtype} to {own[n].dtype}".replace("torch.", "") for n in converted})
        log.warning(
            "%s: %d tensors are stored in another float type than the policy holds (%s), converted on "
            "load (e.g. %s); an upcast keeps the stored precision",
            file,
            len(converted),
            ", ".join(kinds),
            converted[0],
        )


def load_weights(module: nn.Module, file: str | Path, *, strict: bool = True, adapt=None) -> None:
    """Load ``file`` into ``module``; names missing only because they alias a loaded tensor are fine.
    ``adapt(module, state) -> state``: the policy spec's ``state_dict_adapter`` (a file in another layout).

    A file that does not fit (other names or shapes, an integer tensor where the policy holds a float)
    is a :class:`ModelMismatchError` in one line, the resume's own sentence, so the CLI prints it for a
    ``--policy.path`` too (a ``config.json`` whose ``type`` is not the weights' policy ends here)."""
    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"no weights file at {file}")
    # A truncated file or an absurd header is the one sentence a resume gives for its weights (naming the
    # file), not safetensors' traceback; tied names come back as the shared tensor they alias.
    state, _ = read_tensors(file)
    if adapt is not None:
        state = adapt(module, state)
    own = module.state_dict()
    shapes = [
        f"{k} (checkpoint {tuple(t.shape)}, model {tuple(own[k].shape)})"
        for k, t in sorted(state.items())
        if k in own and tuple(t.shape) != tuple(own[k].shape)
    ]
    if shapes:
        raise ModelMismatchError(
            f"{file} does not match the model ({type(module).__name__}): {len(shapes)} with another shape: "
            f"{few(shapes)}"
        )
    check_dtypes(file, state, own)
    result = module.load_state_dict(state, strict=False)
    loaded_storages = {_storage_key(own[k]) for k in state if k in own}
    missing = [k for k in result.missing_keys if _storage_key(own[k]) not in loaded_storages]
    if strict and (missing or result.unexpected_keys):
        parts = [f"{len(missing)} missing from the checkpoint: {few(missing)}"] if missing else []
        if result.unexpected_keys:
            parts.append(f"{len(result.unexpected_keys)} not in the model: {few(result.unexpected_keys)}")
        raise ModelMismatchError(
            f"{file} does not match the model ({type(module).__name__}): {'; '.join(parts)}"
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


class PolicyTooLargeError(CheckpointError):
    """A config whose policy cannot be built, or would not fit in this machine's memory (checked on the
    meta device)."""


def _memory_bytes(device: str | torch.device) -> tuple[int, str]:
    """This machine's memory for a policy on ``device``: host RAM, or the accelerator's own memory."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.get_device_properties(index).total_memory, f"{device}'s memory"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "RAM"


def _changed_sizes(config: PolicyConfig) -> str:
    """The integer fields ``config`` sets away from its class's defaults (where absurd sizes come from)."""
    changed = []
    for f in attrs.fields(type(config)):
        value = getattr(config, f.name)
        default = f.default if not isinstance(f.default, attrs.Factory) else None  # type: ignore[arg-type]
        if isinstance(value, int) and not isinstance(value, bool) and value != default:
            changed.append(f"{f.name}={value}")
    return ", ".join(changed[:8]) or "none of its integer fields differ from the defaults"


def check_fits_memory(config: PolicyConfig, named_by: Path, device: str | torch.device = "cpu") -> nn.Module:
    """The policy ``config`` builds, on the meta device (shapes only, no memory), after checking that
    its parameters and buffers fit this machine's memory (host RAM; the accelerator's for a policy
    loaded onto one). A ``config.json`` someone sent chooses every size: one whose policy would need
    terabytes is refused in one line naming the file and its sizes, instead of an allocator traceback
    (or the machine swapping) while the policy is built."""
    try:
        with torch.device("meta"):
            policy = registry.policy_class(config)(config)
    except (RuntimeError, ValueError, TypeError, OverflowError) as exc:  # a negative size, say
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise PolicyTooLargeError(
            f"{named_by}: this config cannot build a {config.type} policy ({detail}; sizes set: "
            f"{_changed_sizes(config)}); use a config.json saved with its weights"
        ) from None
    tensors = {id(t): t for t in (*policy.parameters(), *policy.buffers())}.values()
    needed = sum(t.numel() * t.element_size() for t in tensors)
    have, where = _memory_bytes(device)
    if needed > have:  # a --dry_run too: it plans the real run
        raise PolicyTooLargeError(
            f"{named_by}: this config builds a {config.type} policy of {needed / 2**30:,.1f} GiB of "
            f"parameters and buffers, more than this machine's {have / 2**30:,.1f} GiB of {where} "
            f"(sizes set: {_changed_sizes(config)}); use a config.json saved with its weights"
        )
    return policy


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
    weights = pretrained_weights_file(directory)
    own_file(weights.parent, weights.name)  # the directory's own file, not a symlink out of it
    policy = check_fits_memory(config, Path(directory) / POLICY_CONFIG, device)
    dry = torch.get_default_device().type == "meta"  # a --dry_run: shapes only, nothing to copy
    if not dry:  # every tensor comes from the file (strict), so nothing is initialised from elsewhere
        policy = build_policy(config, initialise=not strict)
    try:
        with warnings.catch_warnings():
            if dry:  # the keys and shapes are checked; copying into meta tensors is a no-op torch warns of
                warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter.*")
            load_weights(policy, weights, strict=strict, adapt=registry.state_dict_adapter(config))
    except ModelMismatchError as exc:
        raise ModelMismatchError(
            f"{exc} (the config, type={config.type} from {Path(directory) / POLICY_CONFIG} with any "
            "overrides, builds other tensors: the weights were saved by another policy type or config)"
        ) from None
    return config, (policy if dry else policy.to(device)).eval()
