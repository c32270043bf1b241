"""``--dry_run=true``: print the resolved config and the sharding plan, then exit without training.

It needs no process group: the degrees are resolved against the launched world size, or, when no
launcher is involved, against the degrees given (so ``--parallelism.dp_shard=4`` can be previewed from
one process). The policy is built on the meta device: units, parameter counts and memory depend only on
its shapes, so a 4 B-parameter pi0 is planned in seconds without allocating its weights.
"""

from __future__ import annotations

import json

from lerobot_parallel.launch_env import LaunchEnv

from lerobot_cli.config import TrainConfig
from lerobot_cli.configio import unstructure_train_config


def preview_world_size(cfg: TrainConfig, launched: int) -> int:
    p = cfg.parallelism
    if launched > 1 or p.dp_shard == -1:
        return launched
    return p.dp_replicate * p.dp_shard


def dry_run(cfg: TrainConfig) -> int:
    print(json.dumps(unstructure_train_config(cfg), indent=2))
    resolved = cfg.parallelism.resolve(preview_world_size(cfg, LaunchEnv.from_environ().world_size))
    import torch
    from lerobot_parallel.runtime import ParallelRuntime

    from lerobot_cli.cli.render import as_flags
    from lerobot_cli.datasets.mixing import run_meta
    from lerobot_cli.datasets.stream_location import meta_resolver
    from lerobot_cli.frozen_parts import describe_frozen
    from lerobot_cli.rename import renamed
    from lerobot_cli.workload import build_policy_for, sharding_plan

    meta = run_meta(cfg.dataset, meta_resolver(cfg.dataset))
    features = renamed(meta.features, cfg.rename_map)  # the names the policy sees (--rename_map)
    with torch.device("meta"):
        _, policy = build_policy_for(cfg, features)
    plan = sharding_plan(cfg, policy, ParallelRuntime.preview(resolved))
    total = sum(p.numel() for p in policy.parameters())
    learnable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    print(f"Policy: {cfg.policy.type}; parameters {total:,} (learnable {learnable:,})")
    print(as_flags("\n".join(plan.describe())))
    frozen = describe_frozen(policy)
    if frozen:
        print(frozen)
    for line in cfg.policy.dry_run_notes():
        print(as_flags(line))
    from lerobot_cli.cli.checks import simulates

    if simulates(cfg):  # the batch size as this machine's main rank would decide it
        from lerobot_cli.sim_eval import describe_sim_eval

        world = resolved.dp_replicate * resolved.dp_shard
        print(describe_sim_eval(cfg, cfg.eval.resolved_batch_size(), world))
    return 0
