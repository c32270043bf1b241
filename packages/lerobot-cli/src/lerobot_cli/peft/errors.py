"""The PEFT error every adapter check raises, and the key naming an adapter's base (torch-free).

A module of its own so that the adapter-file checks (``adapterfile``) and the base lookup
(``basefile``, which runs them) both import it without importing each other."""

from __future__ import annotations

BASE_KEY = "base_model_name_or_path"


class PeftSetupError(ValueError):
    """A PEFT run that cannot start as configured (the message names the flag or file)."""
