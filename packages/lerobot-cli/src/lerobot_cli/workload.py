"""Dataset, policy and processors of a run, built from its config (the policy learns its features here).

Features come from the dataset unless the policy config (e.g. a ``--policy.path`` fine-tune) already
names them; the frames each batch needs come from the policy's delta indices. Stats from the dataset
feed the normalization processors, except when fine-tuning a policy that ships its own processors.
"""

from __future__ import annotations

import logging
from pathlib import Path

import attrs
from attrs import define
from torch import nn

from lerobot_cli.config import TrainConfig
from lerobot_cli.datasets import (
    LeRobotDataset,
    dataset_to_policy_features,
    load_meta,
    make_dataset,
    resolve_dataset_root,
    resolve_delta_timestamps,
    split_policy_features,
)
from lerobot_cli.peft.basefile import is_adapter_dir
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.pretrained import build_policy, load_pretrained
from lerobot_cli.processors import load_processors, make_pre_post_processors
from lerobot_cli.processors.pipeline import ProcessorPipeline

log = logging.getLogger(__name__)


@define
class Workload:
    dataset: LeRobotDataset
    policy_config: PolicyConfig
    policy: nn.Module
    preprocessor: ProcessorPipeline
    postprocessor: ProcessorPipeline


def policy_config_for_dataset(policy: PolicyConfig, features: dict) -> PolicyConfig:
    """Fill the policy's input/output features from the dataset when the config leaves them empty."""
    if policy.input_features and policy.output_features:
        return policy
    inputs, outputs = split_policy_features(dataset_to_policy_features(features))
    return attrs.evolve(
        policy,
        input_features=dict(policy.input_features) or inputs,
        output_features=dict(policy.output_features) or outputs,
    )


def _has_processors(directory: Path) -> bool:
    return (directory / "policy_preprocessor.json").is_file() and (directory / "policy_postprocessor.json").is_file()


def build_policy_for(cfg: TrainConfig, features: dict) -> tuple[PolicyConfig, nn.Module]:
    """The policy a run trains: fresh, or loaded from ``--policy.path``; features from the dataset.

    With ``--peft.*`` the ``--policy.path`` policy is the frozen base of new LoRA adapters; a
    ``--policy.path`` that is itself a PEFT output trains its adapter further (on its recorded base).
    """
    policy_cfg = policy_config_for_dataset(cfg.policy, features)
    precision = cfg.accelerator.mixed_precision
    if policy_cfg.pretrained_path:
        directory = Path(policy_cfg.pretrained_path)
        if is_adapter_dir(directory):
            from lerobot_cli.peft.adapters import load_adapter_policy

            return load_adapter_policy(directory, config=policy_cfg, trainable=True, mixed_precision=precision)
        policy_cfg, policy = load_pretrained(directory, config=policy_cfg)
        if cfg.peft is not None:
            from lerobot_cli.peft.adapters import wrap_with_peft

            return policy_cfg, wrap_with_peft(policy.train(), cfg.peft, base_dir=directory, mixed_precision=precision)
        return policy_cfg, policy.train()
    return policy_cfg, build_policy(policy_cfg)


def build_workload(cfg: TrainConfig, device: str, processors_from: Path | None = None) -> Workload:
    """``processors_from``: a ``pretrained_model/`` whose processors to use (a resumed checkpoint)."""
    meta = load_meta(resolve_dataset_root(cfg.dataset))
    policy_cfg, policy = build_policy_for(cfg, meta.features)
    delta = resolve_delta_timestamps(
        meta.features, meta.fps,
        observation_delta_indices=policy_cfg.observation_delta_indices,
        action_delta_indices=policy_cfg.action_delta_indices,
        reward_delta_indices=policy_cfg.reward_delta_indices,
    )
    dataset = make_dataset(cfg.dataset, delta_timestamps=delta)
    pretrained = Path(policy_cfg.pretrained_path) if policy_cfg.pretrained_path else None
    source = processors_from or pretrained
    if source is not None and _has_processors(source):
        pre, post = load_processors(source, device=device)
    else:
        pre, post = make_pre_post_processors(policy_cfg, dataset.meta.stats, device=device)
    return Workload(dataset, policy_cfg, policy, pre, post)
