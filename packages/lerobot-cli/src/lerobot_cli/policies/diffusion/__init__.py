"""Diffusion Policy (``--policy.type=diffusion``): LeRobot 0.6.1's ``DiffusionPolicy``, written here."""
