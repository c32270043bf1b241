"""``--sample_weighting.*``: LeRobot 0.6.1's per-sample loss weights (RA-BC), its fields and defaults
(``lerobot.utils.sample_weighting.SampleWeightingConfig``). Torch-free: parsed and validated before a run
imports torch; ``lerobot_cli.sample_weighting.weights`` computes the weights."""

from __future__ import annotations

import math

from attrs import define, field

SAMPLE_WEIGHTING_TYPES = ("rabc", "uniform")
# What each type takes in extra_params: LeRobot passes them as keyword arguments to RABCWeights (anything
# else is its TypeError); its UniformWeighter ignores them.
EXTRA_PARAMS = {"rabc": ("fallback_weight",), "uniform": ()}


def _finite(flag: str):
    def check(inst, attribute, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{flag} must be a finite number, got {value!r}")

    return check


def _type(inst, attribute, value) -> None:
    if value not in SAMPLE_WEIGHTING_TYPES:
        raise ValueError(
            f"--sample_weighting.type: invalid choice {value!r} (choose from "
            f"{', '.join(SAMPLE_WEIGHTING_TYPES)}, or --sample_weighting=null for none)"
        )


def _extra_params(inst, attribute, value) -> None:
    allowed = EXTRA_PARAMS.get(inst.type, ())
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        takes = f"takes only {', '.join(allowed)}" if allowed else "takes none"
        raise ValueError(
            f"--sample_weighting.extra_params: {', '.join(map(repr, unknown))} is not a parameter of "
            f"--sample_weighting.type={inst.type} (it {takes})"
        )
    for name, number in value.items():
        _finite(f"--sample_weighting.extra_params.{name}")(inst, attribute, number)


def _path(inst, attribute, value) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(
            f"--sample_weighting.progress_path must name a parquet file, got {value!r}; leave it out for "
            "<dataset root>/sarm_progress.parquet"
        )


@define(frozen=True)
class SampleWeightingConfig:
    """Each sample's loss weighted by its frame's weight: ``rabc`` from the frame's SARM progress (RA-BC,
    LeRobot's ``RABCWeights``), ``uniform`` all ones. Any ``--sample_weighting.*`` flag turns it on."""

    type: str = field(
        default="rabc",
        validator=_type,
        metadata={
            "help": "rabc: RA-BC weights from a per-frame progress file; uniform: every weight 1.",
            "choices": SAMPLE_WEIGHTING_TYPES,
        },
    )
    progress_path: str | None = field(
        default=None,
        validator=_path,
        metadata={
            "help": "rabc's progress parquet (index, episode_index, progress_<head_mode>): a local path or "
            "hf://datasets/<owner>/<name>/<file>; default <--dataset.root>/sarm_progress.parquet, or "
            "hf://datasets/<--dataset.repo_id>/sarm_progress.parquet without --dataset.root."
        },
    )
    head_mode: str = field(
        default="sparse",
        metadata={"help": "Which progress column rabc reads: progress_<head_mode> (sparse or dense)."},
    )
    kappa: float = field(
        default=0.01,
        validator=_finite("--sample_weighting.kappa"),
        metadata={"help": "rabc: a progress delta above kappa gets weight 1, one in [0, kappa] a soft one."},
    )
    epsilon: float = field(
        default=1e-6,
        validator=_finite("--sample_weighting.epsilon"),
        metadata={"help": "rabc: the small constant of the weight formula and its normalisation."},
    )
    extra_params: dict[str, float] = field(
        factory=dict,
        validator=_extra_params,
        metadata={
            "help": "Type-specific parameters as JSON: rabc takes fallback_weight (default 1.0), the "
            "weight of a frame without a progress delta, e.g. '{\"fallback_weight\": 0.5}'."
        },
    )
