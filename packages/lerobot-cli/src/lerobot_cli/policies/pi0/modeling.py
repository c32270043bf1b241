"""``PI0Policy``: the trainable pi0 module behind ``--policy.type=pi0``.

The shared pi0/pi05 policy (:class:`~lerobot_cli.policies.common.paligemma.policy.PiFlowPolicy`: images,
language, loss, inference, freezing, file layouts) with pi0's config and flow model: the robot state is a
token of the suffix and the flow time is mixed into each action token (see
:mod:`lerobot_cli.policies.common.paligemma.flow`).
"""

from __future__ import annotations

from typing import ClassVar

from lerobot_cli.policies.common.paligemma.config import PiFlowConfig
from lerobot_cli.policies.common.paligemma.flow import PI0FlowModel
from lerobot_cli.policies.common.paligemma.policy import PiFlowPolicy
from lerobot_cli.policies.pi0.config import PI0Config


class PI0Policy(PiFlowPolicy):
    name: ClassVar[str] = "pi0"
    config_class: ClassVar[type[PiFlowConfig]] = PI0Config
    flow_class: ClassVar[type[PI0FlowModel]] = PI0FlowModel
    # openpi's older time-MLP names, in converted files LeRobot also loads.
    _renamed_modules: ClassVar[dict[str, str]] = {
        "time_mlp_in.": "action_time_mlp_in.",
        "time_mlp_out.": "action_time_mlp_out.",
    }
