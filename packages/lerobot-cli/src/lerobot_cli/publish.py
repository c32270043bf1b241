"""Publish the final policy to the Hub from the main rank, as one collective step of the run.

Only ``pretrained_model/`` goes up (and, with ``--ema.enable=true``, ``pretrained_model_ema/`` to the
sibling repository ``<repo_id>-ema``, as LeRobot publishes its EMA weights) (weights, configs, processor
files, a model card written from the run's facts), never training state or shards;
``lerobot_ckpt.push_to_hub`` picks the files by name. Every rank takes part so that a failed upload ends the
whole job with the same error instead of leaving ranks waiting.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from lerobot_ckpt import push_to_hub
from lerobot_parallel.batching import effective_batch_size
from lerobot_parallel.runtime import ParallelRuntime

from lerobot_cli.config import TrainConfig
from lerobot_cli.hubcheck import wants_publish


class PublishError(RuntimeError):
    pass


__all__ = ["PublishError", "ema_repo_id", "model_card", "publish", "wants_publish"]


def model_card(
    cfg: TrainConfig, runtime: ParallelRuntime, repo_id: str | None = None, ema: bool = False
) -> str:
    p = runtime.parallelism
    k = cfg.accelerator.gradient_accumulation.steps
    eff = effective_batch_size(cfg.batch_size, p.dp_world_size, k)
    tags = ["lerobot", "robotics", cfg.policy.type, *(cfg.policy.tags or [])]
    lines = ["---", "library_name: lerobot", "tags:", *[f"- {t}" for t in dict.fromkeys(tags)]]
    if cfg.policy.license:
        lines.append(f"license: {cfg.policy.license}")
    if cfg.dataset.repo_id:
        lines += ["datasets:", f"- {cfg.dataset.repo_id}"]
    lines += [
        "---",
        "",
        f"# {(repo_id or cfg.policy.repo_id).split('/')[-1]}",
        "",
        f"A `{cfg.policy.type}` policy trained with `lerobot-train`"
        + (f": the EMA of the weights published as `{cfg.policy.repo_id}`." if ema else "."),
        "",
        "| | |",
        "|---|---|",
        f"| policy | `{cfg.policy.type}` |",
        f"| dataset | `{cfg.dataset.repo_id}` |",
        f"| steps | {cfg.steps} loop steps |",
        f"| effective batch | {cfg.batch_size} x {p.dp_world_size} dp workers x {k} grad accum = {eff} |",
        (
            f"| topology | world size {runtime.world_size}, dp_replicate={p.dp_replicate} x "
            f"dp_shard={p.dp_shard} ({p.mode}) |"
        ),
        f"| precision | {cfg.accelerator.mixed_precision} |",
        "",
        f"Load it with `--policy.path={repo_id or cfg.policy.repo_id}` or LeRobot's `from_pretrained`.",
        "",
    ]
    return "\n".join(lines)


def ema_repo_id(cfg: TrainConfig) -> str:
    """Where the EMA weights go: LeRobot's ``<repo_id>-ema``."""
    return f"{cfg.policy.repo_id}-ema"


def publish(
    cfg: TrainConfig, runtime: ParallelRuntime, pretrained: Path, *, ema: bool = False
) -> list[str] | None:
    """Collective: the main rank uploads, every rank learns whether it worked. ``ema``: ``pretrained`` is
    the checkpoint's ``pretrained_model_ema/``, published to :func:`ema_repo_id`."""
    uploaded, error = None, ""
    repo_id = ema_repo_id(cfg) if ema else cfg.policy.repo_id
    if runtime.is_main:
        try:
            what = "EMA weights of a" if ema else "Upload"
            uploaded = push_to_hub(
                pretrained,
                repo_id,
                private=bool(cfg.policy.private),
                card=model_card(cfg, runtime, repo_id, ema),
                commit_message=f"{what} {cfg.policy.type} policy trained by lerobot-train",
            )
        except Exception as exc:  # noqa: BLE001 - any Hub/transport failure: one sentence for every rank
            error = f"publishing {pretrained} to {repo_id} failed ({type(exc).__name__}: {exc})"
    if runtime.is_distributed:
        flag = torch.tensor([1 if error else 0], dtype=torch.int64, device=runtime.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and not error:
            error = f"publishing to {repo_id} failed on the main rank"
    if error:
        raise PublishError(error)
    return uploaded
