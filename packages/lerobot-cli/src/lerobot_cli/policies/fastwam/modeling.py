"""``FastWAMPolicy``: the trainable FastWAM module behind ``--policy.type=fastwam``, its loss and its actions.

The networks are the policy's ``model``, a :class:`FastWAMModel` (``model.py``: LeRobot 0.6.1's state-dict
names, shapes and dtypes, and the core passes: the joint MoT prediction of video and action velocities, the
first-frame prefill and the cached action prediction); :class:`FastWAMPolicy` adds what LeRobot's
``FastWAMPolicy`` and ``FastWAM`` do around them, with LeRobot's numbers:

- ``forward(batch) -> (loss, parts)``: the cameras as one video (``video.py``), cast to ``torch_dtype``,
  mapped [0, 1] -> [-1, 1] and encoded by the frozen VAE; the text context (below); the state's first frame
  as one more context token; the training draws (``loss.draw_targets``: video noise, video timesteps, action
  noise, action timesteps, in that order from the global RNG); the joint pass; ``lambda_video · video loss
  + lambda_action · action loss`` (``action_is_pad`` masks; ``image_is_pad`` only when the batch names it,
  as LeRobot). ``parts`` are ``loss_video`` / ``loss_action`` lambda-weighted as LeRobot logs them, but as
  detached 0-d tensors: the training loop reads no device value in a step.
- ``predict_action_chunk`` / ``select_action``: LeRobot's ``infer_action`` one sample at a time: the first
  frame's latents, the video K/V prefilled once, ``num_inference_steps`` Euler steps of the action expert
  from noise drawn in float32 by ``torch.Generator(rand_device).manual_seed(inference_seed)`` (every
  sample of a batch starts from the same noise, as in LeRobot; a null seed draws from the global RNG), on
  the action schedule's ``infer_shift`` grid (``sigma_shift`` overrides it); float32 out.

The text context comes, in this order, from the batch's own ``context`` / ``context_mask`` (LeRobot's batch
accepts them), from precomputed per-task contexts (:meth:`FastWAMPolicy.use_task_contexts`, ``contexts.py``)
when the batch has a ``task`` and no ``prompt``, else from the prompt (the batch's ``prompt``, or
``prompt_template`` around its ``task``) through the frozen UMT5. At inference LeRobot refuses a batch with
both a prompt and a context; here the context wins, as it does in training.

The frozen Wan2.2 VAE and UMT5 text encoder (``FrozenParts``) are not part of this module (not in its state
dict, parameters, optimizer or FSDP units), as in LeRobot. The policy builds them when it is built
(``frozen.build_frozen_parts``: loaded from ``sources.py``'s offline resolution, or, with ``variant=tiny``,
built from config with fixed seeds; not at all on the meta device, where a dry run plans the networks) and
moves them to its parameters' device and ``torch_dtype`` itself at first use, so every rank holds its copy
where it computes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lerobot_cli.policies.common.index_draws import index_keyed_draws
from lerobot_cli.policies.fastwam.config import FastWAMConfig
from lerobot_cli.policies.fastwam.contexts import TaskContexts
from lerobot_cli.policies.fastwam.dtypes import TORCH_DTYPES
from lerobot_cli.policies.fastwam.frozen import FrozenParts, build_frozen_parts, build_prompt_encoder
from lerobot_cli.policies.fastwam.loss import FlowTargets, action_loss, draw_targets, video_loss
from lerobot_cli.policies.fastwam.model import FastWAMModel
from lerobot_cli.policies.fastwam.schedule import FlowSchedule
from lerobot_cli.policies.fastwam.text import PromptEncoder, batch_prompts
from lerobot_cli.policies.fastwam.video import inference_image, stack_video

OBS_STATE = "observation.state"
ACTION = "action"


class _Compiled:
    """The compiled cached action step, held outside the module tree; a deepcopy (an EMA shadow) starts
    without one (it compiles its own at its first use)."""

    def __init__(self) -> None:
        self.step: Callable[..., Tensor] | None = None

    def __deepcopy__(self, memo: dict) -> _Compiled:
        return _Compiled()


class FastWAMPolicy(nn.Module):
    """FastWAM's trainable part (``self.model``), its loss and its action inference; see the module
    docstring."""

    name: ClassVar[str] = "fastwam"
    config_class: ClassVar[type[FastWAMConfig]] = FastWAMConfig
    # lerobot-parallel's own reading of a bare model (build_plan without defaults); the spec is the source.
    _fsdp_wrap_modules: ClassVar[list[str]] = list(FastWAMConfig.spec.wrap_units)
    _fsdp_no_forward_modules: ClassVar[tuple[str, ...]] = FastWAMConfig.spec.no_forward_modules

    def __init__(self, config: FastWAMConfig, frozen: FrozenParts | None = None) -> None:
        """``frozen``: the VAE and prompt encoder to use (tests); by default built from ``config`` (see
        :func:`build_frozen_parts`), except on the meta device, where they are built at their first use."""
        super().__init__()
        config.validate_features()
        self.config = config
        self.model = FastWAMModel(config)
        if config.freeze_video_expert:
            self._freeze_video_expert()
        video, action = config.video_scheduler, config.action_scheduler
        with torch.device("cpu"):  # host statistics, also when the networks are built on the meta device
            self.video_schedule = FlowSchedule(int(video["num_train_timesteps"]), float(video["train_shift"]))
            self.action_schedule = FlowSchedule(
                int(action["num_train_timesteps"]), float(action["train_shift"])
            )
            self.action_infer_schedule = FlowSchedule(
                int(action["num_train_timesteps"]), float(action["infer_shift"])
            )
        if frozen is None and torch.get_default_device().type != "meta":
            frozen = build_frozen_parts(config)
        # plain attributes (nn.Module keeps non-module objects out of its tree, state dict and parameters)
        self.frozen: FrozenParts | None = frozen
        self.task_contexts: TaskContexts | None = None
        self._compiled = _Compiled()
        self.reset()

    def _freeze_video_expert(self) -> None:
        """The video expert's embeddings, head and its block in every layer: no gradient, no optimizer state,
        no DDP bucket (LeRobot's ``freeze_video_expert``; the weights stay as loaded)."""
        self.model.video_expert.requires_grad_(False)
        for layer in self.model.mot.layers:
            layer.blocks["video"].requires_grad_(False)

    def get_optim_params(self) -> list[nn.Parameter]:
        """The trainable parameters of the mixture and the proprio encoder (LeRobot's one parameter group)."""
        params = list(self.model.dit.parameters())
        if self.model.proprio_encoder is not None:
            params += list(self.model.proprio_encoder.parameters())
        return [p for p in params if p.requires_grad]

    def reset(self) -> None:
        """Drop queued actions; call when an episode starts."""
        self._action_queue: deque[Tensor] = deque(maxlen=self.config.n_action_steps)

    def use_task_contexts(self, contexts: TaskContexts | None) -> None:
        """Read each batch's context from ``contexts`` by its ``task`` (see ``contexts.py``) instead of
        encoding the prompt; None: encode again. A batch's own ``context`` / ``context_mask`` still win."""
        if contexts is not None:
            width = int(self.config.video_dit_config["text_dim"])
            if contexts.context.shape[-1] != width:
                raise ValueError(
                    f"the precomputed task contexts are {contexts.context.shape[-1]} wide, the policy's "
                    f"text_dim is {width}"
                )
            if contexts.template != self.config.prompt_template:
                raise ValueError(
                    f"the precomputed task contexts were made with the prompt template "
                    f"{contexts.template!r}, not --policy.prompt_template={self.config.prompt_template!r}"
                )
        self.task_contexts = contexts

    # -- pieces ------------------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        """``torch_dtype``: what inputs are cast to, as LeRobot casts them (whatever the parameters hold)."""
        return TORCH_DTYPES[self.config.torch_dtype]

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def frozen_parts(self) -> FrozenParts:
        """The frozen parts on this policy's device (built first if the policy was built on the meta
        device); moved there at the first call after the policy moved."""
        if self.frozen is None:
            self.frozen = build_frozen_parts(self.config)
        device = self._device()
        if self.frozen.vae.device != device:
            self.frozen.to(device)
        return self.frozen

    def _context(
        self, batch: Mapping[str, Any], frozen: FrozenParts, device: torch.device
    ) -> tuple[Tensor, Tensor]:
        """``(context [B, L, D] in torch_dtype, context_mask [B, L] bool)`` on ``device``; see the module
        docstring for the order of the sources."""
        context, mask = batch.get("context"), batch.get("context_mask")
        if context is None or mask is None:
            task = batch.get("task")
            if self.task_contexts is not None and batch.get("prompt") is None and task is not None:
                context, mask = self.task_contexts.lookup(task, device)
            else:
                prompt = batch_prompts(batch, self.config.prompt_template)
                if prompt is None:
                    raise KeyError(
                        "FastWAM needs the batch's task (or prompt) to encode, or precomputed "
                        "context/context_mask"
                    )
                context, mask = self._prompt_encoder(frozen, device).encode(prompt)
        if context.ndim == 2 and mask.ndim == 1:  # one sample's context
            context, mask = context.unsqueeze(0), mask.unsqueeze(0)
        if context.ndim != 3 or mask.ndim != 2 or tuple(mask.shape) != tuple(context.shape[:2]):
            raise ValueError(
                f"context/context_mask must be [B, L, D] / [B, L], got {list(context.shape)} and "
                f"{list(mask.shape)}"
            )
        return context.to(device=device, dtype=self.dtype), mask.to(device=device, dtype=torch.bool)

    def _prompt_encoder(self, frozen: FrozenParts, device: torch.device) -> PromptEncoder:
        """UMT5 on ``device``; built here at the first prompt when the policy was built without it (a
        ``precompute_task_contexts`` config used for inference, say)."""
        if frozen.prompts is None:
            if not self.config.load_text_encoder:
                raise ValueError(
                    "--policy.load_text_encoder=false: batches must carry context/context_mask, or "
                    "the policy needs precomputed task contexts (use_task_contexts)"
                )
            frozen.prompts = build_prompt_encoder(self.config)
            frozen.prompts.encoder.to(device)
        return frozen.prompts

    def _proprio(self, batch: Mapping[str, Any], batch_size: int) -> Tensor | None:
        """The state the proprio token encodes, ``[B, proprio_dim]``: the batch's ``proprio`` or
        ``observation.state``, its first frame when it has a time axis (LeRobot reads frame 0)."""
        if self.model.proprio_encoder is None:
            return None
        proprio = batch.get("proprio", batch.get(OBS_STATE))
        if proprio is None:
            raise KeyError(
                f"--policy.proprio_dim={self.config.proprio_dim} needs observation.state in the batch "
                "(or --policy.proprio_dim=null)"
            )
        if proprio.ndim == 1:
            proprio = proprio.unsqueeze(0)
        if proprio.ndim == 3:
            proprio = proprio[:, 0]
        if proprio.ndim != 2 or tuple(proprio.shape) != (batch_size, self.config.proprio_dim):
            raise ValueError(
                f"observation.state must be [B, {self.config.proprio_dim}] or [B, T, "
                f"{self.config.proprio_dim}] with B = {batch_size}, got {list(proprio.shape)}"
            )
        return proprio

    def _training_video(self, batch: Mapping[str, Any]) -> Tensor:
        video = batch.get("video")
        if video is None:
            video = stack_video(
                batch, image_size=self.config.image_size, model_video_frames=self.config.model_video_frames
            )
        if video.ndim != 5 or video.shape[1] != 3:
            raise ValueError(f"the FastWAM video must be [B, 3, T, H, W], got {list(video.shape)}")
        frames, height, width = video.shape[2:]
        if height % 16 or width % 16:
            raise ValueError(f"the video's height and width must be multiples of 16, got {height}x{width}")
        if frames % 4 != 1 or frames < 5:
            raise ValueError(
                f"the video has {frames} frames; the Wan VAE needs 4k + 1 with k >= 1 (5, 9, …, 33): check "
                "the observation delta indices (--policy.num_video_frames / action_video_freq_ratio)"
            )
        return video

    @staticmethod
    def _check_pad(name: str, is_pad: Tensor | None, shape: tuple[int, int]) -> Tensor | None:
        if is_pad is not None and tuple(is_pad.shape) != shape:
            raise ValueError(f"{name} must be [B, T] = {list(shape)}, got {list(is_pad.shape)}")
        return is_pad

    # -- training ----------------------------------------------------------------------------------------
    def forward(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        """LeRobot's FastWAM training loss for a (pre-processed) batch: ``(loss, {"loss_video",
        "loss_action"})``, the parts lambda-weighted and detached (0-d tensors, no host read)."""
        frozen = self.frozen_parts()
        device, dtype = self._device(), self.dtype
        video = self._training_video(batch)
        if ACTION not in batch:
            raise KeyError("FastWAM training needs the batch's action")
        action = batch[ACTION]
        batch_size, frames = video.shape[0], video.shape[2]
        if action.ndim != 3 or action.shape[0] != batch_size:
            raise ValueError(
                f"the action must be [B, horizon, dim] with B = {batch_size}, got {list(action.shape)}"
            )
        horizon = action.shape[1]
        if horizon % (frames - 1):
            raise ValueError(
                f"the action horizon {horizon} must be divisible by the video's {frames - 1} transitions"
            )
        action_is_pad = self._check_pad("action_is_pad", batch.get("action_is_pad"), (batch_size, horizon))
        image_is_pad = self._check_pad("image_is_pad", batch.get("image_is_pad"), (batch_size, frames))

        latents = frozen.vae.encode_video(video, dtype=dtype)  # float32, no graph (the VAE is frozen)
        context, context_mask = self._context(batch, frozen, device)
        proprio = self._proprio(batch, batch_size)
        if proprio is not None:
            proprio = proprio.to(device=device, dtype=dtype)
        context, context_mask = self.model.append_proprio(context, context_mask, proprio)
        action = action.to(device=device, dtype=dtype)
        if action_is_pad is not None:
            action_is_pad = action_is_pad.to(device=device, dtype=torch.bool)
        if image_is_pad is not None:
            image_is_pad = image_is_pad.to(device=device, dtype=torch.bool)

        targets = self._draw_targets(batch, latents, action)
        pred_video, pred_action = self.model.predict(
            targets.latents,
            targets.timestep_video,
            targets.noisy_action,
            targets.timestep_action,
            context,
            context_mask,
            video_actions=action,
        )
        loss_video = video_loss(
            pred_video,
            targets.target_video,
            targets.timestep_video,
            self.video_schedule,
            True,
            image_is_pad,
            temporal_factor=frozen.vae.temporal_downsample_factor,
        )
        loss_action = action_loss(
            pred_action, targets.target_action, targets.timestep_action, self.action_schedule, action_is_pad
        )
        lambda_video, lambda_action = (
            float(self.config.loss["lambda_video"]),
            float(self.config.loss["lambda_action"]),
        )
        loss = lambda_video * loss_video + lambda_action * loss_action
        return loss, {
            "loss_video": lambda_video * loss_video.detach(),
            "loss_action": lambda_action * loss_action.detach(),
        }

    def _draw_targets(self, batch: Mapping[str, Any], latents: Tensor, action: Tensor) -> FlowTargets:
        """The step's noise and timesteps. With the batch's dataset ``index`` each sample draws its own, on
        the host, from one draw of the global RNG plus its index (LeRobot's four draws in LeRobot's order),
        so a sample gets the same draws whichever rank and micro-batch it lands in: one process, DDP, FSDP
        and HSDP train alike on one global batch (every rank seeds the global RNG alike and draws in
        lockstep; a resume restores it), as pi0's and diffusion's do. Without an ``index`` (a foreign batch)
        the draws come from the global RNG directly, as in LeRobot (``loss.draw_targets``)."""
        index = batch.get("index")
        if not isinstance(index, Tensor) or index.numel() != latents.shape[0]:
            return draw_targets(latents, action, self.video_schedule, self.action_schedule, True)
        noise_video, timestep_video, noise_action, timestep_action = index_keyed_draws(
            index,
            lambda: (
                torch.randn((1, *latents.shape[1:]), dtype=latents.dtype),
                self.video_schedule.sample_timesteps(1, "cpu", latents.dtype),
                torch.randn((1, *action.shape[1:]), dtype=action.dtype),
                self.action_schedule.sample_timesteps(1, "cpu", action.dtype),
            ),
            latents.device,
        )
        noisy_latents = self.video_schedule.noisy(latents, noise_video, timestep_video)
        noisy_latents[:, :, 0:1] = latents[:, :, 0:1]  # the clean first frame, as draw_targets keeps it
        return FlowTargets(
            latents=noisy_latents,
            target_video=self.video_schedule.velocity(latents, noise_video),
            timestep_video=timestep_video,
            noisy_action=self.action_schedule.noisy(action, noise_action, timestep_action),
            target_action=self.action_schedule.velocity(action, noise_action),
            timestep_action=timestep_action,
        )

    # -- inference ---------------------------------------------------------------------------------------
    def _action_step(self) -> Callable[..., Tensor]:
        """One cached action prediction; ``torch.compile``d once per policy with ``compile_action_infer``
        (CUDA graphs on a GPU, as LeRobot's reduce-overhead mode)."""
        if not self.config.compile_action_infer:
            return self.model.predict_action
        if self._compiled.step is None:
            device = self._device()
            self.model.action_expert.rope.on(device)  # built before tracing: no guard on the lazy table
            mode = "reduce-overhead" if device.type == "cuda" else None
            self._compiled.step = torch.compile(self.model.predict_action, mode=mode, fullgraph=True)
        return self._compiled.step

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Any]) -> Tensor:
        """``[B, action_horizon, action_dim]`` normalised actions in float32 (LeRobot's ``infer_action`` per
        sample); puts the policy in eval mode."""
        self.eval()
        frozen = self.frozen_parts()
        device = self._device()
        images = inference_image(
            batch, image_size=self.config.image_size, model_video_frames=self.config.model_video_frames
        )
        batch_size = images.shape[0]
        proprio = self._proprio(batch, batch_size)
        seed = batch.get("seed", self.config.inference_seed)
        rand_device = batch.get("rand_device", self.config.rand_device)
        steps = int(batch.get("num_inference_steps", self.config.num_inference_steps))
        shift = batch.get("sigma_shift", self.config.sigma_shift)
        timesteps, deltas = self.action_infer_schedule.inference_steps(
            steps, device, self.dtype, shift=None if shift is None else float(shift)
        )
        step = self._action_step()
        chunks = []
        for i in range(batch_size):
            sample = _one_sample(batch, i, batch_size)
            generator = None if seed is None else torch.Generator(device=rand_device).manual_seed(int(seed))
            latents = torch.randn(
                (1, self.config.action_horizon, self.config.action_dim),
                generator=generator,
                device=rand_device,
                dtype=torch.float32,
            ).to(device=device, dtype=self.dtype)
            first_frame = frozen.vae.encode_image(images[i : i + 1].to(device=device, dtype=self.dtype))
            context, context_mask = self._context(sample, frozen, device)
            token = None if proprio is None else proprio[i : i + 1].to(device=device, dtype=self.dtype)
            context, context_mask = self.model.append_proprio(context, context_mask, token)
            cache = self.model.prefill(first_frame, context, context_mask, self.config.action_horizon)
            for timestep, delta in zip(timesteps, deltas, strict=True):
                if self._compiled.step is not None and device.type == "cuda":
                    torch.compiler.cudagraph_mark_step_begin()
                velocity = step(cache, latents, timestep.unsqueeze(0), context, context_mask)
                latents = FlowSchedule.euler(velocity, delta, latents)
            chunks.append(latents.to(torch.float32))
        return torch.cat(chunks).to(_batch_device(batch))

    @torch.no_grad()
    def select_action(self, batch: dict[str, Any]) -> Tensor:
        """The ``[B, action_dim]`` action for this step, from the queue refilled with the first
        ``n_action_steps`` of a new chunk when it runs empty."""
        self.eval()
        if not self._action_queue:
            chunk = self.predict_action_chunk(batch)[:, : self.config.n_action_steps]
            self._action_queue.extend(chunk.transpose(0, 1))
        return self._action_queue.popleft()


def _one_sample(batch: Mapping[str, Any], index: int, batch_size: int) -> dict[str, Any]:
    """Sample ``index`` of a batch as LeRobot slices its inference inputs: a tensor with the batch as its
    first dimension and a list of ``batch_size`` items are indexed, anything else is shared."""
    out = {}
    for key, value in batch.items():
        if isinstance(value, Tensor) and value.ndim > 0 and value.shape[0] == batch_size:
            out[key] = value[index : index + 1]
        elif isinstance(value, (list, tuple)) and len(value) == batch_size:
            out[key] = value[index]
        else:
            out[key] = value
    return out


def _batch_device(batch: Mapping[str, Any]) -> torch.device:
    """The device of the batch's first tensor (LeRobot returns the chunk there), else the CPU."""
    return next((v.device for v in batch.values() if isinstance(v, Tensor)), torch.device("cpu"))
