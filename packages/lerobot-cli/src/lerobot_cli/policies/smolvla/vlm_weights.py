"""``--policy.load_vlm_weights=true``: SmolVLA's VLM starts from ``vlm_model_name``'s pretrained weights, in
bfloat16, as LeRobot 0.6.1 builds it.

What LeRobot does (``SmolVLMWithExpertModel.__init__``): ``AutoModelForImageTextToText.from_pretrained(
vlm_model_name, torch_dtype="bfloat16")``, then keeps the first ``num_vlm_layers`` text layers. So

* every VLM parameter (vision tower, connector, text model, ``lm_head``) is bf16, its value the file's
  rounded to bf16 (the rotary ``inv_freq`` buffers, not in the state dict, stay fp32);
* ``from_pretrained`` sets ``dtype=bfloat16`` on the config and its text and vision sub-configs, and the
  action expert is ``AutoModel.from_config`` of a copy of that text config: the expert is bf16 too, except
  the cross-attention layers' ``k_proj``/``v_proj`` LeRobot replaces with plain ``nn.Linear`` (fp32), as are
  the flow projections (``state_proj``, ``action_*``);
* ``from_pretrained`` draws nothing from the global RNG: the expert's and the projections' random
  initialisation is the same as without the VLM's weights, seed for seed.

Here (:func:`pretrained_vlm_config`, :func:`pretrained_build`) the VLM is built from a config so marked,
under a bf16 default dtype and a forked RNG (so the dtypes and the expert's draws are LeRobot's), and
:func:`load_vlm_weights` then copies the file's tensors into it. Only the tensors the truncated VLM has are
read (16 of SmolVLM2's 32 text layers by default), each cast to bf16 as it is read; in a sharded set only
the shards that hold them are opened. Each rank of a multi-process run does so (the existing pattern:
every rank builds the whole policy and loads what it starts from, FastWAM's base model included, before
FSDP2 shards it); the files are memory-mapped, so the ranks of one machine share the page cache.

With ``--policy.path`` (or a resume) the weights are not read at all, and need not be on the machine: our
``load_policy`` loads ``model.safetensors`` strictly, every tensor of the policy, so it overwrites every
VLM tensor LeRobot would have read first; what stays from ``load_vlm_weights`` is the dtypes of the built
model, which the checkpoint's values are cast to (LeRobot's ``load_model`` copies into the built
parameters too). LeRobot loads non-strictly: a checkpoint lacking some tensor would keep the VLM's
pretrained value there in LeRobot; ours refuses such a file in one line instead.

The files are untrusted: a shard name from ``model.safetensors.index.json`` must be a plain relative name
inside the directory (no absolute path, no ``..``, no symlink out of it but a Hugging Face cache
snapshot's links into its own ``blobs/``); a missing file, tensor, shape or a non-float tensor ends the run
in one line naming the flag and the file.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from lerobot_cli.errors import ConfigError

FLAG = "--policy.load_vlm_weights"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
MAX_INDEX_BYTES = 64 * 2**20  # an index names a few thousand tensors: a bigger one is not an index


class VLMWeightsError(ConfigError):
    """The VLM's weights are missing, incomplete or unsafe to read (one line, exit 2)."""


def pretrained_vlm_config(config):
    """``config`` (a ``SmolVLMConfig``, changed in place and returned) marked bf16 as ``from_pretrained(
    torch_dtype="bfloat16")`` marks it: the expert, built from a copy of its text config, follows."""
    import torch

    for part in (config, config.text_config, config.vision_config):
        part.dtype = torch.bfloat16
    return config


@contextlib.contextmanager
def pretrained_build() -> Iterator[None]:
    """Build the VLM as ``from_pretrained`` leaves it: bf16 parameters (the default dtype while it is
    built; transformers keeps the rotary buffers fp32), and the global RNG untouched (its random
    initialisation is overwritten by the file; LeRobot's draws none)."""
    import torch

    previous = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.set_default_dtype(torch.bfloat16)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)


def _inside(directory: Path, name: str, source: Path) -> Path:
    """``directory / name`` for a shard ``name`` read from ``source``, refused unless it stays inside."""
    from lerobot_cli.policies.location import own_file

    parts = PurePosixPath(name).parts
    if (
        not name
        or "\\" in name
        or PurePosixPath(name).is_absolute()
        or Path(name).is_absolute()
        or any(p in ("..", "") for p in parts)
    ):
        raise VLMWeightsError(
            f"{FLAG}=true: {source} names the shard {name!r}, a path out of {directory}: refused "
            "(shard names must be plain file names inside the model's directory)"
        )
    try:
        path = own_file(directory, name)
    except ValueError as exc:
        raise VLMWeightsError(f"{FLAG}=true: {exc}") from None
    if not path.is_symlink():
        try:
            real = path.resolve(strict=False)
            inside = real.is_relative_to(directory.resolve())
        except (OSError, RuntimeError):
            inside = False
        if not inside:  # a symlinked folder on the way
            raise VLMWeightsError(
                f"{FLAG}=true: {source} names the shard {name!r}, which leads out of {directory}: refused"
            )
    return path


def weight_map(directory: Path, name: str) -> dict[str, Path]:
    """Tensor name -> the file that holds it: ``model.safetensors``, else the shards ``model.safetensors.
    index.json`` maps each tensor to (``from_pretrained``'s order). Neither: one line naming ``hf download``
    (or, for a local directory, what to copy there)."""
    from lerobot_cli.policies.location import own_file

    # transformers' order: the single file when there is one, else the index
    single = directory / WEIGHTS
    if single.is_file():
        return dict.fromkeys(_keys(_inside(directory, WEIGHTS, directory)), single)
    index = directory / INDEX
    if index.is_file():
        try:
            own_file(directory, INDEX)
            if index.stat().st_size > MAX_INDEX_BYTES:
                raise ValueError(f"{index.stat().st_size} bytes")
            mapping = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
            if not isinstance(mapping, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
            ):
                raise ValueError("no weight_map of tensor names to shard files")
        except (ValueError, AttributeError, OSError) as exc:  # bad JSON, a non-object, unreadable
            raise VLMWeightsError(f"{FLAG}=true: {index} is not a safetensors index ({exc})") from None
        shards = {shard: _inside(directory, shard, index) for shard in sorted(set(mapping.values()))}
        return {key: shards[shard] for key, shard in mapping.items()}
    fetch = (
        f"copy the model's {WEIGHTS} (or its shards and {INDEX}) into it"
        if Path(name).expanduser().is_dir()
        else f"download them once with network access: `hf download {name}`"
    )
    raise VLMWeightsError(
        f"{FLAG}=true: {directory} has no {WEIGHTS} (nor {INDEX}), the weights of {name}; {fetch}, or set "
        f"{FLAG}=false to start the VLM from random weights"
    )


def _keys(file: Path) -> list[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            return list(f.keys())
    except Exception as exc:  # noqa: BLE001 - a truncated or absurd header: one line naming the file
        raise VLMWeightsError(f"{FLAG}=true: {file} is not a readable safetensors file ({exc})") from None


def check_vlm_weights(name: str) -> Path:
    """The VLM's directory, after checking it holds a weight set (the run's start-up check)."""
    from lerobot_cli.policies.smolvla.vlm import vlm_directory

    directory = vlm_directory(name)
    weight_map(directory, name)
    return directory


def load_vlm_weights(vlm, name: str) -> int:
    """Copy ``name``'s pretrained weights into ``vlm`` (the SmolVLM of a fresh SmolVLA, truncated to its
    ``num_vlm_layers``), each tensor cast to the parameter's dtype (bf16: see the module's docstring);
    returns the number of tensors read. Every tensor of ``vlm``'s state dict must be in the files (an
    alias of one that is, like a tied ``lm_head``, excepted); the files' others are not read."""
    import torch
    from safetensors import safe_open

    from lerobot_cli.policies.smolvla.vlm import vlm_directory

    directory = vlm_directory(name)
    where = weight_map(directory, name)
    own = vlm.state_dict()
    present = {own[k].untyped_storage().data_ptr() for k in own if k in where}
    needed: dict[Path, list[str]] = {}
    missing = []
    for key, tensor in own.items():
        if key in where:
            needed.setdefault(where[key], []).append(key)
        elif tensor.untyped_storage().data_ptr() not in present:  # not an alias of a loaded tensor
            missing.append(key)
    if missing:
        source = directory / (INDEX if (directory / INDEX).is_file() else WEIGHTS)
        raise VLMWeightsError(
            f"{FLAG}=true: {source} lacks {len(missing)} of the VLM's {len(own)} tensors (e.g. "
            f"{', '.join(missing[:3])}): an incomplete download or another model than {name}'s config.json "
            f"describes; `hf download {name}` fetches the whole set"
        )
    count = 0
    with torch.no_grad():
        for file, keys in needed.items():
            try:
                with safe_open(str(file), framework="pt") as f:
                    for key in keys:
                        _copy(own[key], f.get_tensor(key), key, file)
                        count += 1
            except VLMWeightsError:
                raise
            except Exception as exc:  # noqa: BLE001 - a truncated file or absurd header: one line
                raise VLMWeightsError(f"{FLAG}=true: {file} could not be read ({exc})") from None
    return count


def _copy(target, value, key: str, file: Path) -> None:
    if tuple(value.shape) != tuple(target.shape):
        raise VLMWeightsError(
            f"{FLAG}=true: {file} holds {key} of shape {tuple(value.shape)}, the VLM's is "
            f"{tuple(target.shape)}: these weights are not the model {file.parent}/config.json describes"
        )
    if not value.is_floating_point():
        raise VLMWeightsError(
            f"{FLAG}=true: {file} holds {key} as {str(value.dtype).removeprefix('torch.')}, not a float: "
            "refused (casting it would make up its values)"
        )
    target.copy_(value.to(target.dtype))


def vlm_weights_source(name: str):
    """The weights as an external source, checked at start-up (before any heavy work) by the CLI."""
    from functools import partial

    from lerobot_cli.policies.config import Source

    return Source(FLAG, name, resolve=partial(check_vlm_weights, name), initial=True)


def vlm_initial_weights(config):
    """What a fresh ``load_vlm_weights`` policy starts from (the banner's line), and the loader
    ``build_policy`` calls on the built policy."""
    from lerobot_cli.policies.config import InitialWeights

    directory = check_vlm_weights(config.vlm_model_name)
    name = config.vlm_model_name

    def load(policy) -> int:
        return load_vlm_weights(policy.model.vlm_with_expert.vlm, name)

    return InitialWeights(
        f"the VLM's from {name} ({directory}) in bfloat16, its first {config.num_vlm_layers} text layers "
        f"({FLAG}=true, as LeRobot); the action expert (bf16) and the projections as initialised",
        load=load,
    )
