"""ACT policy. Importing this package stays torch-free; the model lives in ``act.modeling``."""

from lerobot_cli.policies.act.config import ACTConfig

__all__ = ["ACTConfig"]
