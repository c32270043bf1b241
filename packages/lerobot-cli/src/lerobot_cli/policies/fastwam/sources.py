"""Where FastWAM's frozen parts come from: a local directory or the Hugging Face cache, never a download.

LeRobot 0.6.1 loads the Wan2.2 VAE from ``Wan-AI/Wan2.2-TI2V-5B-Diffusers`` (``vae/``, a fixed id), the
UMT5-XXL text encoder from ``text_encoder_model_id`` (``text_encoder/`` of that repository) and the
tokenizer from ``tokenizer_model_id`` (``google/umt5-xxl``). Here the text encoder and the tokenizer may
also be a local directory: the repository's root (holding the subfolder) or the part's own folder. The VAE's
repository stays LeRobot's, in the cache, whatever ``text_encoder_model_id`` says (``frozen_part_sources``:
what a config reads from where, for the policy that loads it and for the check before the run).

A Hub id is looked up in the cache only (``local_files_only=True``: ``HF_HUB_OFFLINE`` or not, a run never
downloads them). The text encoder alone is ~11 GB, and every rank of a job would fetch it at once, deep
inside model construction; instead a part that is not there stops the run at start-up in one line naming
the ``hf download`` command that fetches it. Everything here reads JSON and directory listings (pathlib
and huggingface_hub, no torch), so the check costs nothing before the heavy work starts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from attrs import field, frozen

WAN22_DIFFUSERS_MODEL_ID = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"  # LeRobot's source of the VAE and UMT5
UMT5_TOKENIZER_ID = "google/umt5-xxl"  # LeRobot's tokenizer_model_id default


@frozen
class FrozenPart:
    """What one frozen part is and which files make it present.

    ``weights``: alternatives (the first present wins); a ``*.index.json`` also needs every shard it lists.
    ``required``: files that must all be there. ``include``: the ``hf download --include`` patterns that
    fetch the part alone (not the repository's other tens of GB).
    """

    name: str  # said in messages: "Wan2.2 VAE"
    subfolder: str  # inside a Diffusers repository: "vae"
    required: tuple[str, ...] = field(converter=tuple)
    weights: tuple[str, ...] = field(default=(), converter=tuple)
    include: tuple[str, ...] = field(default=(), converter=tuple)


VAE = FrozenPart(
    "Wan2.2 VAE",
    "vae",
    required=("config.json",),
    weights=(
        "diffusion_pytorch_model.safetensors",
        "diffusion_pytorch_model.safetensors.index.json",
        "diffusion_pytorch_model.bin",
    ),
    include=("vae/*",),
)
TEXT_ENCODER = FrozenPart(
    "UMT5 text encoder",
    "text_encoder",
    required=("config.json",),
    weights=(
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
    ),
    include=("text_encoder/*",),
)
# google/umt5-xxl holds the tokenizer at its root (beside ~20 GB of weights); a Diffusers repository keeps it
# in tokenizer/: the patterns fetch it from either, and no weights
TOKENIZER = FrozenPart(
    "UMT5 tokenizer",
    "tokenizer",
    required=("tokenizer_config.json",),
    weights=("tokenizer.json", "spiece.model"),
    include=("*.json", "spiece.model", "tokenizer/*"),
)


class FrozenPartUnavailableError(ValueError):
    """A frozen part that is neither a usable local directory nor complete in the Hugging Face cache."""

    def __init__(self, part: FrozenPart, source: str, reason: str, setting: str | None = None) -> None:
        self.part, self.source, self.reason, self.setting = part, source, reason, setting
        super().__init__(self.naming(setting))

    def naming(self, setting: str | None) -> str:
        """The one line, with the setting that named the part spelled as the caller's users know it."""
        named = f"{setting}={self.source}" if setting else self.source
        if Path(self.source).expanduser().is_dir() or _looks_like_path(self.source):
            return (
                f"{named}: {self.reason}; point it at a directory holding the {self.part.name} "
                f"({_expected(self.part)})"
            )
        include = "".join(f" '{pattern}'" for pattern in self.part.include)
        include = f" --include{include}" if include else ""
        # no setting: a source the policy fixes (the VAE's repository, as LeRobot's), so no directory can
        # stand in for it
        instead = (
            "or name a local directory holding it"
            if setting
            else "FastWAM reads it from that repository in the Hugging Face cache, as LeRobot does"
        )
        return (
            f"{named}: the {self.part.name} is not in the Hugging Face cache ({self.reason}), and runs never "
            f"download it; download it once with network access: hf download {self.source}{include} "
            f"({instead})"
        )


def _looks_like_path(source: str) -> bool:
    return source.startswith(("/", "./", "../", "~")) or source.count("/") > 1


def _expected(part: FrozenPart) -> str:
    files = [*part.required, " or ".join(part.weights)] if part.weights else list(part.required)
    where = f"in it or in its {part.subfolder}/" if part.subfolder else "in it"
    return f"{', '.join(files)} {where}"


def _missing(directory: Path, part: FrozenPart) -> list[str]:
    """The files ``part`` lacks in ``directory`` (empty: complete)."""
    missing = [name for name in part.required if not (directory / name).is_file()]
    if not part.weights:
        return missing
    present = next((name for name in part.weights if (directory / name).is_file()), None)
    if present is None:
        return [*missing, " or ".join(part.weights)]
    if present.endswith(".index.json"):
        try:
            shards = set(json.loads((directory / present).read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            return [*missing, f"a readable {present}"]
        missing += sorted(shard for shard in shards if not (directory / shard).is_file())
    return missing


def _complete_folder(root: Path, part: FrozenPart) -> tuple[Path | None, list[str]]:
    """``root/subfolder`` or ``root`` itself, whichever holds the part; else the files it lacks."""
    candidates = [root / part.subfolder, root] if part.subfolder else [root]
    lacks: list[str] = []
    for candidate in candidates:
        if candidate.is_dir():
            missing = _missing(candidate, part)
            if not missing:
                return candidate, []
            lacks = lacks or missing
    return None, lacks or [f"{part.subfolder}/" if part.subfolder else "its files"]


def resolve_part(source: str, part: FrozenPart, setting: str | None = None) -> Path:
    """The local folder holding ``part``: ``source`` as a directory, else its Hugging Face cache snapshot.

    Raises :class:`FrozenPartUnavailableError` (one line; ``setting`` names the flag in it).
    """
    directory = Path(source).expanduser()
    if directory.is_dir():
        found, lacks = _complete_folder(directory, part)
        if found is None:
            raise FrozenPartUnavailableError(part, source, f"it lacks {', '.join(lacks)}", setting)
        return found
    if _looks_like_path(source):
        raise FrozenPartUnavailableError(part, source, "no such directory", setting)
    from huggingface_hub import snapshot_download

    try:
        snapshot = Path(snapshot_download(repo_id=source, local_files_only=True))
    except (OSError, ValueError) as exc:  # not cached (LocalEntryNotFoundError), or not a valid repo id
        reason = "not cached" if isinstance(exc, OSError) else str(exc).splitlines()[0].rstrip(".")
        raise FrozenPartUnavailableError(part, source, reason, setting) from None
    found, lacks = _complete_folder(snapshot, part)
    if found is None:
        raise FrozenPartUnavailableError(
            part, source, f"the cached snapshot lacks {', '.join(lacks)}", setting
        )
    return found


@frozen
class FrozenSources:
    """The resolved folders of the frozen parts a run needs (None: not needed)."""

    vae: Path
    text_encoder: Path | None
    tokenizer: Path | None


def resolve_frozen_sources(
    *,
    vae_model_id: str = WAN22_DIFFUSERS_MODEL_ID,
    text_encoder_model_id: str | None = WAN22_DIFFUSERS_MODEL_ID,
    tokenizer_model_id: str | None = UMT5_TOKENIZER_ID,
    settings: Sequence[str | None] = (None, "--policy.text_encoder_model_id", "--policy.tokenizer_model_id"),
) -> FrozenSources:
    """Resolve the VAE, the text encoder and the tokenizer (pass None for one the run does not load, e.g.
    the text encoder when the task contexts are precomputed). The first missing one raises."""
    vae_setting, text_setting, tokenizer_setting = settings
    return FrozenSources(
        vae=resolve_part(vae_model_id, VAE, vae_setting),
        text_encoder=None
        if text_encoder_model_id is None
        else resolve_part(text_encoder_model_id, TEXT_ENCODER, text_setting),
        tokenizer=None
        if tokenizer_model_id is None
        else resolve_part(tokenizer_model_id, TOKENIZER, tokenizer_setting),
    )


def frozen_part_sources(config) -> tuple[tuple[FrozenPart, str, str | None], ...]:
    """What a FastWAM run with ``config`` reads of its frozen parts, and from where: ``(part, source, flag)``
    (flag None: fixed by the policy).

    ``variant=full``: the Wan2.2 VAE from ``Wan-AI/Wan2.2-TI2V-5B-Diffusers``'s ``vae/``, always, as LeRobot
    0.6.1 loads it (``text_encoder_model_id`` does not move it); with ``load_text_encoder`` the UMT5 text
    encoder from ``text_encoder_model_id`` (its ``text_encoder/``) and the tokenizer from
    ``tokenizer_model_id``. ``variant=tiny``: the VAE and UMT5 are built from config, so only the tokenizer,
    with ``load_text_encoder``. ``load_text_encoder=false``: neither UMT5 nor its tokenizer (they only encode
    prompts; LeRobot loads the tokenizer anyway, unused), the contexts come from the batch."""
    text = config.load_text_encoder
    tokenizer = (TOKENIZER, config.tokenizer_model_id, "--policy.tokenizer_model_id")
    if config.variant == "tiny":
        return (tokenizer,) if text else ()
    vae = (VAE, WAN22_DIFFUSERS_MODEL_ID, None)
    if not text:
        return (vae,)
    return (vae, (TEXT_ENCODER, config.text_encoder_model_id, "--policy.text_encoder_model_id"), tokenizer)


def resolve_config_parts(config) -> dict[str, Path]:
    """The local folders of every frozen part ``config`` reads (:func:`frozen_part_sources`), by the part's
    ``subfolder`` name (``vae``, ``text_encoder``, ``tokenizer``); the first missing one raises
    :class:`FrozenPartUnavailableError` naming its flag. What the policy loads, and what the run checks
    before any work, come from this one list."""
    return {
        part.subfolder: resolve_part(source, part, flag) for part, source, flag in frozen_part_sources(config)
    }


def external_sources(config) -> tuple:
    """FastWAM's ``PolicyConfig.external_sources``: its frozen parts (:func:`frozen_part_sources`) and the
    base model a fresh policy starts from (``base.py``), each resolvable offline or one line."""
    from lerobot_cli.policies.config import Source
    from lerobot_cli.policies.fastwam.base import base_model_source

    found = [
        Source(flag or "", source, partial(resolve_part, source, part, flag))
        for part, source, flag in frozen_part_sources(config)
    ]
    base = base_model_source(config)
    return (*found, *([base] if base is not None else []))
