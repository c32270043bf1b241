"""Simulation environments for evaluation (``--env.type=pusht``): LeRobot 0.6.1's env configs, the gymnasium
vector env they build, and LeRobot's mapping of an env's observation to a policy's inputs.

Split so that the config stays torch- and gym-free (parsed and validated before a run imports either):
``config`` (fields and defaults), ``make`` (the vector env; a missing extra is one line),
``observation`` (``pixels``/``agent_pos`` -> ``observation.image``/``observation.state``).
"""

from lerobot_cli.envs.config import ENV_TYPES, EnvConfig, PushtEnvConfig, env_config

__all__ = ["ENV_TYPES", "EnvConfig", "PushtEnvConfig", "env_config"]
