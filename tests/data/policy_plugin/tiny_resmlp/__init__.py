"""A test policy registered through the ``lerobot_cli.policies`` entry point (see ../pyproject.toml)."""
