"""A policy config meets its dataset: features filled in from it, then the policy's own checks on them.

Torch-free, so the CLI can run it before torch loads whenever the dataset is already on disk: a pi0
on a dataset without a camera, or a diffusion ``crop_shape`` larger than the images, is one sentence
at start-up (under torchrun once, not once per rank with a traceback each). The workload runs the same
checks again on the dataset it built (a Hub dataset is only on disk after the download).
"""

from __future__ import annotations

import attrs

from lerobot_cli.errors import ConfigError
from lerobot_cli.features import dataset_to_policy_features, split_policy_features
from lerobot_cli.policies.config import PolicyConfig


def policy_config_for_dataset(policy: PolicyConfig, features: dict) -> PolicyConfig:
    """Fill the policy's input/output features from the dataset when the config leaves them empty, then
    let the policy fit itself to the dataset (its ``fit_dataset`` hook, LeRobot's
    ``set_dataset_feature_metadata``)."""
    if not (policy.input_features and policy.output_features):
        inputs, outputs = split_policy_features(dataset_to_policy_features(features))
        policy = attrs.evolve(
            policy,
            input_features=dict(policy.input_features) or inputs,
            output_features=dict(policy.output_features) or outputs,
        )
    return policy.fit_dataset(features)


def check_policy_features(policy: PolicyConfig) -> None:
    """The policy's ``validate_features`` (cameras, state, action, image sizes) as a :class:`ConfigError`:
    every refusal there is about the dataset and the flags, never a bug to show a traceback for."""
    try:
        policy.validate_features()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
