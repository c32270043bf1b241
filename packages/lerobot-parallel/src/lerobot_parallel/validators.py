"""The attrs validators and converters the torch-free configs share: one copy of each rule.

Each takes the field's config path (``parallelism.dp_shard``, ``accelerator.fsdp.min_num_params``;
see :mod:`lerobot_parallel.errors`) and names it in its message, so every config reports a bad
value the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from lerobot_parallel.errors import ConfigTypeError, ParallelismError

Validator = Callable[[Any, Any, Any], None]


def is_integer(value: object) -> bool:
    """An ``int`` that is not a ``bool`` (``True`` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def require_count(
    path: str, value: object, requirement: str | None = None, *, minimum: int = 1, allow_all: bool = False
) -> int:
    """``value`` if it is an integer ≥ ``minimum`` (or ``-1``, "all launched processes", with
    ``allow_all``); else :class:`ConfigTypeError` (not an integer) or :class:`ParallelismError`
    saying ``path`` must be ``requirement`` (default: "an integer ≥ minimum")."""
    if not is_integer(value):
        raise ConfigTypeError(f"{path} must be an integer, got {value!r}")
    if value >= minimum or (allow_all and value == -1):
        return value
    raise ParallelismError(f"{path} must be {requirement or f'an integer ≥ {minimum}'}, got {value!r}")


def count(
    path: str,
    requirement: str | None = None,
    *,
    minimum: int = 1,
    allow_all: bool = False,
    optional: bool = False,
) -> Validator:
    """attrs validator for :func:`require_count` (≥ ``minimum``); ``None`` passes when ``optional``."""

    def check(inst: Any, attribute: Any, value: Any) -> None:
        if value is None and optional:
            return
        require_count(path, value, requirement, minimum=minimum, allow_all=allow_all)

    return check


def require_choice(path: str, value: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else :class:`ParallelismError` naming ``path`` and them."""
    if value not in choices:
        raise ParallelismError(f"{path}: invalid choice {value!r} (choose from {', '.join(choices)})")
    return value


def choice(path: str, choices: tuple[str, ...], *, optional: bool = False) -> Validator:
    """attrs validator for :func:`require_choice`; ``None`` passes when ``optional``."""

    def check(inst: Any, attribute: Any, value: Any) -> None:
        if value is None and optional:
            return
        require_choice(path, value, choices)

    return check


def tuple_or_none(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """attrs converter for a list field: a single string is a one-item tuple, ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    return tuple(value)
