"""Which model artifacts a checkpoint holds; kept torch-free so configs can name it cheaply."""

from __future__ import annotations

import enum


class CheckpointFormat(str, enum.Enum):
    """``safetensors``: one gathered file; ``dcp``: DCP shards only; ``safetensors_dcp``: both."""

    SAFETENSORS = "safetensors"
    DCP = "dcp"
    SAFETENSORS_DCP = "safetensors_dcp"

    @property
    def writes_safetensors(self) -> bool:
        return self in (CheckpointFormat.SAFETENSORS, CheckpointFormat.SAFETENSORS_DCP)

    @property
    def writes_dcp(self) -> bool:
        return self in (CheckpointFormat.DCP, CheckpointFormat.SAFETENSORS_DCP)

    def __str__(self) -> str:
        return self.value
