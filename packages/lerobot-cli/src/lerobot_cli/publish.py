"""Publish the final policy to the Hub from the main rank, as one collective step of the run.

Only ``pretrained_model/`` goes up (weights, configs, processor files, a model card written from the run's
facts), never training state or shards; ``lerobot_ckpt.push_to_hub`` picks the files by name. Every rank takes
part so that a failed upload ends the whole job with the same error instead of leaving ranks waiting.
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


__all__ = ["PublishError", "model_card", "publish", "wants_publish"]


def model_card(cfg: TrainConfig, runtime: ParallelRuntime) -> str:
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
        "---", "", f"# {cfg.policy.repo_id.split('/')[-1]}", "",
        f"A `{cfg.policy.type}` policy trained with `lerobot-train`.", "",
        "| | |", "|---|---|",
        f"| policy | `{cfg.policy.type}` |",
        f"| dataset | `{cfg.dataset.repo_id}` |",
        f"| steps | {cfg.steps} loop steps |",
        f"| effective batch | {cfg.batch_size} x {p.dp_world_size} dp workers x {k} grad accum = {eff} |",
        f"| topology | world size {runtime.world_size}, dp_replicate={p.dp_replicate} x dp_shard={p.dp_shard} "
        f"({p.mode}) |",
        f"| precision | {cfg.accelerator.mixed_precision} |",
        "", f"Load it with `--policy.path={cfg.policy.repo_id}` or LeRobot's `from_pretrained`.", "",
    ]
    return "\n".join(lines)


def publish(cfg: TrainConfig, runtime: ParallelRuntime, pretrained: Path) -> list[str] | None:
    """Collective: the main rank uploads, every rank learns whether it worked."""
    uploaded, error = None, ""
    if runtime.is_main:
        try:
            uploaded = push_to_hub(pretrained, cfg.policy.repo_id, private=bool(cfg.policy.private),
                                   card=model_card(cfg, runtime),
                                   commit_message=f"Upload {cfg.policy.type} policy trained by lerobot-train")
        except Exception as exc:  # any Hub/transport failure becomes one sentence for every rank
            error = f"publishing {pretrained} to {cfg.policy.repo_id} failed ({type(exc).__name__}: {exc})"
    if runtime.is_distributed:
        flag = torch.tensor([1 if error else 0], dtype=torch.int64, device=runtime.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and not error:
            error = f"publishing to {cfg.policy.repo_id} failed on the main rank"
    if error:
        raise PublishError(error)
    return uploaded
