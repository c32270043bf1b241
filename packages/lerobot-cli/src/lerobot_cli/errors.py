"""The error policy, optimizer and sample-weighting code raises for a run that cannot work as configured.

A neutral module of its own (no imports) so that this code need not import the command line
(``lerobot_cli.cli``) to say "the user can fix this": the CLI's :class:`~lerobot_cli.cli.errors.UsageError`
is a ``ConfigError`` too, and the CLI and the runner turn every ``ConfigError`` into one
``lerobot-train: error:`` line and exit code 2, no traceback. ``tests/test_import_dag.py`` keeps these
packages off the CLI.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """The flags, files or environment ask for something this run cannot do; the message is one sentence
    naming what to change (a ``ValueError``, so callers that catch those keep working)."""
