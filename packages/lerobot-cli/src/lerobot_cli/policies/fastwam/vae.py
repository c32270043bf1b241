"""The frozen Wan2.2 VAE (diffusers' ``AutoencoderKLWan``, Wan2.2-TI2V-5B's) with FastWAM's latent scaling.

diffusers returns raw latents; FastWAM works on standardised ones, ``(μ - mean) / std`` per channel with
the ``latents_mean`` / ``latents_std`` of the VAE's own ``config.json``, as LeRobot 0.6.1's
``WanVideoVAE38`` does. The numbers are LeRobot's:

- encode: pixels in [-1, 1] are cast to the VAE's device and dtype, the posterior's mode μ (no sampling)
  is taken to float32 and standardised in float32 (the statistics are float32 buffers);
- decode: latents in float32 are de-standardised, cast to the VAE's dtype, decoded, and the pixels come
  back as float32 clamped to [-1, 1];
- FastWAM's frames are in [0, 1] (its pre-processor leaves images alone) and become [-1, 1] here, at the
  one encode boundary: a training video is first cast to the model's dtype and then mapped (LeRobot's
  ``build_inputs`` order, so under bf16 the mapping is computed in bf16), an inference image is mapped in
  its own dtype and cast by the encoder (LeRobot's ``_encode_input_image_latents_tensor``);
- tiled encoding/decoding is refused, as LeRobot refuses it (``tiled=True``).

Frozen: the wrapper never trains (``requires_grad`` False, eval mode kept even if ``train()`` is called),
and the policy holds it outside its registered submodules (see ``frozen.py``), so it is in no state dict,
optimizer or FSDP unit. Its statistics are non-persistent buffers for the same reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

# Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json's geometry (its latents_mean/std come with the real file);
# 704,688,668 parameters, 1.41 GB in bf16.
WAN22_VAE_ARCHITECTURE: dict[str, Any] = {
    "base_dim": 160,
    "decoder_base_dim": 256,
    "z_dim": 48,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_temporal": 4,
    "scale_factor_spatial": 16,
    "is_residual": True,
}
TILED_REFUSAL = (
    "Tiled Wan2.2 VAE {} is not supported by FastWAM (LeRobot 0.6.1 refuses it too): set tiled=false"
)


def tiny_wan_vae_config(base_dim: int = 8) -> dict[str, Any]:
    """A Wan2.2-shaped VAE small enough for CPU tests (288k parameters at ``base_dim=8``): the same 48
    latent channels, 16× spatial / 4× temporal compression and patchified residual blocks, narrower.
    Its statistics are fixed, not 0/1, so the standardisation is exercised."""
    return {
        **WAN22_VAE_ARCHITECTURE,
        "base_dim": base_dim,
        "decoder_base_dim": base_dim,
        "dim_mult": [1, 2, 2, 2],
        "num_res_blocks": 1,
        "latents_mean": [round(0.05 * i - 1.2, 4) for i in range(48)],
        "latents_std": [round(0.4 + 0.03 * i, 4) for i in range(48)],
    }


class WanVAE(torch.nn.Module):
    """FastWAM's view of a diffusers ``AutoencoderKLWan``: standardised latents in, pixels out."""

    def __init__(self, autoencoder: torch.nn.Module) -> None:
        super().__init__()
        config = autoencoder.config
        self.autoencoder = autoencoder
        self.z_dim = int(config.z_dim)
        self.upsampling_factor = int(config.scale_factor_spatial)  # LeRobot's names for the compression
        self.temporal_downsample_factor = int(config.scale_factor_temporal)
        # float32, like LeRobot's torch.tensor(list); non-persistent: the statistics are the VAE config's
        shape = (1, self.z_dim, 1, 1, 1)
        self.register_buffer("latents_mean", torch.tensor(config.latents_mean).view(shape), persistent=False)
        self.register_buffer("latents_std", torch.tensor(config.latents_std).view(shape), persistent=False)
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> WanVAE:
        """Always eval: a frozen part ignores a ``train()`` call reaching it."""
        return super().train(False)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.autoencoder.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.autoencoder.parameters()).device

    @torch.no_grad()
    def encode(self, pixels: Tensor | Sequence[Tensor], tiled: bool = False) -> Tensor:
        """``[B, 3, T, H, W]`` pixels in [-1, 1] → standardised float32 latents
        ``[B, 48, (T-1)/4+1, H/16, W/16]``."""
        if tiled:
            raise NotImplementedError(TILED_REFUSAL.format("encoding"))
        if isinstance(pixels, (list, tuple)):
            pixels = torch.stack(list(pixels))
        mu = (
            self.autoencoder.encode(pixels.to(device=self.device, dtype=self.dtype))
            .latent_dist.mode()
            .float()
        )
        return (mu - self.latents_mean.float().to(mu.device)) / self.latents_std.float().to(mu.device)

    @torch.no_grad()
    def decode(self, latents: Tensor | Sequence[Tensor], tiled: bool = False) -> Tensor:
        """Standardised latents → float32 pixels in [-1, 1], ``[B, 3, T, H, W]``."""
        if tiled:
            raise NotImplementedError(TILED_REFUSAL.format("decoding"))
        if isinstance(latents, (list, tuple)):
            latents = torch.stack(list(latents))
        z = latents.float()
        z = z * self.latents_std.float().to(z.device) + self.latents_mean.float().to(z.device)
        pixels = self.autoencoder.decode(z.to(device=self.device, dtype=self.dtype)).sample
        return pixels.float().clamp_(-1.0, 1.0)

    def encode_video(self, video: Tensor, dtype: torch.dtype | None = None, tiled: bool = False) -> Tensor:
        """A training video ``[B, 3, T, H, W]`` in [0, 1]: cast to the model's ``dtype`` (default the VAE's)
        on the VAE's device, mapped to [-1, 1] there, encoded."""
        video = video.to(device=self.device, dtype=dtype or self.dtype)
        return self.encode(video * 2.0 - 1.0, tiled=tiled)

    def encode_image(self, image: Tensor, tiled: bool = False) -> Tensor:
        """An inference image ``[B, 3, H, W]`` (or ``[3, H, W]``) in [0, 1] → its latent frame
        ``[B, 48, 1, H/16, W/16]``; mapped to [-1, 1] in the image's own dtype, as LeRobot does."""
        if image.ndim == 3:
            image = image.unsqueeze(0)
        if image.ndim != 4 or image.shape[1] != 3:
            raise ValueError(f"`input_image` must have shape [B,3,H,W] or [3,H,W], got {tuple(image.shape)}")
        image = image * 2.0 - 1.0
        return self.encode(image.to(device=self.device).unsqueeze(2), tiled=tiled)


def load_wan_vae(folder: str | Path, *, dtype: torch.dtype, device: str | torch.device = "cpu") -> WanVAE:
    """The pretrained VAE from a resolved local folder (``sources.resolve_part(..., VAE)``); nothing is
    downloaded (``local_files_only``)."""
    from diffusers import AutoencoderKLWan

    autoencoder = AutoencoderKLWan.from_pretrained(str(folder), torch_dtype=dtype, local_files_only=True)
    return WanVAE(autoencoder.to(device=device))


def build_wan_vae(
    config: Mapping[str, Any], *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> WanVAE:
    """A VAE built from ``config`` with diffusers' random initialisation (the global torch RNG: seed it
    first). Tests and CPU demos only: FastWAM's real VAE is never trained, so it is always loaded."""
    from diffusers import AutoencoderKLWan

    autoencoder = AutoencoderKLWan(**dict(config))
    # nn.Module.to: diffusers' own .to warns about float32-kept modules, of which the Wan VAE has none
    return WanVAE(torch.nn.Module.to(autoencoder, device=device, dtype=dtype))


def wan_vae_parameter_count(config: Mapping[str, Any] = WAN22_VAE_ARCHITECTURE) -> int:
    """Parameters of the VAE ``config`` describes, counted on the meta device (nothing allocated)."""
    from diffusers import AutoencoderKLWan

    with torch.device("meta"):
        autoencoder = AutoencoderKLWan(**dict(config))
    return sum(p.numel() for p in autoencoder.parameters())
