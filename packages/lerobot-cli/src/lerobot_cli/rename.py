"""``--rename_map`` (LeRobot 0.6.1's flag): fine-tune a ``--policy.path`` checkpoint on a dataset whose
observations have other names, e.g. ``{"observation.images.front": "observation.images.top"}``.

As in LeRobot, the map needs a pretrained policy (a fresh one takes its feature names from the dataset,
so LeRobot refuses a non-empty map without one, and so does this stack); the dataset is read under its
own names and the pre-processor's ``rename_observations_processor`` step renames its observations to the
checkpoint's, in training and wherever the saved pre-processor is loaded (LeRobot's
``PolicyProcessorPipeline.from_pretrained`` included: the step is saved with the map). The normalisation
statistics follow the rename (LeRobot's ``rename_stats``), so a renamed camera is normalised with its
own statistics under the name the policy knows. LeRobot 0.6.1's ``lerobot-train`` passes the statistics
unrenamed, which leaves a renamed feature unnormalised (its normaliser skips a key it has no statistics
for); its rollout (``lerobot-rollout``) renames them with ``rename_stats``, as this stack does.

Unlike LeRobot, which applies the map unchecked, a map is checked before any work: its keys are the
dataset's observation features, its values inputs of the policy, no two features end under one name.
Torch-free: the CLI runs these checks before torch loads when the dataset is on disk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

FLAG = "--rename_map"
NEEDS_PRETRAINED = (
    f"{FLAG} renames a --policy.path checkpoint's inputs to the dataset's names and needs one: a fresh "
    "--policy.type policy takes its feature names from the dataset, so there is nothing to rename (LeRobot "
    "refuses it too); pass --policy.path=<pretrained_model> or drop --rename_map"
)


def check_map_value(value: Any) -> None:
    """The flag's value: a JSON object of strings (``{}``: no rename)."""
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(
            f"{FLAG}: give a JSON object {{dataset feature: policy input feature}} of strings, e.g. "
            f'{FLAG}=\'{{"observation.images.front": "observation.images.top"}}\', got {value!r}'
        )


def show(rename_map: Mapping[str, str]) -> str:
    """The map as the flag spells it."""
    return f"{FLAG}='{json.dumps(dict(rename_map))}'"


def check_rename_map(
    rename_map: Mapping[str, str],
    dataset_features: Mapping[str, Any],
    policy_inputs: Mapping[str, Any],
    where,
) -> None:
    """``ValueError`` (one line) unless every key is an observation feature of the dataset (``where``: how
    to name it), every value an input of the policy, and the renamed dataset has each name once."""
    for old, new in rename_map.items():
        if old not in dataset_features:
            have = sorted(k for k in dataset_features if k.startswith("observation"))
            raise ValueError(
                f"{FLAG} renames {old!r}, which the dataset at {where} does not have (its observations: "
                f"{', '.join(have) or 'none'})"
            )
        if not old.startswith("observation"):
            raise ValueError(
                f"{FLAG} renames {old!r}: only observations are renamed (LeRobot's "
                "rename_observations_processor), not actions or other dataset columns"
            )
        if new not in policy_inputs:
            raise ValueError(
                f"{FLAG} renames {old!r} to {new!r}, which is not an input of the --policy.path policy "
                f"(its inputs: {', '.join(sorted(policy_inputs)) or 'none'})"
            )
    targets = list(rename_map.values())
    for new in dict.fromkeys(targets):
        sources = [old for old, to in rename_map.items() if to == new]
        if len(sources) > 1:
            raise ValueError(f"{FLAG} renames {' and '.join(map(repr, sources))} to one name, {new!r}")
        if new in dataset_features and new not in rename_map:
            raise ValueError(
                f"{FLAG} renames {sources[0]!r} to {new!r}, which the dataset at {where} already has: "
                f"rename {new!r} too, or map the feature the policy should see as {new!r} alone"
            )


def renamed(features: Mapping[str, Any], rename_map: Mapping[str, str]) -> dict[str, Any]:
    """``features`` (or statistics) under the policy's names: LeRobot's ``rename_stats`` (a missing
    entry stays as it is)."""
    return {rename_map.get(k, k): v for k, v in features.items()}


def suggested_map(
    missing: list[str],
    policy_inputs: Mapping[str, Any],
    available: Mapping[str, Any],
    rename_map: Mapping[str, str],
) -> dict[str, str] | None:
    """A ``--rename_map`` that would feed the policy's ``missing`` inputs from the dataset's observations
    of the same type it does not use (``available``: the dataset's policy features, already renamed by
    ``rename_map``), paired in name order; None when the dataset has no such observation."""
    spare = {k: f for k, f in available.items() if k not in policy_inputs and k.startswith("observation")}
    back = {new: old for old, new in rename_map.items()}
    extra: dict[str, str] = {}
    for key in sorted(missing):
        kind = policy_inputs[key].type
        candidate = next((k for k in sorted(spare) if spare[k].type is kind), None)
        if candidate is None:
            continue
        del spare[candidate]
        extra[back.get(candidate, candidate)] = key
    if not extra:
        return None
    return {**{k: v for k, v in rename_map.items() if k not in extra}, **extra}
