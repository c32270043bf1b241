"""FastWAM's processor step lists, in LeRobot 0.6.1's order (``processor_fastwam.py``).

- pre:  rename → batch → device → normalizer (the default pipeline: MEAN_STD state and action, images
  IDENTITY by FastWAM's ``normalization_mapping``, so frames stay in [0, 1] and the VAE boundary maps them
  to [-1, 1]; no resize step, the model resizes each camera itself, see ``video.py``)
- post: unnormalizer → action toggle (only when ``toggle_action_dimensions`` is not empty) → device("cpu")

Same steps at the same indices as LeRobot's, so the saved files are byte-equal to LeRobot's for the same
statistics (tools/interop/fastwam_lerobot_interop.py). The spec names ``fastwam_processor_steps``; the
config is read through the one field the lists need (``ToggleConfig``), so the lists do not depend on
the config class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from lerobot_cli.policies.fastwam.toggle import ActionToggleStep
from lerobot_cli.processors.factory import DefaultSteps, StepLists


class ToggleConfig(Protocol):
    """What the step lists read from a FastWAM config."""

    toggle_action_dimensions: Sequence[int]


def fastwam_processor_steps(config: ToggleConfig, defaults: DefaultSteps) -> StepLists:
    pre, _ = defaults.default_lists()
    post = [defaults.unnormalize]
    if config.toggle_action_dimensions:
        post.append(ActionToggleStep(toggle_dimensions=list(config.toggle_action_dimensions)))
    post.append(defaults.to_cpu)
    return pre, post
