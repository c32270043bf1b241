"""The usage errors of this package (torch-free).

Messages name settings by their config path, relative to a config tree whose ``parallelism`` and
``accelerator`` sections are :class:`~lerobot_parallel.config.ParallelismConfig` and
:class:`~lerobot_parallel.config.AcceleratorConfig` (``parallelism.dp_shard``,
``accelerator.fsdp.wrap_modules``, ``accelerator.fsdp.mixed_precision_policy.*``), and the device by
the ``device=`` argument: never by a command-line flag, because a foreign trainer has none. A front
end with flags for these paths respells them (``lerobot-train`` prints ``--parallelism.dp_shard``).
"""

from __future__ import annotations


class ParallelismError(ValueError):
    """A topology that cannot be built from the launched processes (a usage error)."""


class ShardingError(ParallelismError):
    """A model that cannot be sharded as asked (no wrap units, unknown class, tied weights across units …).

    A subclass of :class:`ParallelismError` so a CLI that already turns topology errors into a
    usage exit (code 2) handles these the same way.
    """


class ConfigTypeError(ParallelismError, TypeError):
    """A config field given a value of the wrong type: a usage error, and a ``TypeError`` too."""
