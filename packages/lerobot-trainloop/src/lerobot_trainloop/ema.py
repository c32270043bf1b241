"""The EMA shadow of a model's trainable weights, kept where the weights are.

Each rank keeps the EMA of the parameters it holds: under FSDP2/HSDP that is its own shards (the
shadow tensors are DTensors with the parameters' placements, and an update touches local shards
only: no gather, no collective); under DDP or one process, whole tensors. DDP ranks all keep it
(rather than the main rank alone, as LeRobot does) because the held-out eval loss runs on every
rank with ``ema.use_for_eval``, and because identical updates of identical weights keep it
identical everywhere at no communication cost; the price is one fp32 copy of the trainable
weights per rank. With PEFT only the adapters are trainable, so the shadow covers exactly them.

The update is diffusers' ``EMAModel.step`` arithmetic (``s -= (1 - decay) * (s - p)``, foreach, rounded
as it rounds), so a shadow equals LeRobot's bitwise for the same weights (``tools/interop/
diffusion_lerobot_interop.py`` checks it against ``EMAModel``); frozen parameters never change, so their EMA
is the live value and is not stored. The update counter (``updates``) is the loop's to save; the
tensors are saved by ``lerobot_ckpt`` through :meth:`ModelEma.state`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from lerobot_trainloop.config import EmaConfig


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class ModelEma:
    """EMA of ``module``'s trainable parameters (``module``: the policy as wrapped in place, i.e.
    ``WrappedModel.module``: the sharded module under FSDP2, the inner one under DDP).

    Build it after wrapping and before the first update: the shadow starts as a copy of the weights.
    """

    def __init__(self, module: nn.Module, config: EmaConfig) -> None:
        self.config = config
        self.updates = 0  # optimizer updates seen (the schedule's step)
        self.decay: float | None = None  # the decay of the last update
        names: dict[int, list[str]] = {}
        params: dict[int, nn.Parameter] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            if p.requires_grad:
                names.setdefault(id(p), []).append(name)
                params[id(p)] = p
        if not params:
            raise ValueError("ema.enable=true but the model has no trainable parameter to average")
        self._params = list(params.values())
        self._names = [names[i] for i in params]  # tied weights: every name of one shadow tensor
        with torch.no_grad():
            self._shadow = [p.detach().clone() for p in self._params]
        self._shadow_local = [_local(s) for s in self._shadow]

    @property
    def num_params(self) -> int:
        """Elements averaged (global: the unsharded size)."""
        return sum(p.numel() for p in self._params)

    @torch.no_grad()
    def update(self) -> None:
        """One optimizer update's worth: on-device foreach ops, no host read, no collective."""
        self.updates += 1
        self.decay = self.config.decay_at(self.updates)
        # Re-read the locals: an optimizer may have replaced a parameter's local storage.
        live = [_local(p) for p in self._params]
        # s -= (1 - decay) * (s - p), rounded as LeRobot's EMAModel.step rounds it (product, then difference;
        # an alpha= subtraction may fuse the two and differ in the last bit)
        step = torch._foreach_sub(self._shadow_local, live)
        torch._foreach_mul_(step, 1 - self.decay)
        torch._foreach_sub_(self._shadow_local, step)

    @torch.no_grad()
    def reset(self) -> None:
        """Restart the EMA from the live weights (a resume from a checkpoint without one: the shadow was
        copied from the weights as built, before the checkpoint's were loaded)."""
        torch._foreach_copy_(self._shadow_local, [_local(p) for p in self._params])
        self.updates, self.decay = 0, None

    def state(self) -> dict[str, torch.Tensor]:
        """The shadow keyed by parameter name (every name of a tied parameter), aliasing its storage:
        a checkpoint reads it and a resume loads into it in place."""
        return {name: s for names, s in zip(self._names, self._shadow, strict=True) for name in names}

    @contextmanager
    def swapped(self) -> Iterator[None]:
        """The model computes with the EMA weights inside the block; the live ones are back after it
        (bitwise: they are copied aside, not recomputed). Local shards only: no collective."""
        live = [_local(p) for p in self._params]
        with torch.no_grad():
            kept = [t.clone() for t in live]
            torch._foreach_copy_(live, self._shadow_local)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(live, kept)

    def state_dict(self) -> dict:
        """The counter (JSON-able; the tensors travel through :meth:`state`)."""
        return {"updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.updates = int(state["updates"])
        self.decay = self.config.decay_at(self.updates) if self.updates else None
