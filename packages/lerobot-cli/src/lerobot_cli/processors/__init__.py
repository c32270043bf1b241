"""Normalization processor pipelines saved next to a policy's weights (imports torch).

``make_pre_post_processors`` builds the pair from a policy config and dataset statistics;
``save_processors`` / ``load_processors`` write and read LeRobot's file layout.
"""

from lerobot_cli.processors.factory import (
    POSTPROCESSOR_NAME,
    PREPROCESSOR_NAME,
    load_processors,
    make_pre_post_processors,
    save_processors,
)
from lerobot_cli.processors.normalize import NormalizerStep, UnnormalizerStep, to_stat_tensors
from lerobot_cli.processors.pipeline import ProcessorPipeline
from lerobot_cli.processors.steps import (
    STEP_REGISTRY,
    AddBatchDimensionStep,
    DeviceStep,
    ProcessorStep,
    RenameObservationsStep,
    register_step,
)

__all__ = [
    "POSTPROCESSOR_NAME",
    "PREPROCESSOR_NAME",
    "STEP_REGISTRY",
    "AddBatchDimensionStep",
    "DeviceStep",
    "NormalizerStep",
    "ProcessorPipeline",
    "ProcessorStep",
    "RenameObservationsStep",
    "UnnormalizerStep",
    "load_processors",
    "make_pre_post_processors",
    "register_step",
    "save_processors",
    "to_stat_tensors",
]
