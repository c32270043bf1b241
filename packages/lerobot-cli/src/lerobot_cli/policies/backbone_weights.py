"""``--policy.pretrained_backbone_weights``: the ImageNet ResNet file behind a torchvision weights name.

ACT and Diffusion Policy default, as in LeRobot, to ``ResNet18_Weights.IMAGENET1K_V1``. The name is
resolved the way torchvision resolves it (torchvision itself is not a dependency: its wheels trail
torch releases): the file ``<torch hub dir>/checkpoints/<torchvision's file name>``, downloaded from
``https://download.pytorch.org/models/`` into that cache when it is not there yet, the download
checked against the SHA-256 prefix in the file's name (torchvision's ``check_hash``). So a machine
that ever ran torchvision needs no network, and a cluster without one can point
``$LEROBOT_BACKBONE_WEIGHTS_URL`` at a mirror of those files. Offline, the error says how to go on:
``null`` (a randomly initialised backbone, what tests and the demo pass) or a local file.

In a multi-process run the download happens once per machine: ``lerobot_cli.fetching`` lets the
local main rank fetch it while the others wait, then they find it cached.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from pathlib import Path

from lerobot_cli.errors import ConfigError

FLAG = "--policy.pretrained_backbone_weights"
DEFAULT_BACKBONE_WEIGHTS = "ResNet18_Weights.IMAGENET1K_V1"  # LeRobot's default for ACT and diffusion
BASE_URL = "https://download.pytorch.org/models/"
URL_ENV = "LEROBOT_BACKBONE_WEIGHTS_URL"  # a mirror of download.pytorch.org/models/ (same file names)

# torchvision's file names for the ImageNet weights (the part after '-' is its SHA-256 prefix).
TORCHVISION_FILES = {
    "ResNet18_Weights.IMAGENET1K_V1": "resnet18-f37072fd.pth",
    "ResNet34_Weights.IMAGENET1K_V1": "resnet34-b627a593.pth",
    "ResNet50_Weights.IMAGENET1K_V1": "resnet50-0676ba61.pth",
    "ResNet50_Weights.IMAGENET1K_V2": "resnet50-11ad3fa6.pth",
    "ResNet101_Weights.IMAGENET1K_V1": "resnet101-63fe2227.pth",
    "ResNet101_Weights.IMAGENET1K_V2": "resnet101-cd907fc2.pth",
    "ResNet152_Weights.IMAGENET1K_V1": "resnet152-394f9c45.pth",
    "ResNet152_Weights.IMAGENET1K_V2": "resnet152-f82ba261.pth",
}
_DEFAULT_VERSION = {"18": "V1", "34": "V1", "50": "V2", "101": "V2", "152": "V2"}
_WEIGHTS_NAME = re.compile(r"^ResNet(\d+)_Weights\.(\w+)$")
_HASH = re.compile(r"-([a-f0-9]+)\.")
CONNECT_TIMEOUT_S = 60.0  # per socket operation (connect, each read), not for the whole download


class BackboneWeightsUnavailable(ConfigError, FileNotFoundError):
    """The named backbone weights are neither on this machine nor downloadable (one error line, exit 2)."""


def _hub_dir() -> Path:
    import torch

    return Path(torch.hub.get_dir())


def torchvision_file(spec: str) -> str | None:
    """torchvision's file name for a weights name (``..._Weights.DEFAULT`` included); None: not a name."""
    match = _WEIGHTS_NAME.match(spec)
    if match is None:
        return None
    depth, version = match.groups()
    if version == "DEFAULT" and depth in _DEFAULT_VERSION:
        spec = f"ResNet{depth}_Weights.IMAGENET1K_{_DEFAULT_VERSION[depth]}"
    if spec not in TORCHVISION_FILES:
        raise ConfigError(
            f"{FLAG}: unknown torchvision weights {spec!r} (known: {', '.join(TORCHVISION_FILES)}), "
            "or give the path of a local weights file, or null"
        )
    return TORCHVISION_FILES[spec]


def cached_path(spec: str) -> Path | None:
    """Where torchvision keeps ``spec``'s file (whether or not it is there); None for a local path."""
    name = torchvision_file(spec)
    return None if name is None else _hub_dir() / "checkpoints" / name


def _download(name: str, target: Path, spec: str) -> None:
    import torch

    url = os.environ.get(URL_ENV, BASE_URL).rstrip("/") + "/" + name
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{name}.part-{os.getpid()}")
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(CONNECT_TIMEOUT_S)  # a firewalled network fails in a minute, not never
    try:
        torch.hub.download_url_to_file(url, str(tmp), hash_prefix=None, progress=False)
        prefix = _HASH.search(name).group(1)
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        if not digest.startswith(prefix):
            raise BackboneWeightsUnavailable(
                f"{FLAG}={spec}: the file downloaded from {url} has SHA-256 {digest[:12]}…, not "
                f"torchvision's {prefix}…: refused (a broken mirror or download); pass null, "
                "or the path of a local weights file"
            )
        os.replace(tmp, target)
    except BackboneWeightsUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - offline, proxy, HTTP error, disk: one sentence for the user
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
        raise BackboneWeightsUnavailable(
            f"{FLAG}={spec}: not in the torch hub cache ({target}) and the download from {url} failed "
            f"({reason}); pass {FLAG}=null for a randomly initialised backbone, or the path of a local "
            f"torchvision ResNet file (or set ${URL_ENV} to a mirror)"
        ) from None
    finally:
        socket.setdefaulttimeout(previous)
        if tmp.exists():
            tmp.unlink()


def resolve_backbone_weights(spec: str, *, download: bool = True) -> Path:
    """The local file behind ``spec``: a path as is, a torchvision name from the hub cache (downloaded
    into it when missing and ``download``)."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    cached = cached_path(spec)
    if cached is None:
        raise BackboneWeightsUnavailable(
            f"{FLAG}: no file at {path}; give a local weights file, a torchvision "
            f"weights name such as {DEFAULT_BACKBONE_WEIGHTS}, or null"
        )
    if not cached.is_file():
        if not download:
            raise BackboneWeightsUnavailable(
                f"{FLAG}={spec}: not in the torch hub cache ({cached}), and this process does not download "
                f"it (the machine's first rank does); pass {FLAG}=null or the path of a local weights file"
            )
        _download(cached.name, cached, spec)
    return cached


def read_backbone_state(file: Path) -> dict:
    """A ResNet state dict from a ``.pth``/``.pt`` (torch.save, weights only) or ``.safetensors`` file."""
    import torch

    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(file))
    state = torch.load(file, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    return state
