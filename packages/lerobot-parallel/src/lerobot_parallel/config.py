"""Topology and precision settings, validated before torch is imported.

These classes are the single description of *how* a run is parallelised. They are
plain attrs data so that a CLI can build them from flags and a foreign trainer can
build them in code; nothing here touches torch, which keeps ``--help`` fast. Their
messages name fields by config path (``accelerator.fsdp.wrap_modules``; see
:mod:`lerobot_parallel.errors`), the rules themselves are :mod:`lerobot_parallel.validators`.
"""

from __future__ import annotations

import re
from typing import Literal

from attrs import define, field

from lerobot_parallel.errors import ParallelismError
from lerobot_parallel.validators import choice, count, tuple_or_none

MixedPrecision = Literal["no", "bf16", "fp16"]
DType = Literal["float32", "bfloat16", "float16"]
MIXED_PRECISION_CHOICES: tuple[str, ...] = ("no", "bf16", "fp16")
DTYPE_CHOICES: tuple[str, ...] = ("float32", "bfloat16", "float16")
MPP = "accelerator.fsdp.mixed_precision_policy"
CHECKPOINTING_MODES: tuple[str, ...] = ("none", "full", "selective")
# torch.compile's modes (torch._inductor.list_mode_options()); spelled here so the config stays torch-free.
COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# The modes that capture CUDA graphs: a graph replays one step's memory, which accumulation's growing
# .grad buffers break (they crash upstream), so they are refused together with accumulation.
CUDA_GRAPH_MODES: tuple[str, ...] = ("reduce-overhead", "max-autotune")


@define(frozen=True)
class ParallelismConfig:
    """Data-parallel degrees: ``dp_replicate`` copies of a model sharded over ``dp_shard`` ranks.

    ``dp_shard=-1`` means "every launched process not used by dp_replicate"; it is only
    made concrete by :meth:`resolve`, because the world size is a launch-time fact.
    """

    dp_replicate: int = field(
        default=1,
        validator=count("parallelism.dp_replicate", "≥ 1"),
        metadata={"help": "Number of model replicas (all-reduce between them); DDP when dp_shard=1."},
    )
    dp_shard: int = field(
        default=1,
        validator=count("parallelism.dp_shard", "≥ 1, or -1 for all launched processes", allow_all=True),
        metadata={"help": "Ranks each replica is sharded over (FSDP2); -1 = all launched processes."},
    )

    @property
    def dp_world_size(self) -> int:
        if self.dp_shard == -1:
            raise ParallelismError("dp_world_size is unknown until resolve(world_size) fills dp_shard=-1")
        return self.dp_replicate * self.dp_shard

    @property
    def is_sharded(self) -> bool:
        return self.dp_shard != 1

    @property
    def mode(self) -> str:
        """One word for banners and records: single, ddp, fsdp or hsdp."""
        if self.dp_shard == 1:
            return "ddp" if self.dp_replicate > 1 else "single"
        return "hsdp" if self.dp_replicate > 1 else "fsdp"

    def resolve(self, world_size: int) -> ParallelismConfig:
        """Concrete degrees for ``world_size`` launched processes.

        An untouched config on a multi-process launch means plain DDP; ``-1`` takes what is
        left after ``dp_replicate``; the product must be the world size.
        """
        if world_size < 1:
            raise ParallelismError(f"world size must be ≥ 1, got {world_size}")
        shown = f"parallelism.dp_replicate={self.dp_replicate} parallelism.dp_shard={self.dp_shard}"
        if (self.dp_replicate, self.dp_shard) == (1, 1):
            return ParallelismConfig(dp_replicate=world_size, dp_shard=1)
        if self.dp_shard == -1:
            if world_size % self.dp_replicate:
                raise ParallelismError(
                    f"{shown}: world size {world_size} is not divisible by dp_replicate={self.dp_replicate}, "
                    f"so dp_shard=-1 cannot be filled; launch a multiple of {self.dp_replicate} processes"
                )
            return ParallelismConfig(dp_replicate=self.dp_replicate, dp_shard=world_size // self.dp_replicate)
        if self.dp_replicate * self.dp_shard != world_size:
            raise ParallelismError(
                f"{shown}: dp_replicate × dp_shard = {self.dp_replicate} × {self.dp_shard} = "
                f"{self.dp_replicate * self.dp_shard}, but {world_size} process(es) were launched; "
                f"the product must equal the world size"
            )
        return self


def check_float16_policy(mixed_precision: str, mpp: MixedPrecisionPolicyConfig) -> None:
    """float16 anywhere in the explicit policy needs ``mixed_precision=fp16``, which builds the loss
    scaler (fp16 gradients without one underflow). Checked by ``AcceleratorConfig`` and again where a
    policy is resolved from loose arguments."""
    if "float16" in (mpp.param_dtype, mpp.reduce_dtype, mpp.output_dtype) and mixed_precision != "fp16":
        raise ParallelismError(
            f"{MPP} uses float16, which needs accelerator.mixed_precision=fp16 (that builds the loss scaler)"
        )


@define(frozen=True)
class GradientAccumulationConfig:
    steps: int = field(
        default=1,
        validator=count("accelerator.gradient_accumulation.steps"),
        metadata={"help": "Micro-batches per optimizer update (loss divided by it)."},
    )


@define(frozen=True)
class MixedPrecisionPolicyConfig:
    """Fields of torch's ``MixedPrecisionPolicy``; when any is set they replace the derived policy."""

    param_dtype: str | None = field(
        default=None,
        validator=choice(f"{MPP}.param_dtype", DTYPE_CHOICES, optional=True),
        metadata={
            "help": "Dtype of unsharded parameters in forward/backward (required once any field is set).",
            "choices": DTYPE_CHOICES,
        },
    )
    reduce_dtype: str | None = field(
        default=None,
        validator=choice(f"{MPP}.reduce_dtype", DTYPE_CHOICES, optional=True),
        metadata={
            "help": "Dtype of gradient reduction; unset follows torch's default for this version.",
            "choices": DTYPE_CHOICES,
        },
    )
    output_dtype: str | None = field(
        default=None,
        validator=choice(f"{MPP}.output_dtype", DTYPE_CHOICES, optional=True),
        metadata={"help": "Dtype the wrapped modules' outputs are cast to.", "choices": DTYPE_CHOICES},
    )
    cast_forward_inputs: bool | None = field(
        default=None, metadata={"help": "Cast floating-point forward inputs to param_dtype."}
    )

    @property
    def is_set(self) -> bool:
        return any(
            v is not None
            for v in (self.param_dtype, self.reduce_dtype, self.output_dtype, self.cast_forward_inputs)
        )

    def __attrs_post_init__(self) -> None:
        if self.is_set and self.param_dtype is None:
            raise ParallelismError(
                f"{MPP}.param_dtype must be set when any other "
                "mixed_precision_policy field is set (the explicit policy replaces the derived one)"
            )


@define(frozen=True)
class FSDPConfig:
    wrap_modules: tuple[str, ...] | None = field(
        default=None,
        converter=tuple_or_none,
        metadata={
            "help": "Module class names that become FSDP units (overrides the policy's _fsdp_wrap_modules)."
        },
    )
    min_num_params: int | None = field(
        default=None,
        validator=count("accelerator.fsdp.min_num_params", optional=True),
        metadata={"help": "Instead of names: wrap every submodule above this many parameters."},
    )
    reshard_after_forward: bool = field(
        default=True, metadata={"help": "Free each unit's gathered parameters after forward (saves memory)."}
    )
    cpu_offload: bool = field(
        default=False, metadata={"help": "Keep parameters, gradients and optimizer state on the CPU."}
    )
    ignored_modules: str | None = field(
        default=None,
        metadata={
            "help": "Regex that must match a whole module path (re.fullmatch) to keep that module unsharded "
            "(PEFT paths start with base_model.model.: begin the pattern with .*)."
        },
    )
    mixed_precision_policy: MixedPrecisionPolicyConfig = field(factory=MixedPrecisionPolicyConfig)

    def __attrs_post_init__(self) -> None:
        names = self.wrap_modules
        if names is not None and (not names or not all(isinstance(n, str) and n for n in names)):
            raise ParallelismError(
                "accelerator.fsdp.wrap_modules must be a non-empty JSON list of class names, "
                f"e.g. '[\"ACTEncoderLayer\"]', got {list(names)!r}"
            )
        if names is not None and self.min_num_params is not None:
            raise ParallelismError(
                "accelerator.fsdp.wrap_modules and accelerator.fsdp.min_num_params are two ways to choose "
                "wrap units; pass only one of them"
            )
        if self.ignored_modules is not None:
            try:
                re.compile(self.ignored_modules)
            except re.error as exc:
                raise ParallelismError(
                    f"accelerator.fsdp.ignored_modules is not a valid regular expression "
                    f"({self.ignored_modules!r}: {exc})"
                ) from None

    @property
    def ignored_modules_pattern(self) -> re.Pattern[str] | None:
        return None if self.ignored_modules is None else re.compile(self.ignored_modules)


@define(frozen=True)
class DDPConfig:
    find_unused_parameters: bool = field(
        default=False,
        metadata={"help": "Let DDP tolerate parameters that get no gradient in a step (slower)."},
    )
    broadcast_buffers: bool = field(
        default=True, metadata={"help": "Broadcast module buffers from rank 0 each forward."}
    )
    gradient_as_bucket_view: bool = field(
        default=True, metadata={"help": "Gradients as views into DDP buckets (saves memory)."}
    )
    bucket_cap_mb: int = field(default=25, metadata={"help": "DDP all-reduce bucket size in MiB."})


@define(frozen=True)
class ActivationCheckpointingConfig:
    """Recompute activations in backward instead of keeping them, one region per wrap unit.

    ``full`` keeps only each region's inputs; ``selective`` also keeps the outputs of its matmuls,
    convolutions and attention kernels (the expensive ops) and recomputes the rest (norms, activations,
    softmax, dropout, elementwise ops): less memory saved than ``full``, less compute repeated.
    """

    mode: str = field(
        default="none",
        validator=choice("accelerator.activation_checkpointing.mode", CHECKPOINTING_MODES),
        metadata={
            "help": "none | full (recompute each wrap unit in backward) | selective (keep matmul and "
            "attention outputs, recompute the rest).",
            "choices": CHECKPOINTING_MODES,
        },
    )

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


@define(frozen=True)
class CompileConfig:
    """``torch.compile`` of the policy: each wrap unit on its own (regional) or the whole policy."""

    enabled: bool = field(default=False, metadata={"help": "Compile the policy with torch.compile."})
    backend: str = field(
        default="inductor", metadata={"help": "torch.compile backend (inductor, aot_eager, ...)."}
    )
    mode: str | None = field(
        default=None,
        validator=choice("accelerator.compile.mode", COMPILE_MODES, optional=True),
        metadata={"help": "torch.compile mode; unset = torch's default.", "choices": COMPILE_MODES},
    )
    regional: bool = field(
        default=True,
        metadata={
            "help": "Compile each wrap unit separately (fast to compile, FSDP hooks stay eager); false "
            "compiles the whole policy (single process and DDP only)."
        },
    )

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.backend, str) or not self.backend:
            raise ParallelismError(
                f"accelerator.compile.backend must be a backend name, got {self.backend!r}"
            )


@define(frozen=True)
class AcceleratorConfig:
    """Precision, accumulation and wrapper settings, independent of the topology degrees."""

    mixed_precision: str = field(
        default="no",
        validator=choice("accelerator.mixed_precision", MIXED_PRECISION_CHOICES),
        metadata={
            "help": "Autocast precision; fp16 adds a loss scaler, fp32 master weights are kept.",
            "choices": MIXED_PRECISION_CHOICES,
        },
    )
    gradient_accumulation: GradientAccumulationConfig = field(factory=GradientAccumulationConfig)
    fsdp: FSDPConfig = field(factory=FSDPConfig)
    ddp: DDPConfig = field(factory=DDPConfig)
    activation_checkpointing: ActivationCheckpointingConfig = field(factory=ActivationCheckpointingConfig)
    compile: CompileConfig = field(factory=CompileConfig)
    timeout_s: float = field(
        default=1800.0,
        metadata={"help": "Collective timeout in seconds; a stuck rank ends the job after it."},
    )

    def __attrs_post_init__(self) -> None:
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, int | float)
            or self.timeout_s <= 0
        ):
            raise ParallelismError(
                f"accelerator.timeout_s must be a number of seconds > 0, got {self.timeout_s!r}"
            )
        check_float16_policy(self.mixed_precision, self.fsdp.mixed_precision_policy)
        steps = self.gradient_accumulation.steps
        if self.compile.enabled and self.compile.mode in CUDA_GRAPH_MODES and steps > 1:
            raise ParallelismError(
                f"accelerator.compile.mode={self.compile.mode} captures CUDA graphs, which do not work with "
                f"accelerator.gradient_accumulation.steps={steps} "
                "(the accumulated gradients outlive one graph replay); "
                "use accelerator.compile.mode=max-autotune-no-cudagraphs or default, or steps=1"
            )
