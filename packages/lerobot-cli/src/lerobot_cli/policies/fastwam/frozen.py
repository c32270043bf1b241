"""A FastWAM policy's frozen Wan2.2 VAE and UMT5 text encoder: how they are built, and held beside its tree.

LeRobot 0.6.1's ``FastWAM`` sets ``vae`` and ``text_encoder`` with ``object.__setattr__`` so that
``nn.Module`` does not register them: they are in no ``state_dict()`` (checkpoints hold only the trainable
policy, the frozen parts come from the Wan2.2 repository), no ``parameters()`` (so no optimizer, no DDP
gradient sync) and no ``named_modules()`` (so no FSDP unit or wrap-policy walk ever sees them).
``FrozenParts`` gets the same by being a plain object: an ``nn.Module`` attribute that is neither a
module, a parameter nor a buffer is kept as an ordinary attribute.

What differs from LeRobot, and why:

- device moves are explicit (``FrozenParts.to``) instead of riding on the policy's ``_apply``: our sharded
  runs build the policy on the meta device and materialise it with ``to_empty`` (an ``_apply``), which
  would empty the frozen weights too, and FSDP moves the parameters it manages without ``_apply`` at all.
  The wiring puts the frozen parts on the rank's device once, where it builds them;
- ``copy.deepcopy`` of the policy (an EMA shadow) shares them instead of copying 11 GB of UMT5: they are
  read-only.

:func:`build_frozen_parts` builds them as a config names them: loaded from ``sources.py``'s offline
resolution, or, with ``variant=tiny``, built from config under ``TINY_SEED`` (the same weights on every rank
and in every process). UMT5 is built with the policy unless a training run precomputes each task's context
(:func:`holds_prompt_encoder`); :func:`build_prompt_encoder` builds it alone, for ``precompute.py`` and at
the first prompt of a policy built without it. The builders read a ``FastWAMConfig`` without importing it
(``config.py`` imports ``precompute.py``, which imports this module).
"""

from __future__ import annotations

import torch

from lerobot_cli.policies.fastwam.dtypes import TORCH_DTYPES
from lerobot_cli.policies.fastwam.text import PromptEncoder
from lerobot_cli.policies.fastwam.vae import WanVAE

TINY_SEED = 0  # variant=tiny: the frozen parts' weights, the same on every rank and in every process


class FrozenParts:
    """The frozen VAE and, unless the task contexts are precomputed, the prompt encoder of one policy."""

    def __init__(self, vae: WanVAE, prompts: PromptEncoder | None = None) -> None:
        self.vae = vae
        self.prompts = prompts

    def modules(self) -> list[torch.nn.Module]:
        return [self.vae] if self.prompts is None else [self.vae, self.prompts.encoder]

    def to(self, device: str | torch.device) -> FrozenParts:
        for module in self.modules():
            module.to(device)
        return self

    def nbytes(self) -> int:
        """Bytes of their parameters and buffers, as held now (per rank: every rank holds a full copy)."""
        return sum(
            t.numel() * t.element_size() for m in self.modules() for t in (*m.parameters(), *m.buffers())
        )

    def __deepcopy__(self, memo: dict) -> FrozenParts:
        return self


def holds_prompt_encoder(config) -> bool:
    """Whether a policy builds UMT5 with itself: with ``load_text_encoder``, unless a training run
    precomputes each task's context (``precompute_task_contexts``; then only that run's main rank loads it,
    once, and inference builds it at its first prompt)."""
    return config.load_text_encoder and not config.precompute_task_contexts


def build_frozen_parts(config, *, prompts: bool | None = None) -> FrozenParts:
    """The frozen VAE and (``prompts``; by default :func:`holds_prompt_encoder`) the prompt encoder
    ``config`` names, on the CPU in ``torch_dtype``.

    What is read from where is ``sources.resolve_config_parts`` (the list the run checks before any work):
    ``variant=full`` loads the Wan2.2 VAE from LeRobot's repository, UMT5 from ``text_encoder_model_id`` and
    the tokenizer from ``tokenizer_model_id``, each from a local directory or a complete Hugging Face cache
    snapshot, never a download. ``variant=tiny`` builds a tiny Wan2.2-shaped VAE and a tiny UMT5
    (``text_dim`` wide, a vocabulary covering the tokenizer) from config under a fixed seed in a forked RNG,
    so every rank and every later process builds the same weights and the run's random stream is left as
    it was; only the tokenizer is read. A missing source raises ``FrozenPartUnavailableError`` (one line
    naming its flag)."""
    from lerobot_cli.policies.fastwam.vae import load_wan_vae

    if prompts is None:
        prompts = holds_prompt_encoder(config)
    if config.variant == "tiny":
        vae, encoder = _tiny_frozen_parts(config, prompts)
    else:
        from lerobot_cli.policies.fastwam.sources import resolve_config_parts

        vae = load_wan_vae(resolve_config_parts(config)["vae"], dtype=TORCH_DTYPES[config.torch_dtype])
        encoder = build_prompt_encoder(config) if prompts else None
    in_dim = int(config.video_dit_config["in_dim"])
    if vae.z_dim != in_dim:
        raise ValueError(
            f"the VAE has {vae.z_dim} latent channels but --policy.video_dit_config.in_dim is {in_dim}"
        )
    return FrozenParts(vae, encoder)


def build_prompt_encoder(config) -> PromptEncoder:
    """UMT5 and its tokenizer as ``config`` names them (see :func:`build_frozen_parts`), on the CPU; the
    tiny variant's equals the one :func:`build_frozen_parts` builds beside its VAE, weight for weight."""
    from lerobot_cli.policies.fastwam.sources import resolve_config_parts
    from lerobot_cli.policies.fastwam.text import load_umt5_encoder, load_umt5_tokenizer

    if config.variant == "tiny":
        prompts = _tiny_frozen_parts(config, True)[1]
    else:
        folders = resolve_config_parts(config)
        prompts = PromptEncoder(
            load_umt5_tokenizer(folders["tokenizer"]),
            load_umt5_encoder(folders["text_encoder"], dtype=TORCH_DTYPES[config.torch_dtype]),
            config.tokenizer_max_len,
        )
    text_dim = int(config.video_dit_config["text_dim"])
    if prompts.dim != text_dim:
        raise ValueError(
            f"the text encoder is {prompts.dim} wide but --policy.video_dit_config.text_dim is {text_dim}"
        )
    return prompts


def _tiny_frozen_parts(config, prompts: bool) -> tuple[WanVAE, PromptEncoder | None]:
    """The tiny VAE and UMT5, in this order from one forked RNG seeded with ``TINY_SEED`` (the encoder's
    weights come after the VAE's draws, so building it alone builds the VAE too: a few thousand values)."""
    from lerobot_cli.policies.fastwam.sources import resolve_config_parts
    from lerobot_cli.policies.fastwam.text import build_umt5_encoder, load_umt5_tokenizer, tiny_umt5_config
    from lerobot_cli.policies.fastwam.vae import build_wan_vae, tiny_wan_vae_config

    dtype = TORCH_DTYPES[config.torch_dtype]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        vae = build_wan_vae(tiny_wan_vae_config(), dtype=dtype)
        if not prompts:
            return vae, None
        tokenizer = load_umt5_tokenizer(resolve_config_parts(config)["tokenizer"])
        text_dim = int(config.video_dit_config["text_dim"])
        encoder_config = tiny_umt5_config(d_model=text_dim, vocab_size=max(384, len(tokenizer)))
        encoder = build_umt5_encoder(encoder_config, dtype=dtype)
        return vae, PromptEncoder(tokenizer, encoder, config.tokenizer_max_len)
