"""Processor steps and their registry: the batch transforms a policy pipeline is made of.

Each step has a ``registry_name`` and a JSON ``get_config()`` equal to the LeRobot step of that name,
so a pipeline file written here is read by LeRobot's ``PolicyProcessorPipeline.from_pretrained`` and
back. Steps work on a flat batch dict (``observation.*``, ``action``, ``*_is_pad``, ``task``, …) — the
shape our data loader yields — instead of LeRobot's transition tuples.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from lerobot_trainloop.batch import HOST_KEYS
from torch import Tensor

Batch = dict[str, Any]

STEP_REGISTRY: dict[str, type[ProcessorStep]] = {}


def register_step(cls: type[ProcessorStep]) -> type[ProcessorStep]:
    """Class decorator: make ``cls`` loadable from a pipeline file by its ``registry_name``."""
    if not cls.registry_name:
        raise ValueError(f"{cls.__name__} needs a registry_name")
    STEP_REGISTRY[cls.registry_name] = cls
    return cls


class ProcessorStep:
    """Base of all steps: stateless by default, configured from its JSON config."""

    registry_name: ClassVar[str] = ""

    def __call__(self, batch: Batch) -> Batch:
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ProcessorStep:
        return cls(**config)

    def state_dict(self) -> dict[str, Tensor]:
        return {}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        if state:
            raise ValueError(f"{self.registry_name} has no state, got {sorted(state)[:5]}")

    def to(self, device: str | torch.device) -> ProcessorStep:
        return self


@register_step
class RenameObservationsStep(ProcessorStep):
    """Rename observation keys, e.g. to feed a camera under the name a checkpoint was trained with."""

    registry_name: ClassVar[str] = "rename_observations_processor"

    def __init__(self, rename_map: Mapping[str, str] | None = None) -> None:
        self.rename_map = dict(rename_map or {})

    def __call__(self, batch: Batch) -> Batch:
        if not self.rename_map:
            return batch
        return {
            (self.rename_map.get(k, k) if k.startswith("observation") else k): v for k, v in batch.items()
        }

    def get_config(self) -> dict[str, Any]:
        return {"rename_map": dict(self.rename_map)}


@register_step
class AddBatchDimensionStep(ProcessorStep):
    """Give one unbatched observation (robot or env at inference time) a batch dimension of 1.

    Training batches pass unchanged: only a 1-D state/action, a 3-D image, a 0-D index or a single task
    string is treated as unbatched.
    """

    registry_name: ClassVar[str] = "to_batch_processor"

    def __call__(self, batch: Batch) -> Batch:
        out = dict(batch)
        for key, value in batch.items():
            if isinstance(value, str) and key == "task":
                out[key] = [value]
            elif not isinstance(value, Tensor):
                continue
            elif (
                key in ("observation.state", "observation.environment_state", "action")
                and value.dim() == 1
                or (key == "observation.image" or key.startswith("observation.images."))
                and value.dim() == 3
                or key in ("index", "task_index")
                and value.dim() == 0
            ):
                out[key] = value.unsqueeze(0)
        return out


_FLOAT_DTYPES = {
    "float16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "float": torch.float32,
    "float64": torch.float64,
    "double": torch.float64,
    "bfloat16": torch.bfloat16,
}


@register_step
class DeviceStep(ProcessorStep):
    """Move every tensor to ``device`` and optionally cast floating tensors to ``float_dtype``.

    A bare ``"cuda"`` means this process's current CUDA device, and a tensor already on a GPU stays
    there: with one process per GPU, the same saved pipeline must serve every rank.

    The per-sample host values (``lerobot_trainloop.batch.HOST_KEYS``: the dataset ``index``) stay in
    host memory: policies read them on the host (pi0's, diffusion's and FastWAM's per-sample draws), and
    reading a device copy back would stall every step. That set is declared once (lerobot-parallel's
    ``host_values``) and the train loop's placement honours it too; this step places the rest early so
    that the normaliser after it runs on the device.
    """

    registry_name: ClassVar[str] = "device_processor"
    host_keys: ClassVar[frozenset[str]] = HOST_KEYS

    def __init__(self, device: str = "cpu", float_dtype: str | None = None) -> None:
        if float_dtype is not None and float_dtype not in _FLOAT_DTYPES:
            raise ValueError(
                f"device_processor: invalid float_dtype {float_dtype!r} (choose from "
                f"{', '.join(_FLOAT_DTYPES)})"
            )
        self.device = str(device)
        self.float_dtype = float_dtype

    def _target(self, tensor: Tensor) -> torch.device:
        target = torch.device(self.device)
        if target.type == "cuda" and tensor.is_cuda:
            return tensor.device
        if target.type == "cuda" and target.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        return target

    def _move(self, tensor: Tensor) -> Tensor:
        target = self._target(tensor)
        tensor = tensor.to(target, non_blocking=target.type == "cuda")
        if self.float_dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(_FLOAT_DTYPES[self.float_dtype])
        return tensor

    def __call__(self, batch: Batch) -> Batch:
        return {
            k: self._move(v) if isinstance(v, Tensor) and k not in self.host_keys else v
            for k, v in batch.items()
        }

    def get_config(self) -> dict[str, Any]:
        return {"device": self.device, "float_dtype": self.float_dtype}
