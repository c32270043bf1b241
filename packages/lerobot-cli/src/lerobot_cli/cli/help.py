"""``--help`` text: every flag by section with type, default and one line of doc (no torch)."""

from __future__ import annotations

import json
from typing import Any

import attrs

from lerobot_cli.cli.build import _OPTIONAL_SECTIONS, known_flags
from lerobot_cli.cli.schema import FlagSpec, type_name
from lerobot_cli.envs.config import ENV_TYPES, EnvConfig
from lerobot_cli.policies import registry
from lerobot_cli.policies.config import PolicyConfig

_INTRO = """\
usage: lerobot-train [--config_path=FILE] [--policy.type=NAME | --policy.path=DIR] [--SECTION.FIELD=VALUE ...]

Train a LeRobot policy on one process, or many with torchrun / accelerate launch (DDP, FSDP2, HSDP).
Values: --a.b=value or --a.b value; booleans true/false, 1/0, yes/no or on/off; lists and objects as JSON;
null (or none) for no value, except where none is one of the flag's choices.
"""


def _plain(o: Any) -> Any:
    """What JSON cannot write: an enum's value, an attrs instance's fields (``tfs``' entries), else text."""
    if attrs.has(type(o)):
        return attrs.asdict(o, recurse=True)
    return getattr(o, "value", str(o))


def _default_text(value: Any) -> str:
    if hasattr(value, "value") and not isinstance(value, int | float | str):
        value = value.value
    try:
        return json.dumps(value, default=_plain)
    except TypeError:
        return str(value)


def _line(spec: FlagSpec, width: int) -> str:
    kind = type_name(spec.type)
    if spec.choices:
        kind = "{" + ",".join(spec.choices) + "}" + ("|null" if kind.endswith("|null") else "")
    head = f"  --{spec.path} {kind}"
    doc = spec.help or ""
    tail = f"{doc} (default: {_default_text(spec.default)})".strip()
    return f"{head:<{width}} {tail}" if len(head) < width else f"{head}\n{'':<{width}} {tail}"


def _section(path: str) -> str:
    head, _, rest = path.partition(".")
    if not rest:
        return head if head in _OPTIONAL_SECTIONS else "top level"
    if head == "accelerator" and "." in rest:
        return f"{head}.{rest.partition('.')[0]}"
    return head


def render_help(policy_cls: type[PolicyConfig] | None, env_cls: type[EnvConfig] | None = None) -> str:
    specs = known_flags(policy_cls, env_cls)
    width = 52
    groups: dict[str, list[FlagSpec]] = {}
    for spec in specs.values():
        groups.setdefault(_section(spec.path), []).append(spec)
    lines = [_INTRO]
    lines.append("top level:")
    lines.append(
        f"  {'--config_path FILE|DIR':<{width - 2}} Start from a train_config.json "
        "(also a checkpoint dir); flags override it."
    )
    for spec in groups.pop("top level", []):
        lines.append(_line(spec, width))
    lines.append("")
    lines.append("policy:")
    names = ",".join(registry.available())
    lines.append(f"  {'--policy.type {' + names + '}':<{width - 2}} Policy to train from scratch.")
    lines.append(
        f"  {'--policy.path DIR|REPO_ID':<{width - 2}} Start from a pretrained policy's config.json; "
        "--policy.* override it."
    )
    policy_specs = groups.pop("policy", [])
    if policy_cls is None:
        lines.append("  (add --policy.type=NAME --help to list one policy's fields)")
    else:
        lines.append(f"  fields of --policy.type={policy_cls.type}:")
        lines += [_line(s, width) for s in policy_specs]
    lines.append("")
    lines.append("env:")
    names = ",".join(ENV_TYPES)
    lines.append(
        f"  {'--env.type {' + names + '}':<{width - 2}} Simulation env the policy is rolled out in every "
        "--env_eval_freq steps (default: none)."
    )
    env_specs = groups.pop("env", [])
    if env_cls is None:
        lines.append("  (add --env.type=NAME --help to list one env's fields)")
    else:
        lines.append(f"  fields of --env.type={env_cls.type}:")
        lines += [_line(s, width) for s in env_specs]
    for name, group in groups.items():
        lines.append("")
        lines.append(f"{name}:")
        lines += [_line(s, width) for s in group]
    lines.append("")
    lines.append(
        "Env: LEROBOT_ALLOW_ACCELERATE_ENV=1 accepts Accelerate engine variables "
        "(they are overridden by these flags)."
    )
    return "\n".join(lines) + "\n"
