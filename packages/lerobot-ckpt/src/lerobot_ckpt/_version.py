"""The source tree's version of lerobot-ckpt, in a leaf module: ``state.record`` falls back to it without
importing the package root, which imports ``state.record`` (a cycle, lazy or not)."""

__version__ = "0.1.0"
