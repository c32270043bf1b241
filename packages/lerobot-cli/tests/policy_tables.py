"""Per-policy tables the tests cannot derive from the registry, held to it: a policy registered without its
entry fails, naming the policy and the table, instead of silently escaping the check.

A pinned list (the fields LeRobot's class lacks, the settings that once broke LeRobot's parser, an interop
driver's flags) is a decision per policy, so it stays a table; which policies it must cover is the
registry's (``lerobot_cli.policies.registry.available``). Loaded by path (``--import-mode=importlib``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lerobot_cli.policies import registry


def unlisted(table: Mapping[str, object], what: str, names: Iterable[str] | None = None) -> list[str]:
    """One line per registered policy (or per name of ``names``) that ``table`` lacks."""
    return [
        f"policy {name!r} registered but has no {what}: add it"
        for name in (registry.available() if names is None else names)
        if name not in table
    ]


def require_every_policy(table: Mapping[str, object], what: str, names: Iterable[str] | None = None) -> None:
    """Fail naming each registered policy ``table`` lacks."""
    missing = unlisted(table, what, names)
    assert not missing, "\n".join(missing)
