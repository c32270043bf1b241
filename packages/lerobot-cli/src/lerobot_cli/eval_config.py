"""``lerobot-eval``'s flags: the run's config (``EvalRunConfig``, LeRobot's fields and defaults), the flags
as one validated config, ``--policy.<field>`` applied to a saved policy's config, and ``--help``.

Torch-free, like the flags of ``lerobot-train``: a usage error is one line before anything heavy loads.
The run itself is ``lerobot_cli.eval``.
"""

from __future__ import annotations

import datetime as dt
import difflib
from pathlib import Path
from typing import Any

from attrs import define, evolve, field

from lerobot_cli.cli.errors import UsageError
from lerobot_cli.cli.schema import FlagSpec, convert, field_specs, type_name
from lerobot_cli.envs.config import ENV_TYPES, EnvConfig, env_class
from lerobot_cli.evaluation.config import EvalConfig
from lerobot_cli.rename import check_map_value

PROG = "lerobot-eval"
REQUIRED = ("policy.path", "env.type")


@define(frozen=True, kw_only=True)
class EvalPolicyFlags:
    """``--policy.*``: which saved policy, and where and how it runs (its own fields are as saved)."""

    path: str = field(
        metadata={"help": "pretrained_model/ or checkpoint directory (this stack's or LeRobot's), or Hub id."}
    )
    device: str | None = field(
        default=None, metadata={"help": "cpu, cuda or auto (default: cuda:LOCAL_RANK if present, else cpu)."}
    )
    use_amp: bool | None = field(
        default=None,
        metadata={"help": "Roll out under torch.autocast on the device (default: the saved config's)."},
    )


def _seed(inst, attribute, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"--seed must be a non-negative integer (or null: unseeded envs), got {value!r}")


@define(frozen=True, kw_only=True)
class EvalRunConfig:
    """One ``lerobot-eval`` run, as its flags give it (``finalized`` fills the job name and directory)."""

    policy: EvalPolicyFlags
    env: EnvConfig = field(metadata={"help": "Simulation env to evaluate in (choose with --env.type)."})
    eval: EvalConfig = field(factory=EvalConfig)
    seed: int | None = field(
        default=1000, validator=_seed, metadata={"help": "Env seed of episode 0 (episode i: seed + i)."}
    )
    output_dir: str | None = field(
        default=None,
        metadata={"help": "Where eval_info.json goes (default outputs/eval/<date>/<time>_<job>)."},
    )
    job_name: str | None = field(
        default=None, metadata={"help": "Run name (default <env type>_<policy type>)."}
    )
    rename_map: dict[str, str] = field(
        factory=dict,
        validator=lambda _inst, _attr, value: check_map_value(value),
        metadata={"help": "Rename the env's observations to the policy's inputs, as JSON (LeRobot's flag)."},
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "LeRobot's consent to run a Hub env's code; the envs here have none to run."},
    )

    def finalized(self, policy_type: str, now: dt.datetime | None = None) -> EvalRunConfig:
        """LeRobot's defaults: ``job_name`` ``<env type>_<policy type>``, ``output_dir``
        ``outputs/eval/<date>/<time>_<job_name>``."""
        cfg = self
        if not cfg.job_name:
            cfg = evolve(cfg, job_name=f"{cfg.env.type}_{policy_type}")
        if not cfg.output_dir:
            now = now or dt.datetime.now()
            cfg = evolve(cfg, output_dir=f"outputs/eval/{now:%Y-%m-%d}/{now:%H-%M-%S}_{cfg.job_name}")
        return cfg


def eval_flags(env_cls: type[EnvConfig] | None) -> dict[str, FlagSpec]:
    """Every flag ``lerobot-eval`` takes (the env's fields once ``--env.type`` chose them)."""
    specs = {s.path: s for s in field_specs(EvalRunConfig) if s.path != "env"}
    if env_cls is not None:
        specs.update({s.path: s for s in field_specs(env_cls, "env.")})
    return specs


def _unknown_flag(name: str, specs: dict[str, FlagSpec]) -> UsageError:
    close = difflib.get_close_matches(name, [*specs, *REQUIRED], n=1, cutoff=0.6)
    hint = f"; did you mean --{close[0]}?" if close else "; see --help for the list"
    return UsageError(f"unknown flag --{name}{hint}")


def build_eval_config(flags: dict[str, str]) -> tuple[EvalRunConfig, dict[str, str]]:
    """The flags (``split_argv``'s) as one validated config, and the ``--policy.<field>`` flags of the saved
    policy's own fields (raw: its class is known once its directory is read); a bad one is a one-line
    ``UsageError``."""
    flags = dict(flags)
    for name in REQUIRED:
        if name not in flags:
            what = "the policy to evaluate (a pretrained_model/ or checkpoint directory, or a Hub id)"
            if name == "env.type":
                what = f"the env to evaluate in ({', '.join(ENV_TYPES)})"
            raise UsageError(f"--{name} is required: {what}")
    try:
        env_cls = env_class(flags.pop("env.type"))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    specs = eval_flags(env_cls)
    tree: dict[str, Any] = {"policy": {}, "env": {}, "eval": {}}
    policy_fields: dict[str, str] = {}
    for name, raw in flags.items():
        spec = specs.get(name)
        if spec is None and name.startswith("policy."):
            policy_fields[name] = raw
            continue
        if spec is None:
            raise _unknown_flag(name, specs)
        section, dot, leaf = name.partition(".")
        if dot:
            tree[section][leaf] = convert(spec, raw)
        else:
            tree[name] = convert(spec, raw)
    try:
        cfg = EvalRunConfig(
            policy=EvalPolicyFlags(**tree.pop("policy")),
            env=env_cls(**tree.pop("env")),
            eval=EvalConfig(**tree.pop("eval")),
            **tree,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return cfg, policy_fields


def with_policy_fields(policy_cfg, policy_fields: dict[str, str], file: Path):
    """The saved config with ``--policy.<field>`` flags applied (LeRobot's overrides of a
    ``--policy.path`` config), each converted by the field's type; an unknown field is one line."""
    if not policy_fields:
        return policy_cfg
    import cattrs

    from lerobot_cli import configio
    from lerobot_cli.policies.serialization import policy_config_from_dict

    specs = {s.path: s for s in field_specs(type(policy_cfg), "policy.")}
    data = configio.unstructure_policy_config(policy_cfg)
    for name, raw in policy_fields.items():
        if name not in specs:
            close = difflib.get_close_matches(name, list(specs), n=1, cutoff=0.6)
            hint = f"; did you mean --{close[0]}?" if close else ""
            raise UsageError(
                f"unknown flag --{name}: the {policy_cfg.type} policy of {file} has no such field{hint}"
            )
        data[name.removeprefix("policy.")] = convert(specs[name], raw)
    try:
        return policy_config_from_dict(data, type(policy_cfg))
    except (ValueError, TypeError, cattrs.BaseValidationError) as exc:
        raise UsageError(f"--policy.* on {file}: {exc}") from None


def render_help(env_cls: type[EnvConfig] | None, policy_cls: type | None = None) -> str:
    """The flags: ours, the env's once ``--env.type`` is given, the policy's once ``--policy.path`` is."""
    lines = [
        f"usage: {PROG} --policy.path=DIR --env.type={{{','.join(ENV_TYPES)}}} [--flag=value ...]",
        "",
        "Roll a saved policy out in a simulation env; writes <output_dir>/eval_info.json and videos.",
        "",
        f"  --env.type  {{{','.join(ENV_TYPES)}}}  The env (its fields: --env.type=NAME --help).",
        "  --policy.<field>  The saved config's own fields, overridden (them all: --policy.path=DIR --help).",
    ]
    specs = list(eval_flags(env_cls).values())
    if policy_cls is not None:
        ours = {s.path for s in specs}
        specs += [s for s in field_specs(policy_cls, "policy.") if s.path not in ours]
    for spec in specs:
        lines.append(f"  --{spec.path}  {type_name(spec.type)}  {spec.help}")
    return "\n".join(lines) + "\n"


def policy_class_for_help(flags: dict[str, str]) -> type | None:
    if "policy.path" not in flags:
        return None
    from lerobot_ckpt.layout import POLICY_CONFIG

    from lerobot_cli.cli.paths import resolve_policy_dir
    from lerobot_cli.policies.serialization import load_policy_config

    return type(load_policy_config(resolve_policy_dir(flags["policy.path"]) / POLICY_CONFIG))
