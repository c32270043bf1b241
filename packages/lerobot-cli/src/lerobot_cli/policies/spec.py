"""``PolicySpec``: everything the runner asks of a policy type, in one frozen, torch-free record.

Each config class carries its spec as the class variable ``spec``. The runner, the workload, the
weights, the fetching and the PEFT code read it (``registry.spec_of(config)``) instead of probing the
config or the model class for optional attributes, so a policy that forgets a need fails at import
with a validator's message, not halfway into a run. What depends on a config's values (delta indices,
frames dropped per episode, a tokenizer, activation checkpointing, what ``eval/loss`` is: ACT's drops the
KL term only with ``use_vae`` and names its ``kl_weight``) stays a typed hook on
:class:`~lerobot_cli.policies.config.PolicyConfig`, declared there with its default. EMA is the run's
(``--ema.*``), applied to whatever the policy trains: no policy declares anything for it.

Heavy classes are named by ``"module:Name"`` strings and imported only when a run builds the policy:
the CLI parses and prints ``--help`` before torch loads.
"""

from __future__ import annotations

import re

from attrs import define, field

from lerobot_cli.extras import EXTRAS

_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _target(instance, attribute, value: str) -> None:
    if value and not _TARGET.match(value):
        raise ValueError(f"PolicySpec.{attribute.name} must be 'module:Name', got {value!r}")


def _names(value) -> tuple[str, ...]:
    return tuple(value)


def _groups(value) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(group) for group in value)


def _optional_names(value) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


def _peft_targets(value) -> str | tuple[str, ...] | None:
    return value if value is None or isinstance(value, str) else tuple(value)


def _groups_in_units(instance, attribute, value: tuple[tuple[str, ...], ...]) -> None:
    for group in value:
        if len(group) < 2:
            raise ValueError(f"PolicySpec.unit_groups: a group joins at least two classes, got {group!r}")
        missing = [name for name in group if name not in (instance.wrap_units or ())]
        if missing:
            raise ValueError(
                f"PolicySpec.unit_groups names {missing} that wrap_units lacks: a grouped class "
                f"must also be a wrap unit"
            )


def _units_run_forward(instance, attribute, value: tuple[str, ...]) -> None:
    both = [name for name in value if name in (instance.wrap_units or ())]
    if both:
        raise ValueError(
            f"PolicySpec.no_forward_modules names {both} that wrap_units also lists: a module whose "
            f"forward never runs cannot be an FSDP unit (FSDP gathers a unit in its forward)"
        )


def _lerobot_only(instance, attribute, value) -> None:
    if value and not instance.in_lerobot:
        raise ValueError(
            f"PolicySpec.{attribute.name} is set but in_lerobot is False: only a policy LeRobot 0.6.1 also "
            f"has can lack LeRobot's fields or need LeRobot's extras"
        )


def _known_extras(instance, attribute, value: tuple[str, ...]) -> None:
    unknown = [name for name in value if name not in EXTRAS]
    if unknown:
        raise ValueError(
            f"PolicySpec.extras names {unknown}, not lerobot-cli extras (choose from {sorted(EXTRAS)})"
        )


@define(frozen=True, kw_only=True)
class PolicySpec:
    """One policy type's contract with the runner (the config class's ``spec`` class variable).

    ``model``: the ``torch.nn.Module`` class, ``"module:Class"``, built as ``Class(config)``.
    ``processors``: ``"module:function"`` laying out the pre/post-processor steps when LeRobot's pipelines
    for the policy differ from the default ones ("" = the defaults; see ``lerobot_cli.processors.factory``).
    ``wrap_units``: module class names that become FSDP units (None: the size rule alone).
    ``unit_groups``: tuples of wrap-unit class names whose i-th modules form one unit (pi0's joint layers).
    ``no_forward_modules``: module class names whose ``forward`` the model never calls (it calls their parts
    directly): never FSDP units, whatever chooses the units (pi0's ``PaliGemmaWithExpert`` …).
    ``peft_targets``: default ``--peft.target_modules`` (a regex or module names; None: the flag is needed).
    ``init_only_fields``: config fields that only initialise fresh weights, cleared before loading saved ones.
    ``in_lerobot``: LeRobot 0.6.1 has a config class of this type (False: ``mlp``, plugins). Its config.json
    then holds LeRobot's fields only, ``tests/data/lerobot_config_fields.json`` pins them, and the interop
    drivers check the policy against LeRobot's; otherwise LeRobot refuses its config.json by type.
    ``extension_fields``: config fields LeRobot's class lacks, saved in ``config_extensions.json``.
    ``extras``: lerobot-cli extras the policy needs (pi0/pi05: ``pi``), checked before the run starts.
    ``lerobot_extras``: LeRobot's own pip extras its class of this type needs (pi0: ``lerobot[pi]``):
    ``tools/interop/ci.sh`` builds LeRobot's environment with their union.
    ``state_dict_adapter``: ``"module:function"``, ``function(policy, state) -> state`` putting a weights
    file in another layout LeRobot also loads into this model's names (pi0: openpi's); "" = none.
    ``per_sample_loss``: the model's ``forward(batch, reduction="none")`` returns one loss per sample
    (LeRobot's contract for ``--sample_weighting.*``: pi0, pi05); False: the flags are refused.
    """

    model: str = field(validator=_target)
    processors: str = field(default="", validator=_target)
    wrap_units: tuple[str, ...] | None = field(default=None, converter=_optional_names)
    unit_groups: tuple[tuple[str, ...], ...] = field(
        default=(), converter=_groups, validator=_groups_in_units
    )
    no_forward_modules: tuple[str, ...] = field(default=(), converter=_names, validator=_units_run_forward)
    peft_targets: str | tuple[str, ...] | None = field(default=None, converter=_peft_targets)
    init_only_fields: tuple[str, ...] = field(default=(), converter=_names)
    in_lerobot: bool = False
    extension_fields: tuple[str, ...] = field(default=(), converter=_names, validator=_lerobot_only)
    extras: tuple[str, ...] = field(default=(), converter=_names, validator=_known_extras)
    lerobot_extras: tuple[str, ...] = field(default=(), converter=_names, validator=_lerobot_only)
    state_dict_adapter: str = field(default="", validator=_target)
    per_sample_loss: bool = False
