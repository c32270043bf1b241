"""Per-sample loss weights (``--sample_weighting.*``, LeRobot's RA-BC): the config (torch-free, here), the
weights (``.weights``: the progress file and LeRobot's formula) and the weighted loss (``.loss``)."""

from lerobot_cli.sample_weighting.config import SampleWeightingConfig

__all__ = ["SampleWeightingConfig"]
