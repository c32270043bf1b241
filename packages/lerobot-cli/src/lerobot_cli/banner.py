"""The start-of-run summary: what is being trained, where, on how many workers, with what batch.

It states the effective-batch arithmetic and that LR/steps are never rescaled, because those are
the two facts people get wrong when they move from one GPU to many.
"""

from __future__ import annotations

import torch
from lerobot_parallel.batching import effective_batch_line
from lerobot_parallel.runtime import ParallelRuntime
from torch import nn

from lerobot_cli.config import TrainConfig
from lerobot_cli.datasets.stream_location import remote_url

MODES = {"single": "single process", "ddp": "DDP", "fsdp": "FSDP2", "hsdp": "HSDP"}


def count_params(model: nn.Module) -> tuple[int, int]:
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def precision_line(mixed_precision: str, policy: nn.Module) -> str:
    """What the optimizer updates, read from the parameters themselves: under mixed precision fp32 masters
    (the workload and FSDP2 upcast trainable parameters); without it a policy built in low precision
    (pi0/pi05 ``--policy.dtype=bfloat16``) has its bf16 values updated directly, which rounds away every
    update smaller than a bf16 step, so that is said, with the flag that keeps fp32 masters."""
    trainable = [p for p in policy.parameters() if p.requires_grad and p.is_floating_point()]
    low = [p for p in trainable if p.dtype != torch.float32]
    autocast = mixed_precision != "no"
    if not low:
        return f"Precision: {mixed_precision}" + (" (autocast, fp32 master weights)" if autocast else "")
    dtypes = ", ".join(sorted({str(p.dtype).removeprefix("torch.") for p in low}))
    line = (
        f"Precision: {mixed_precision}{' (autocast)' if autocast else ''}; {sum(p.numel() for p in low):,} "
        f"of {sum(p.numel() for p in trainable):,} trainable parameters are {dtypes} without fp32 master "
        f"weights (the optimizer updates the {dtypes} values, as LeRobot does with --policy.dtype=bfloat16)"
    )
    return line + ("" if autocast else "; --accelerator.mixed_precision=bf16 keeps fp32 masters")


def _peft_lines(cfg: TrainConfig) -> list[str]:
    if cfg.peft is None:
        return []
    peft = cfg.peft
    targets = ", ".join(peft.target_modules) if peft.target_modules else "the policy's default targets"
    extra = f" + fully trained {', '.join(peft.full_training_modules)}" if peft.full_training_modules else ""
    return [
        (
            f"PEFT: {peft.method_type} r={peft.r} alpha={peft.lora_alpha or peft.r} on {targets}{extra}; "
            f"frozen base {cfg.policy.pretrained_path}"
        )
    ]


def _initial_weights_lines(cfg: TrainConfig) -> list[str]:
    """What a fresh policy's weights start from when its config says (FastWAM: its base model, or why
    none); a resume starts from its checkpoint instead."""
    if cfg.policy is None or cfg.resume:
        return []
    initial = cfg.policy.initial_weights()
    return [] if initial is None else [f"Initial weights: {initial.note}"]


def _ema_lines(cfg: TrainConfig, runtime: ParallelRuntime) -> list[str]:
    ema = cfg.ema
    if not ema.enable:
        return []
    decay = (
        f"constant decay {ema.decay}"
        if ema.decay is not None
        else f"decay 1-(1+t/{ema.inv_gamma})^-{ema.power} in [{ema.min_decay}, {ema.max_decay}]"
    )
    where = (
        "each rank of its own shards"
        if runtime.parallelism.is_sharded
        else "every rank"
        if runtime.is_distributed
        else "this process"
    )
    after = f", a copy for the first {ema.update_after_step} updates" if ema.update_after_step else ""
    return [f"EMA: {decay}{after}; kept by {where}; saved as pretrained_model_ema/"]


def dataset_lines(
    cfg: TrainConfig, num_frames: int, num_episodes: int, parts: list[tuple[str, int, int, float]] | None
) -> list[str]:
    """One dataset: its name and size; a mixture: each dataset with its share of the samples."""
    if not parts:
        name = cfg.dataset.repo_id or cfg.dataset.root
        return [f"Dataset: {name}: {num_frames} frames, {num_episodes} episodes"]
    weights = cfg.dataset.weights
    how = "weighted" if weights else "concatenated: each frame once per epoch"
    shares = [w / sum(weights) for w in weights] if weights else [n / num_frames for _, n, _, _ in parts]
    lines = [f"Dataset: a mixture of {len(parts)} ({how}): {num_frames} frames, {num_episodes} episodes"]
    for (name, frames, episodes, fps), share in zip(parts, shares, strict=True):
        lines.append(f"  {name}: {frames} frames, {episodes} episodes at {fps:g} fps, {share:.1%} of samples")
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def streaming_lines(cfg: TrainConfig, dp_world_size: int) -> list[str]:
    """How a streamed dataset is read: readers, shuffle buffer and the bound on cached remote bytes."""
    d = cfg.dataset
    if not d.streaming:
        return []
    workers = max(1, cfg.num_workers)
    url = None if d.is_mixture else remote_url(d)
    where = "" if url is None else f" from {url}" + (f" at {d.revision}" if d.revision else "")
    line = (
        f"Streaming{where}: {_count(dp_world_size * workers, 'reader')} ({_count(dp_world_size, 'rank')} x "
        f"{_count(workers, 'worker')}), each "
        f"reading its own episodes, shuffling among {d.streaming_buffer_size} frames and caching at most "
        f"{d.streaming_cache_mb} MiB of remote files in memory"
    )
    return [line]


def _rename_lines(cfg: TrainConfig) -> list[str]:
    """``--rename_map``: which dataset observation the policy sees under which of its input names."""
    if not cfg.rename_map:
        return []
    pairs = ", ".join(f"{old} → {new}" for old, new in cfg.rename_map.items())
    return [f"Rename: {pairs} (--rename_map, applied and saved by the pre-processor)"]


def augmentation_lines(cfg: TrainConfig) -> list[str]:
    """``--dataset.image_transforms``: which transforms, how many per camera frame, how they are drawn."""
    t = cfg.dataset.image_transforms
    names = [name for name, tf in t.tfs.items() if tf.weight > 0]
    n = min(len(names), t.max_num_transforms)
    if not t.enable or n == 0:
        return []
    order = "in a random order" if t.random_order else "in this order"
    line = (
        f"Image transforms: {n} of {', '.join(names)} per camera frame of training items, {order}, "
        "drawn per sample from (seed, epoch, index); held-out frames are not transformed"
    )
    return [line]


def banner_lines(
    cfg: TrainConfig,
    runtime: ParallelRuntime,
    policy: nn.Module,
    num_frames: int,
    num_episodes: int,
    start_step: int = 0,
    parts: list[tuple[str, int, int, float]] | None = None,
) -> list[str]:
    """``parts``: a mixture's datasets as (name, frames, episodes, fps)."""
    p = runtime.parallelism
    learnable, total = count_params(policy)
    k = cfg.accelerator.gradient_accumulation.steps
    lines = [
        f"Job: {cfg.job_name}  →  {cfg.output_dir}",
        (
            f"Launch: {runtime.launcher}, world size {runtime.world_size}; "
            f"topology dp_replicate={p.dp_replicate} x dp_shard={p.dp_shard} ({MODES.get(p.mode, p.mode)})"
        ),
        f"Backend: {runtime.backend or 'none (one process)'}; device {runtime.device}",
        precision_line(cfg.accelerator.mixed_precision, policy),
        *dataset_lines(cfg, num_frames, num_episodes, parts),
        *_rename_lines(cfg),
        *streaming_lines(cfg, runtime.dp_world_size),
        *augmentation_lines(cfg),
        f"Policy: {cfg.policy.type}; learnable params {learnable:,} / total {total:,}",
        *_initial_weights_lines(cfg),
        *_peft_lines(cfg),
        *_ema_lines(cfg, runtime),
        effective_batch_line(cfg.batch_size, p.dp_world_size, k),
        f"Steps: {cfg.steps} loop steps (micro-batches per worker) = {cfg.steps // k} optimizer "
        f"update{'' if cfg.steps // k == 1 else 's'}"
        + (f"; resuming at step {start_step}" if start_step else ""),
        (
            "Note: the learning rate and step count are not rescaled for the effective batch size; "
            "adjust --optimizer.lr / --steps yourself when you scale out."
        ),
    ]
    if cfg.eval_steps > 0 and cfg.policy is not None:
        lines.append(f"Eval loss: eval/loss is {cfg.policy.eval_loss_description()}")
    if k > 1 and cfg.save_checkpoint:
        every = f"every {cfg.save_freq} loop steps and " if cfg.save_freq else ""
        lines.append(
            f"Checkpoints: {every}at step {cfg.steps}, on gradient-accumulation window boundaries (an "
            f"interrupt finishes its window of {k} micro-batches before it saves)"
        )
    return lines
