"""Processor pipelines saved next to a policy's weights (imports torch; ``transformers`` only on first use
of a tokenizer).

``make_pre_post_processors`` builds the pair from a policy config and dataset statistics;
``save_processors`` / ``load_processors`` write and read LeRobot's file layout. Importing this package
registers the generic steps (rename, batch, device, normalizers, tokenizer, relative actions); a policy's
own steps (pi0's newline, pi05's state-in-prompt: ``lerobot_cli.policies.pi0.prompts``,
``lerobot_cli.policies.pi05.prompts``) are registered by the module its ``PolicySpec.processors`` names,
which loading a pipeline file imports when the file names a step not yet registered, so any pipeline
file that uses them loads.
"""

from lerobot_cli.processors.factory import (
    POSTPROCESSOR_NAME,
    PREPROCESSOR_NAME,
    DefaultSteps,
    MissingStatsError,
    load_processors,
    make_pre_post_processors,
    save_processors,
)
from lerobot_cli.processors.normalize import NormalizerStep, UnnormalizerStep, to_stat_tensors
from lerobot_cli.processors.pipeline import ProcessorPipeline
from lerobot_cli.processors.relative import AbsoluteActionsStep, RelativeActionsStep
from lerobot_cli.processors.steps import (
    STEP_REGISTRY,
    AddBatchDimensionStep,
    DeviceStep,
    ProcessorStep,
    RenameObservationsStep,
    register_step,
)
from lerobot_cli.processors.tokenizer import TokenizerStep, TokenizerUnavailableError

__all__ = [
    "POSTPROCESSOR_NAME",
    "PREPROCESSOR_NAME",
    "STEP_REGISTRY",
    "AbsoluteActionsStep",
    "AddBatchDimensionStep",
    "DefaultSteps",
    "DeviceStep",
    "MissingStatsError",
    "NormalizerStep",
    "ProcessorPipeline",
    "ProcessorStep",
    "RelativeActionsStep",
    "RenameObservationsStep",
    "TokenizerStep",
    "TokenizerUnavailableError",
    "UnnormalizerStep",
    "load_processors",
    "make_pre_post_processors",
    "register_step",
    "save_processors",
    "to_stat_tensors",
]
