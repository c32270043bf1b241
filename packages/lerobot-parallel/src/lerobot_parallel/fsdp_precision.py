"""The ``MixedPrecisionPolicy`` a sharded run uses, decided from the config.

Two routes, never mixed:

* **Explicit** (any ``accelerator.fsdp.mixed_precision_policy.*`` set): built from those fields
  only; unset ones take torch's own defaults. An unset ``reduce_dtype`` therefore follows the
  installed torch: before 2.15 it followed ``param_dtype``; from 2.15 gradients are reduced in the
  parameters' own dtype (fp32 master weights → fp32 reduce-scatter; measured on 2.15 with gloo).
* **Derived** from ``accelerator.mixed_precision=bf16|fp16``: ``param_dtype`` = that dtype,
  ``reduce_dtype`` = float32 spelled out (the same on every torch version, and accumulated
  gradients keep their precision), no ``output_dtype``. Wrap units cast their floating inputs
  (activations) to ``param_dtype``; the root does *not*, so the batch — regression targets
  included — reaches the policy's forward unrounded, as it does under DDP.

Either way trainable parameters are upcast to fp32 before sharding (the sharded copy is the
master the optimizer updates). The loop keeps ``torch.autocast`` on under ``bf16``/``fp16``, as
accelerate does for FSDP2: autocast keeps softmax/norm/loss ops in fp32 and lets modules that FSDP
does not cast (ignored modules keep fp32 parameters) take low-precision activations; FSDP's
casting supplies what autocast cannot — low-precision all-gathers and no fp32 copy of a gathered
unit. With an explicit low-precision policy and ``mixed_precision=no`` there is no autocast.
"""

from __future__ import annotations

import torch
from attrs import define
from torch.distributed.fsdp import MixedPrecisionPolicy

from lerobot_parallel.config import MIXED_PRECISION_CHOICES, MixedPrecisionPolicyConfig, check_float16_policy
from lerobot_parallel.validators import require_choice

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DERIVED = {"bf16": "bfloat16", "fp16": "float16"}
MP = "accelerator.mixed_precision"
MPP = "accelerator.fsdp.mixed_precision_policy"


@define(frozen=True)
class ShardedPrecision:
    """Policy fields as dtype names (``None``: torch's default), plus where they came from."""

    source: str  # "none", "derived", "explicit"
    mixed_precision: str = "no"  # accelerator.mixed_precision (autocast), for the description
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    output_dtype: str | None = None
    cast_forward_inputs: bool = True
    root_cast_forward_inputs: bool = True

    @property
    def upcast_trainable(self) -> bool:
        """Whether trainable parameters are made fp32 masters before sharding."""
        return self.source != "none"

    def policies(self) -> tuple[MixedPrecisionPolicy, MixedPrecisionPolicy]:
        """``(units' policy, root's policy)`` for ``fully_shard``."""
        if self.source == "none":
            return MixedPrecisionPolicy(), MixedPrecisionPolicy()
        kwargs = {
            "param_dtype": _dtype(self.param_dtype),
            "reduce_dtype": _dtype(self.reduce_dtype),
            "output_dtype": _dtype(self.output_dtype),
        }
        return (
            MixedPrecisionPolicy(**kwargs, cast_forward_inputs=self.cast_forward_inputs),
            MixedPrecisionPolicy(**kwargs, cast_forward_inputs=self.root_cast_forward_inputs),
        )

    def describe(self) -> str:
        if self.source == "none":
            return (
                "Precision: no mixed-precision policy (parameters, "
                "gradients and reductions in the model's dtypes)"
            )
        reduce = (
            self.reduce_dtype or f"torch {torch.__version__.split('+')[0]}'s default (the parameters' dtype)"
        )
        origin = f"derived from {MP}={self.mixed_precision}" if self.source == "derived" else f"from {MPP}.*"
        casts = (
            "units cast inputs, the root does not"
            if self.cast_forward_inputs != self.root_cast_forward_inputs
            else f"cast_forward_inputs={self.cast_forward_inputs}"
        )
        return (
            f"Precision: parameters all-gathered in {self.param_dtype}, gradients reduced in {reduce}, "
            f"outputs {self.output_dtype or 'as computed'}, {casts}; fp32 master weights ({origin})"
        )


def _dtype(name: str | None) -> torch.dtype | None:
    return None if name is None else DTYPES[name]


def resolve_sharded_precision(
    mixed_precision: str, mpp: MixedPrecisionPolicyConfig | None = None
) -> ShardedPrecision:
    """The policy fields for ``mixed_precision`` (``no``/``bf16``/``fp16``) and the explicit config."""
    mpp = mpp or MixedPrecisionPolicyConfig()
    require_choice(MP, mixed_precision, MIXED_PRECISION_CHOICES)
    if mpp.is_set:
        check_float16_policy(mixed_precision, mpp)
        cast = True if mpp.cast_forward_inputs is None else mpp.cast_forward_inputs
        return ShardedPrecision(
            source="explicit",
            mixed_precision=mixed_precision,
            param_dtype=mpp.param_dtype,
            reduce_dtype=mpp.reduce_dtype,
            output_dtype=mpp.output_dtype,
            cast_forward_inputs=cast,
            root_cast_forward_inputs=cast,
        )
    if mixed_precision == "no":
        return ShardedPrecision(source="none")
    return ShardedPrecision(
        source="derived",
        mixed_precision=mixed_precision,
        param_dtype=_DERIVED[mixed_precision],
        reduce_dtype="float32",
        cast_forward_inputs=True,
        root_cast_forward_inputs=False,
    )
