"""``DiffusionPolicy``: the trainable module behind ``--policy.type=diffusion``.

Works on batches the pre-processor already normalised. Training: encode the ``n_obs_steps`` observations
(state, every camera through its RGB encoder, environment state) into one conditioning vector, noise the
``horizon``-step action trajectory at a random timestep, and regress the noise (``epsilon``) or the clean
trajectory (``sample``) with an MSE. Inference: run the reverse chain (DDPM or DDIM) from Gaussian noise
and keep ``n_action_steps`` actions from the current step on. Parameters live under ``diffusion`` so
``state_dict`` keys equal LeRobot's (``diffusion.unet.mid_modules.0.conv1.block.0.weight``).

Random draws follow LeRobot's order (training: one ``randn`` of the trajectory's shape, then one
``randint`` of timesteps; inference: the prior, then one ``randn`` per DDPM step), so with the same seed
and weights both produce the same loss and the same actions. A training batch from this stack's
dataset carries each sample's ``index``; then each sample's noise and timestep follow its index (as
pi0's flow noise does), so data-parallel layouts of one global batch draw the same noise as one process.
"""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lerobot_cli.policies.common.index_draws import index_keyed_draws
from lerobot_cli.policies.diffusion.config import DiffusionConfig
from lerobot_cli.policies.diffusion.schedulers import make_noise_scheduler
from lerobot_cli.policies.diffusion.unet import DiffusionConditionalUnet1d
from lerobot_cli.policies.diffusion.vision import DiffusionRgbEncoder

OBS_STATE = "observation.state"
OBS_ENV_STATE = "observation.environment_state"
OBS_IMAGES = "observation.images"
ACTION = "action"
ACTION_IS_PAD = "action_is_pad"


class DiffusionModel(nn.Module):
    def __init__(self, config: DiffusionConfig) -> None:
        super().__init__()
        self.config = config
        cond_dim = config.robot_state_feature.shape[0]
        if config.image_features:
            cameras = len(config.image_features)
            if config.use_separate_rgb_encoder_per_camera:
                self.rgb_encoder = nn.ModuleList([DiffusionRgbEncoder(config) for _ in range(cameras)])
                cond_dim += self.rgb_encoder[0].feature_dim * cameras
            else:
                self.rgb_encoder = DiffusionRgbEncoder(config)
                cond_dim += self.rgb_encoder.feature_dim * cameras
        if config.env_state_feature is not None:
            cond_dim += config.env_state_feature.shape[0]
        self.unet = DiffusionConditionalUnet1d(config, global_cond_dim=cond_dim * config.n_obs_steps)
        self.noise_scheduler = make_noise_scheduler(
            config.noise_scheduler_type,
            num_train_timesteps=config.num_train_timesteps,
            beta_start=config.beta_start,
            beta_end=config.beta_end,
            beta_schedule=config.beta_schedule,
            clip_sample=config.clip_sample,
            clip_sample_range=config.clip_sample_range,
            prediction_type=config.prediction_type,
        )
        self.num_inference_steps = config.num_inference_steps or config.num_train_timesteps

    def global_conditioning(self, batch: dict[str, Tensor]) -> Tensor:
        """``(B, n_obs_steps · per-step features)``: state, camera features (camera by camera), env state."""
        b, s = batch[OBS_STATE].shape[:2]
        feats = [batch[OBS_STATE]]
        if self.config.image_features:
            images = batch[OBS_IMAGES]  # (B, S, N, C, H, W)
            if self.config.use_separate_rgb_encoder_per_camera:
                per_camera = [enc(images[:, :, i].flatten(0, 1)) for i, enc in enumerate(self.rgb_encoder)]
                feats.append(torch.cat([f.reshape(b, s, -1) for f in per_camera], dim=-1))
            else:
                out = self.rgb_encoder(images.flatten(0, 2))  # (B·S·N, D)
                feats.append(out.reshape(b, s, -1))
        if self.config.env_state_feature is not None:
            feats.append(batch[OBS_ENV_STATE])
        return torch.cat(feats, dim=-1).flatten(start_dim=1)

    def conditional_sample(
        self,
        batch_size: int,
        global_cond: Tensor,
        noise: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        param = next(self.parameters())
        sample = (
            noise
            if noise is not None
            else torch.randn(
                (batch_size, self.config.horizon, self.config.action_feature.shape[0]),
                dtype=param.dtype,
                device=param.device,
                generator=generator,
            )
        )
        scheduler = self.noise_scheduler
        scheduler.set_timesteps(self.num_inference_steps)
        for t in scheduler.timesteps.tolist():
            timestep = torch.full(sample.shape[:1], t, dtype=torch.long, device=sample.device)
            out = self.unet(sample, timestep, global_cond=global_cond)
            sample = scheduler.step(out, t, sample, generator=generator)
        return sample

    def generate_actions(self, batch: dict[str, Tensor], noise: Tensor | None = None) -> Tensor:
        b, s = batch[OBS_STATE].shape[:2]
        if s != self.config.n_obs_steps:
            raise ValueError(f"diffusion expects {self.config.n_obs_steps} observation steps, got {s}")
        actions = self.conditional_sample(b, self.global_conditioning(batch), noise=noise)
        start = s - 1
        return actions[:, start : start + self.config.n_action_steps]

    def compute_loss(
        self, batch: dict[str, Tensor], noise: Tensor | None = None, timesteps: Tensor | None = None
    ) -> Tensor:
        for key in (OBS_STATE, ACTION):
            if key not in batch:
                raise KeyError(f"diffusion batch lacks {key!r}; it has {sorted(batch)}")
        s, horizon = batch[OBS_STATE].shape[1], batch[ACTION].shape[1]
        if s != self.config.n_obs_steps or horizon != self.config.horizon:
            raise ValueError(
                f"diffusion expects {self.config.n_obs_steps} observation steps and a horizon of "
                f"{self.config.horizon} actions, got {s} and {horizon}"
            )
        global_cond = self.global_conditioning(batch)
        trajectory = batch[ACTION]
        eps = noise if noise is not None else torch.randn(trajectory.shape, device=trajectory.device)
        if timesteps is None:
            timesteps = torch.randint(
                0, self.noise_scheduler.num_train_timesteps, (trajectory.shape[0],), device=trajectory.device
            ).long()
        noisy = self.noise_scheduler.add_noise(trajectory, eps, timesteps)
        pred = self.unet(noisy, timesteps, global_cond=global_cond).to(
            trajectory.dtype
        )  # bf16 under FSDP2 bf16
        target = eps if self.config.prediction_type == "epsilon" else trajectory
        loss = F.mse_loss(pred, target, reduction="none")
        if self.config.do_mask_loss_for_padding:
            if ACTION_IS_PAD not in batch:
                raise KeyError("--policy.do_mask_loss_for_padding=true needs 'action_is_pad' in the batch")
            valid = (~batch[ACTION_IS_PAD].to(torch.bool)).unsqueeze(-1)
            return (loss * valid).sum() / (valid.sum() * loss.shape[-1]).clamp_min(1)
        return loss.mean()


class DiffusionPolicy(nn.Module):
    name: ClassVar[str] = "diffusion"
    config_class: ClassVar[type[DiffusionConfig]] = DiffusionConfig
    # lerobot-parallel's own reading of a bare model (build_plan without defaults); the spec is the source.
    _fsdp_wrap_modules: ClassVar[list[str]] = list(DiffusionConfig.spec.wrap_units)

    def __init__(self, config: DiffusionConfig) -> None:
        super().__init__()
        config.validate_features()
        self.config = config
        self.diffusion = DiffusionModel(config)
        self.reset()

    def get_optim_params(self):
        return [p for p in self.diffusion.parameters() if p.requires_grad]

    def reset(self) -> None:
        """Clear the observation and action queues; call when an episode starts."""
        n = self.config.n_obs_steps
        self._queues: dict[str, deque[Tensor]] = {
            OBS_STATE: deque(maxlen=n),
            ACTION: deque(maxlen=self.config.n_action_steps),
        }
        if self.config.image_features:
            self._queues[OBS_IMAGES] = deque(maxlen=n)
        if self.config.env_state_feature is not None:
            self._queues[OBS_ENV_STATE] = deque(maxlen=n)

    def _with_image_stack(self, batch: dict[str, Any], add_time: bool) -> dict[str, Any]:
        """``observation.images``: the cameras stacked at dim -4, ``(B, S, N, C, H, W)``."""
        if not self.config.image_features:
            return batch
        batch = dict(batch)
        missing = [key for key in self.config.image_features if key not in batch]
        if missing:
            raise KeyError(f"diffusion batch lacks camera(s) {missing}; it has {sorted(batch)}")
        images = [batch[key] for key in self.config.image_features]
        if add_time:
            images = [im.unsqueeze(1) if im.ndim == 4 else im for im in images]
        batch[OBS_IMAGES] = torch.stack(images, dim=-4)
        return batch

    def forward(
        self, batch: dict[str, Any], *, noise: Tensor | None = None, timesteps: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The diffusion MSE; ``noise``/``timesteps`` (optional) replace the random draws."""
        batch = self._with_image_stack(batch, add_time=self.config.n_obs_steps == 1)
        if noise is None and timesteps is None:
            noise, timesteps = self._draw_per_sample(batch)
        loss = self.diffusion.compute_loss(batch, noise=noise, timesteps=timesteps)
        return loss, {}

    def _draw_per_sample(self, batch: dict[str, Any]) -> tuple[Tensor | None, Tensor | None]:
        """Each sample's noise and timestep from one draw of the global RNG plus its dataset ``index``, so a
        sample gets the same draws whichever rank and micro-batch it lands in (every rank seeds the global
        RNG alike and draws in lockstep). Without an ``index`` (a foreign batch): ``(None, None)``, and the
        model draws from the global RNG directly, as LeRobot does."""
        index, actions = batch.get("index"), batch.get(ACTION)
        if (
            not isinstance(index, Tensor)
            or not isinstance(actions, Tensor)
            or index.numel() != actions.shape[0]
        ):
            return None, None
        noise, steps = index_keyed_draws(
            index,
            lambda: (
                torch.randn((1, *actions.shape[1:])),
                torch.randint(0, self.config.num_train_timesteps, (1,)),
            ),
            actions.device,
        )
        return noise, steps

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Any], noise: Tensor | None = None) -> Tensor:
        """``(B, n_action_steps, A)`` normalised actions, from the queued observations when
        ``select_action`` filled them, else from ``batch`` (``(B, n_obs_steps, …)`` observations)."""
        self.eval()
        if any(len(q) > 0 for q in self._queues.values()):
            batch = {k: torch.stack(list(self._queues[k]), dim=1) for k in batch if k in self._queues}
        else:
            batch = self._with_image_stack(batch, add_time=True)
        return self.diffusion.generate_actions(batch, noise=noise)

    @torch.no_grad()
    def select_action(self, batch: dict[str, Any], noise: Tensor | None = None) -> Tensor:
        """The ``(B, A)`` action for this step. Keeps the last ``n_obs_steps`` observations (the first
        one repeated at an episode start) and replans every ``n_action_steps`` steps."""
        self.eval()
        batch = {k: v for k, v in batch.items() if k != ACTION}
        batch = self._with_image_stack(batch, add_time=False)
        for key, queue in self._queues.items():
            if key == ACTION or key not in batch:
                continue
            while len(queue) < queue.maxlen - 1:
                queue.append(batch[key])
            queue.append(batch[key])
        if not self._queues[ACTION]:
            self._queues[ACTION].extend(self.predict_action_chunk(batch, noise=noise).transpose(0, 1))
        return self._queues[ACTION].popleft()
