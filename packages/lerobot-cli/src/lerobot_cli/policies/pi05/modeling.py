"""``PI05Policy``: the trainable pi05 module behind ``--policy.type=pi05``.

The shared pi0/pi05 policy (:class:`~lerobot_cli.policies.common.paligemma.policy.PiFlowPolicy`: images,
language, loss, inference, freezing, FSDP units) with pi05's flow model. The batch's ``observation.state``
is not an input of the model: the pre-processor already wrote it into the tokenised prompt, after
normalising it with the dataset's quantiles.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor

from lerobot_cli.policies.common.paligemma.config import PiFlowConfig
from lerobot_cli.policies.common.paligemma.flow import PI0FlowModel
from lerobot_cli.policies.common.paligemma.policy import PiFlowPolicy
from lerobot_cli.policies.pi05.config import PI05Config
from lerobot_cli.policies.pi05.flow import PI05FlowModel


class PI05Policy(PiFlowPolicy):
    name: ClassVar[str] = "pi05"
    config_class: ClassVar[type[PiFlowConfig]] = PI05Config
    flow_class: ClassVar[type[PI0FlowModel]] = PI05FlowModel
    # Files LeRobot's pi05 from_pretrained accepts: pi0's time-MLP names and a state_proj pi05 has no use for.
    _renamed_modules: ClassVar[dict[str, str]] = {
        "action_time_mlp_in.": "time_mlp_in.",
        "action_time_mlp_out.": "time_mlp_out.",
    }
    _dropped_modules: ClassVar[tuple[str, ...]] = ("state_proj.",)

    def _state(self, batch: dict[str, Any]) -> Tensor | None:
        return None  # in the prompt already (pi05_prepare_state_tokenizer_processor_step)
