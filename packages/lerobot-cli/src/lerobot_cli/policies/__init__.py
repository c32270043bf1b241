"""Policies: torch-free configs + registry here; model classes are imported lazily."""

from lerobot_cli.features import FeatureType, NormalizationMode, PolicyFeature
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.registry import available, config_class, policy_class, register, spec_of
from lerobot_cli.policies.spec import PolicySpec

__all__ = [
    "FeatureType",
    "NormalizationMode",
    "PolicyConfig",
    "PolicyFeature",
    "PolicySpec",
    "available",
    "config_class",
    "policy_class",
    "register",
    "spec_of",
]
