"""``training_step.json``: how a checkpoint was produced, written and read with cattrs.

A resume compares this record with the new run to decide whether it can be sample-exact and to
list what changed (topology, batch size, accumulation, precision); a converter reads it to know
which artifacts exist. It also tells our checkpoints apart from LeRobot's own (≤ 0.6.x), whose
training state has a different layout. Torch-free, so a CLI can read it before importing torch.
"""

from __future__ import annotations

import enum
import importlib.metadata
import json
from pathlib import Path
from typing import Any

import attrs
import cattrs
from attrs import Factory, define, field
from cattrs import transform_error
from cattrs.errors import ClassValidationError, IterableValidationError

from lerobot_ckpt._version import __version__
from lerobot_ckpt.commit.filesystem import replace_json, write_json
from lerobot_ckpt.discovery import resolve_checkpoint_dir
from lerobot_ckpt.errors import (
    CheckpointConfigError,
    CorruptCheckpointError,
    LegacyCheckpointError,
    MissingCheckpointFileError,
    UnsupportedCheckpointError,
)
from lerobot_ckpt.layout import MODEL_DCP_DIR, OPTIMIZER_DCP_DIR, CheckpointPaths
from lerobot_ckpt.paths import refuse_link

RECORD_FORMAT_VERSION = 1
MIXED_PRECISION_CHOICES = ("no", "bf16", "fp16")


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


def _at_least(minimum: int):
    def check(inst, attribute, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise CheckpointConfigError(f"{attribute.name} must be an integer ≥ {minimum}, got {value!r}")

    return check


def _precision(inst, attribute, value) -> None:
    if value not in MIXED_PRECISION_CHOICES:
        raise CheckpointConfigError(
            f"mixed_precision must be one of {MIXED_PRECISION_CHOICES}, got {value!r}"
        )


def _json_safe(inst, attribute, value) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CheckpointConfigError(f"{attribute.name} must be JSON-serialisable: {exc}") from None


def _str_map(inst, attribute, value) -> None:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise CheckpointConfigError(
            f"{attribute.name} must map package names to version strings, got {value!r}"
        )


@define(frozen=True)
class Parallelism:
    """Data-parallel degrees as resolved for the run (never the -1 sentinel)."""

    dp_replicate: int = field(default=1, validator=_at_least(1))
    dp_shard: int = field(default=1, validator=_at_least(1))

    @property
    def dp_world_size(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def is_sharded(self) -> bool:
        return self.dp_shard > 1


@define(frozen=True)
class Artifacts:
    """Which state a checkpoint holds, so readers never have to guess from a directory listing."""

    model_safetensors: bool = False
    model_dcp: bool = False
    optimizer_single_file: bool = False
    optimizer_dcp: bool = False
    peft_adapter: bool = False
    # pretrained_model_ema/: the EMA weights in the same kinds of file (adapter-only when peft_adapter)
    ema_safetensors: bool = False
    ema_dcp: bool = False
    scheduler: bool = False
    scaler: bool = False

    def __or__(self, other: Artifacts) -> Artifacts:
        """What two writers wrote together: a flag is set when either set it."""
        return Artifacts(
            **{a.name: getattr(self, a.name) or getattr(other, a.name) for a in attrs.fields(Artifacts)}
        )

    @property
    def ema(self) -> bool:
        return self.ema_safetensors or self.ema_dcp


def _sha256(inst, attribute, value) -> None:
    if not (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
        raise CheckpointConfigError(f"{attribute.name} must be a lowercase hex SHA-256 digest, got {value!r}")


@define(frozen=True)
class BaseModel:
    """The frozen base a PEFT run adapts, pinned by what cannot move.

    ``reference`` is where the base was loaded from, with symlinks resolved (a step directory, never
    ``checkpoints/last``) or a Hub repo id; ``weights_sha256`` is the SHA-256 of its weights file. A
    resume (or a further fine-tune) verifies the digest, so a base that was retrained, replaced or
    re-pointed in the meantime is refused instead of silently swapped under the adapter.
    """

    reference: str = field(validator=attrs.validators.instance_of(str))
    weights_sha256: str = field(validator=_sha256)


def _default_parallelism(run: RunInfo) -> Parallelism:
    valid = isinstance(run.world_size, int) and not isinstance(run.world_size, bool) and run.world_size >= 1
    return Parallelism(
        dp_replicate=run.world_size if valid else 1, dp_shard=1
    )  # world_size's own validator reports


@define(frozen=True, kw_only=True)
class RunInfo:
    """What the trainer knows about its run; the defaults describe plain DDP over ``world_size``."""

    world_size: int = field(validator=_at_least(1))
    batch_size: int = field(validator=_at_least(1))
    grad_accum_steps: int = field(default=1, validator=_at_least(1))
    mixed_precision: str = field(default="no", validator=_precision)
    parallelism: Parallelism = field(default=Factory(_default_parallelism, takes_self=True))
    checkpoint_format: CheckpointFormat = field(
        default=CheckpointFormat.SAFETENSORS, converter=CheckpointFormat
    )
    versions: dict[str, str] = field(factory=dict, validator=_str_map)
    base_model: BaseModel | None = None

    def __attrs_post_init__(self) -> None:
        if self.world_size % self.parallelism.dp_world_size:
            raise CheckpointConfigError(
                f"parallelism dp_replicate={self.parallelism.dp_replicate} × dp_shard="
                f"{self.parallelism.dp_shard} does not divide world_size={self.world_size}"
            )
        if self.checkpoint_format is not CheckpointFormat.SAFETENSORS and not self.parallelism.is_sharded:
            raise CheckpointConfigError(
                f"checkpoint_format={self.checkpoint_format} only applies to sharded runs (dp_shard > 1); "
                "this run is not sharded and always writes model.safetensors"
            )

    @property
    def dp_world_size(self) -> int:
        return self.parallelism.dp_world_size


@define(frozen=True, kw_only=True)
class TrainingStepRecord:
    """The content of ``training_step.json``."""

    format_version: int = field(default=RECORD_FORMAT_VERSION, validator=_at_least(1))
    step: int = field(validator=_at_least(0))
    world_size: int = field(validator=_at_least(1))
    dp_world_size: int = field(validator=_at_least(1))
    batch_size: int = field(validator=_at_least(1))
    grad_accum_steps: int = field(validator=_at_least(1))
    mixed_precision: str = field(validator=_precision)
    parallelism: Parallelism
    checkpoint_format: CheckpointFormat = field(converter=CheckpointFormat)
    artifacts: Artifacts
    sampler: dict[str, Any] = field(factory=dict, validator=_json_safe)
    loop: dict[str, Any] = field(factory=dict, validator=_json_safe)  # the step loop's own counters
    versions: dict[str, str] = field(factory=dict, validator=_str_map)
    base_model: BaseModel | None = None

    @classmethod
    def for_run(
        cls,
        run: RunInfo,
        *,
        step: int,
        artifacts: Artifacts,
        sampler: dict[str, Any] | None,
        versions: dict[str, str],
        loop: dict[str, Any] | None = None,
    ) -> TrainingStepRecord:
        return cls(
            step=step,
            world_size=run.world_size,
            dp_world_size=run.dp_world_size,
            batch_size=run.batch_size,
            grad_accum_steps=run.grad_accum_steps,
            mixed_precision=run.mixed_precision,
            parallelism=run.parallelism,
            checkpoint_format=run.checkpoint_format,
            artifacts=artifacts,
            sampler=dict(sampler or {}),
            loop=dict(loop or {}),
            versions=dict(versions),
            base_model=run.base_model,
        )

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size * self.dp_world_size * self.grad_accum_steps

    def changes_for(self, run: RunInfo) -> list[str]:
        """What a resume onto ``run`` changes, one ``name: old → new`` per item (for one warning)."""
        pairs = [
            ("world_size", self.world_size, run.world_size),
            ("dp_replicate", self.parallelism.dp_replicate, run.parallelism.dp_replicate),
            ("dp_shard", self.parallelism.dp_shard, run.parallelism.dp_shard),
            ("batch_size", self.batch_size, run.batch_size),
            ("grad_accum_steps", self.grad_accum_steps, run.grad_accum_steps),
            ("mixed_precision", self.mixed_precision, run.mixed_precision),
        ]
        return [f"{name}: {old} → {new}" for name, old, new in pairs if old != new]


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter()

    # JSON numbers must stay what they are: cattrs' default int(...) would turn "8" or 8.7 into 8.
    def strict(kind: type):
        def structure(value: Any, _: type) -> Any:
            if isinstance(value, bool) is not (kind is bool) or not isinstance(value, kind):
                raise TypeError(f"expected {kind.__name__}, got {value!r}")
            return value

        return structure

    conv.register_structure_hook(int, strict(int))
    conv.register_structure_hook(bool, strict(bool))
    conv.register_structure_hook(str, strict(str))
    conv.register_unstructure_hook(CheckpointFormat, lambda f: f.value)
    conv.register_structure_hook(CheckpointFormat, lambda value, _: CheckpointFormat(value))
    return conv


converter = _make_converter()


def package_versions(*names: str) -> dict[str, str]:
    """``{distribution: version}`` of those of ``names`` that are installed, for ``RunInfo.versions``."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def own_version() -> str:
    """The version of lerobot-ckpt itself, as installed (the source tree's when run from a checkout)."""
    return package_versions("lerobot-ckpt").get("lerobot-ckpt", __version__)


def write_record(path: Path, record: TrainingStepRecord) -> None:
    write_json(path, converter.unstructure(record))


def _legacy_reason(raw: dict[str, Any]) -> str | None:
    if "format_version" in raw or "dp_world_size" in raw:
        return None
    if "num_processes" in raw:
        return f"its training_step.json has num_processes={raw['num_processes']!r} instead of dp_world_size"
    if set(raw) == {"step"}:
        return "its training_step.json holds only the step"
    return None


def read_record(paths: CheckpointPaths) -> TrainingStepRecord:
    """Read and validate ``training_step.json``; LeRobot's own records raise LegacyCheckpointError."""
    path = paths.training_step
    if not paths.training_state.is_dir():
        raise MissingCheckpointFileError(
            paths.training_state,
            f"{paths.root} has no training state, so it cannot be resumed; to start a new run from its "
            f"weights use policy.path={paths.pretrained_model}",
        )
    if not path.is_file():
        raise MissingCheckpointFileError(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(path, str(exc)) from None
    if not isinstance(raw, dict):
        raise CorruptCheckpointError(path, f"expected a JSON object, got {type(raw).__name__}")
    reason = _legacy_reason(raw)
    if reason is not None:
        has_dcp = paths.model_dcp.is_dir() or paths.optimizer_dcp.is_dir()
        raise LegacyCheckpointError(
            f"{paths.root} was written by LeRobot ≤ 0.6.x, not lerobot-ckpt: {reason}"
            + ("" if has_dcp else f" and there is no {MODEL_DCP_DIR}/ or {OPTIMIZER_DCP_DIR}/ directory")
            + ". Its training state (gathered weights + a full optimizer state) cannot be resumed as a "
            f"sharded run, or any run, here. Its weights load as a starting point with "
            f"policy.path={paths.pretrained_model}"
        )
    version = raw.get("format_version")
    if isinstance(version, int) and version > RECORD_FORMAT_VERSION:
        raise UnsupportedCheckpointError(
            f"{path} has format_version={version}; this lerobot-ckpt reads up to {RECORD_FORMAT_VERSION} "
            "(upgrade lerobot-ckpt)"
        )
    try:
        return converter.structure(raw, TrainingStepRecord)
    except (ClassValidationError, IterableValidationError) as exc:
        raise CorruptCheckpointError(path, "; ".join(transform_error(exc, path="training_step"))) from None
    except (CheckpointConfigError, TypeError, ValueError) as exc:
        raise CorruptCheckpointError(path, str(exc)) from None


def read_training_step(checkpoint: Path | str) -> TrainingStepRecord:
    """The record of the checkpoint a user path names (see ``resolve_checkpoint_dir``); torch-free."""
    return read_record(CheckpointPaths(resolve_checkpoint_dir(checkpoint)))


def update_artifacts(paths: CheckpointPaths, **changes: bool) -> TrainingStepRecord:
    """Rewrite ``training_step.json`` with some ``artifacts`` flags changed (e.g. after a conversion).

    Written to a fresh ``mkstemp`` name, fsynced and renamed over the old record, so a crash leaves
    one of the two complete records, never a truncated one; the checkpoint may be someone else's, so
    nothing is written through a symlink it holds (``training_state/`` or the record itself being
    one is refused in one line, see :func:`~lerobot_ckpt.commit.filesystem.replace_json`).
    """
    refuse_link(paths.training_state, "rewriting training_step.json")
    record = read_record(paths)
    updated = attrs.evolve(record, artifacts=attrs.evolve(record.artifacts, **changes))
    replace_json(paths.training_step, converter.unstructure(updated))
    return updated
