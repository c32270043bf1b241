"""``--policy.precompute_task_contexts=true``: each task's text context encoded once per training run.

FastWAM's context depends on the task text alone (``text.py``, ``contexts.py``), and a dataset has few tasks
(LIBERO: 40) while UMT5-XXL is 5.68 B parameters, 10.58 GiB in bf16, held by every rank that encodes
prompts. With this switch the job's main rank builds UMT5 once before the policy is wrapped, encodes every
task of the dataset (``meta/tasks.parquet``: training and held-out episodes alike) on its device, drops the
encoder and broadcasts the ``[tasks, tokenizer_max_len, text_dim]`` table; every rank then picks its batch's
rows from its own copy (1 MiB per task at full size in bf16). No rank builds UMT5 with the policy
(``frozen.holds_prompt_encoder``), so while training none holds it, on the GPU or in host memory; the
banner says what each rank holds and what it saved, summed over the ranks from what each one holds.

The saved policy is unchanged (``load_text_encoder`` stays true, so LeRobot encodes the prompt at inference,
and so does this policy, building UMT5 at its first prompt). The contexts equal encoding on the fly up to the
rounding of a differently sized matrix product (``contexts.py``), so the losses are the same
(tests/test_fastwam_task_contexts.py, without mixed precision: under autocast the on-the-fly encoder runs in
bf16, the precomputed one in torch_dtype). The table is recomputed at every start, a resume included: a cached
file could outlive a change of the encoder's weights at the same path, and one start's encoding of a few dozen
prompts is cheap beside the training it saves memory for. Reads a ``FastWAMConfig`` without importing it (the
config imports this module).
"""

from __future__ import annotations

import torch
from torch import nn

from lerobot_cli.policies.fastwam.contexts import TaskContexts, precompute_task_contexts
from lerobot_cli.policies.fastwam.dtypes import TORCH_DTYPES
from lerobot_cli.policies.fastwam.frozen import build_prompt_encoder
from lerobot_cli.policies.training_run import TrainingRun

GiB, MiB = 1 << 30, 1 << 20


def _fastwam(policy: nn.Module) -> nn.Module:
    """The FastWAM policy under a PEFT wrapper (the policy itself otherwise)."""
    get_base_model = getattr(policy, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else policy


def _bytes(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.2f} MiB"


def prepare_task_contexts(config, policy: nn.Module, run: TrainingRun) -> list[str]:
    """FastWAM's ``PolicyConfig.prepare_training``: the task contexts computed on the main rank, shared with
    every rank and set on its policy (see the module docstring); the banner's line. Nothing without
    ``precompute_task_contexts``."""
    if not config.precompute_task_contexts:
        return []
    tasks = tuple(dict.fromkeys(run.tasks))  # one row per distinct text, the same order on every rank
    if not tasks:
        raise ValueError("--policy.precompute_task_contexts=true: the dataset has no tasks to encode")
    fastwam = _fastwam(policy)
    shape = (len(tasks), config.tokenizer_max_len, int(config.video_dit_config["text_dim"]))
    table = torch.empty(shape, dtype=TORCH_DTYPES[config.torch_dtype], device=run.device)
    encoder_bytes = 0
    if run.is_main:
        prompts = build_prompt_encoder(config)
        prompts.encoder.to(run.device)
        encoder_bytes = sum(
            t.numel() * t.element_size() for t in (*prompts.encoder.parameters(), *prompts.encoder.buffers())
        )
        made = precompute_task_contexts(tasks, prompts, template=config.prompt_template)
        del prompts
        if run.device.type == "cuda":
            torch.cuda.empty_cache()
        if tuple(made.context.shape) != shape or made.context.dtype != table.dtype:
            raise ValueError(
                f"the text encoder made contexts {list(made.context.shape)} {made.context.dtype}, not "
                f"{list(shape)} {table.dtype} (--policy.tokenizer_max_len, text_dim, torch_dtype)"
            )
        table.copy_(made.context)
    run.broadcast(table)
    fastwam.use_task_contexts(
        TaskContexts(
            tasks=tasks,
            context=table,
            template=config.prompt_template,
            source={"text_encoder": config.text_encoder_model_id, "tokenizer": config.tokenizer_model_id},
        )
    )
    frozen = fastwam.frozen
    holding = run.sum_over_ranks(int(frozen is not None and frozen.prompts is not None))
    encoder_bytes = run.sum_over_ranks(encoder_bytes)  # the main rank's measure, told to every rank
    line = (
        f"Task contexts: {len(tasks)} task(s) encoded once on rank 0, {_bytes(table.nbytes)} per rank; "
        f"the text encoder ({_bytes(encoder_bytes)}) is held by {holding} of {run.world_size} rank(s) "
        "while training (--policy.precompute_task_contexts=true)"
    )
    return [line]


def frozen_parts_note(config) -> str:
    """``--dry_run``'s line on the frozen parts, which no FSDP unit holds (so every rank holds them whole,
    beside its shards): their parameter bytes in ``torch_dtype``, counted on the meta device, and what
    ``precompute_task_contexts`` leaves each rank instead of UMT5. The tiny variant's parts are built from
    a vocabulary the tokenizer sets, so they are not counted: they are a few hundred KiB."""
    from lerobot_cli.policies.fastwam.text import umt5_parameter_count
    from lerobot_cli.policies.fastwam.vae import wan_vae_parameter_count

    if config.variant == "tiny":
        return "Frozen, outside the plan, on every rank: the tiny VAE and UMT5 built from config (KiB)"
    size = TORCH_DTYPES[config.torch_dtype].itemsize
    vae = f"the Wan2.2 VAE {_bytes(wan_vae_parameter_count() * size)}"
    if not config.load_text_encoder:
        return f"Frozen, outside the plan, on every rank: {vae} (no text encoder: the batches carry contexts)"
    umt5 = _bytes(umt5_parameter_count() * size)
    per_task = _bytes(config.tokenizer_max_len * int(config.video_dit_config["text_dim"]) * size)
    if config.precompute_task_contexts:
        return (
            f"Frozen, outside the plan, on every rank: {vae}; UMT5 ({umt5}) only on rank 0 at the start, to "
            f"encode each task once: every rank then holds {per_task} of context per task "
            "(--policy.precompute_task_contexts=true)"
        )
    return (
        f"Frozen, outside the plan, on every rank: {vae} and UMT5 {umt5}, in {config.torch_dtype}; "
        f"--policy.precompute_task_contexts=true keeps UMT5 off every rank while training ({per_task} of "
        "context per task instead)"
    )
