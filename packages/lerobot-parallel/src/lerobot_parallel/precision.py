"""Mixed precision: autocast context, loss scaling and skipped-step detection.

Parameters stay fp32 in every mode (the optimizer updates fp32 master weights); only the
forward runs in bf16/fp16 under ``torch.autocast``. fp16's narrow exponent needs a loss scaler,
and a scaler *skips* the optimizer step when it finds inf/nan gradients. The caller must then
also skip the LR scheduler step, otherwise the schedule runs ahead of the weights, so
:meth:`Precision.step` reports whether the step happened. ``torch.amp.GradScaler`` works on CPU
in torch ≥ 2.3, so the fp16 path is the same code on every device.

Under FSDP2/HSDP the same object is used unchanged: the sharded module's ``MixedPrecisionPolicy``
(see :mod:`lerobot_parallel.fsdp_precision`) casts gathered parameters, autocast still runs the
forward, and ``GradScaler`` works on the sharded ``DTensor`` gradients because DTensor's handler for
``_amp_foreach_non_finite_check_and_unscale_`` max-reduces ``found_inf`` over the mesh, so every
rank skips the same steps (measured on torch 2.15, CPU/gloo, FSDP and HSDP). A gradient list that
mixes DTensors with plain tensors (ignored modules) is refused by that op, which is why the plan
refuses fp16 together with ``ignored_modules``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from attrs import define, field

from lerobot_parallel.config import MIXED_PRECISION_CHOICES
from lerobot_parallel.validators import require_choice

_AUTOCAST_DTYPES = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@define
class Precision:
    """Everything precision-related the loop needs, built by :func:`build_precision`.

    Mutable on purpose: the scaler's scale changes every step and is checkpointed
    (``state_dict``/``load_state_dict``).
    """

    mode: str
    device_type: str
    autocast_dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None = field(default=None)

    def autocast(self) -> AbstractContextManager:
        """Context for the forward pass (and loss computation); backward runs outside it."""
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to true scale before clipping (once per optimizer step)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Optimizer step (through the scaler under fp16); returns False when it was skipped.

        The scaler lowers its scale exactly when it found non-finite gradients and skipped the
        step (backoff_factor < 1), which is the public signal we compare.
        """
        if self.scaler is None:
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= before

    def state_dict(self) -> dict:
        return {} if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


def build_precision(mixed_precision: str, device: torch.device | str, **scaler_kwargs) -> Precision:
    """``"no"`` | ``"bf16"`` | ``"fp16"`` for ``device``; ``scaler_kwargs`` go to ``GradScaler``
    (fp16 only)."""
    require_choice("accelerator.mixed_precision", mixed_precision, MIXED_PRECISION_CHOICES)
    device_type = torch.device(device).type
    scaler = torch.amp.GradScaler(device_type, **scaler_kwargs) if mixed_precision == "fp16" else None
    return Precision(
        mode=mixed_precision,
        device_type=device_type,
        autocast_dtype=_AUTOCAST_DTYPES[mixed_precision],
        scaler=scaler,
    )
