"""The one exception type the dataset reader raises for bad input."""

from __future__ import annotations


class DatasetError(ValueError):
    """A dataset on disk (or where to find it) is not usable.

    The message is one sentence that names the offending file and says what would be valid, so that the
    CLI can print ``str(err)`` on one line and exit with status 2 instead of showing a traceback.
    """
