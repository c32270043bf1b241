"""The conditional 1-D U-Net that denoises an action trajectory (Chi et al.'s Diffusion Policy).

Module names follow LeRobot's so that ``diffusion.unet.down_modules.0.0.conv1.block.0.weight`` is the
same tensor on both sides: a sinusoidal timestep embedding and MLP, ``len(down_dims)`` encoder stages
of two FiLM-conditioned residual blocks (stride-2 convolution between stages), two middle blocks, the
mirrored decoder over skip connections (transposed convolutions), and a conv head back to the action size.
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch
from torch import Tensor, nn

from lerobot_cli.policies.diffusion.config import FINAL_CONV_GROUPS, DiffusionConfig


class DiffusionSinusoidalPosEmb(nn.Module):
    """``(B,)`` timesteps -> ``(B, dim)``: sines then cosines at geometric frequencies 1 … 1/10000."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, t: Tensor) -> Tensor:
        half = self.dim // 2
        freqs = torch.exp(torch.arange(half, device=t.device) * -(math.log(10000) / (half - 1)))
        angles = t.unsqueeze(-1) * freqs.unsqueeze(0)
        return torch.cat((angles.sin(), angles.cos()), dim=-1)


class DiffusionConv1dBlock(nn.Module):
    """Conv1d (same length) -> GroupNorm -> Mish."""

    def __init__(self, cin: int, cout: int, kernel_size: int, n_groups: int = FINAL_CONV_GROUPS) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv1d(cin, cout, kernel_size, padding=kernel_size // 2),
            nn.GroupNorm(n_groups, cout),
            nn.Mish(),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class DiffusionConditionalResidualBlock1d(nn.Module):
    """Two conv blocks with FiLM from the conditioning vector in between, plus a (1x1) residual path.
    FiLM: per-channel bias, and with ``use_film_scale_modulation`` a per-channel scale too."""

    def __init__(
        self,
        cin: int,
        cout: int,
        cond_dim: int,
        kernel_size: int = 3,
        n_groups: int = 8,
        use_film_scale_modulation: bool = False,
    ) -> None:
        super().__init__()
        self.use_film_scale_modulation = use_film_scale_modulation
        self.out_channels = cout
        self.conv1 = DiffusionConv1dBlock(cin, cout, kernel_size, n_groups=n_groups)
        self.cond_encoder = nn.Sequential(
            nn.Mish(), nn.Linear(cond_dim, cout * 2 if use_film_scale_modulation else cout)
        )
        self.conv2 = DiffusionConv1dBlock(cout, cout, kernel_size, n_groups=n_groups)
        self.residual_conv = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: Tensor, cond: Tensor) -> Tensor:
        out = self.conv1(x)
        film = self.cond_encoder(cond).unsqueeze(-1)
        if self.use_film_scale_modulation:
            out = film[:, : self.out_channels] * out + film[:, self.out_channels :]
        else:
            out = out + film
        return self.conv2(out) + self.residual_conv(x)


class DiffusionConditionalUnet1d(nn.Module):
    def __init__(self, config: DiffusionConfig, global_cond_dim: int) -> None:
        super().__init__()
        embed = config.diffusion_step_embed_dim
        self.diffusion_step_encoder = nn.Sequential(
            DiffusionSinusoidalPosEmb(embed),
            nn.Linear(embed, embed * 4),
            nn.Mish(),
            nn.Linear(embed * 4, embed),
        )
        action_dim = config.action_feature.shape[0]
        dims = list(config.down_dims)
        in_out = [(action_dim, dims[0]), *pairwise(dims)]
        kw = {
            "cond_dim": embed + global_cond_dim,
            "kernel_size": config.kernel_size,
            "n_groups": config.n_groups,
            "use_film_scale_modulation": config.use_film_scale_modulation,
        }
        block = DiffusionConditionalResidualBlock1d
        self.down_modules = nn.ModuleList(
            [
                nn.ModuleList(
                    [
                        block(cin, cout, **kw),
                        block(cout, cout, **kw),
                        nn.Conv1d(cout, cout, 3, 2, 1) if i < len(in_out) - 1 else nn.Identity(),
                    ]
                )
                for i, (cin, cout) in enumerate(in_out)
            ]
        )
        self.mid_modules = nn.ModuleList([block(dims[-1], dims[-1], **kw), block(dims[-1], dims[-1], **kw)])
        # The decoder mirrors every stage but the first; each starts from the skip concatenation (2x channels)
        # and ends with a 2x transposed-convolution upsampling.
        self.up_modules = nn.ModuleList(
            [
                nn.ModuleList(
                    [
                        block(cin * 2, cout, **kw),
                        block(cout, cout, **kw),
                        nn.ConvTranspose1d(cout, cout, 4, 2, 1),
                    ]
                )
                for cout, cin in reversed(in_out[1:])
            ]
        )
        self.final_conv = nn.Sequential(
            DiffusionConv1dBlock(dims[0], dims[0], kernel_size=config.kernel_size),
            nn.Conv1d(dims[0], action_dim, 1),
        )

    def forward(self, x: Tensor, timestep: Tensor, global_cond: Tensor | None = None) -> Tensor:
        """``x``: ``(B, T, action_dim)``; ``timestep``: ``(B,)``;
        ``global_cond``: ``(B, global_cond_dim)``."""
        x = x.transpose(1, 2)
        sinusoid, mlp = self.diffusion_step_encoder[0], self.diffusion_step_encoder[1:]
        # the MLP's dtype: bf16 when FSDP2 gathers parameters in bf16 (the root unit does not cast its inputs)
        cond = mlp(sinusoid(timestep).to(self.diffusion_step_encoder[1].weight.dtype))
        if global_cond is not None:
            cond = torch.cat([cond, global_cond], dim=-1)
        skips = []
        for res1, res2, down in self.down_modules:
            x = res2(res1(x, cond), cond)
            skips.append(x)
            x = down(x)
        for mid in self.mid_modules:
            x = mid(x, cond)
        for res1, res2, up in self.up_modules:
            x = torch.cat((x, skips.pop()), dim=1)
            x = up(res2(res1(x, cond), cond))
        return self.final_conv(x).transpose(1, 2)
