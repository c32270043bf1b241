"""The PaliGemma-with-expert flow policy pi0 and pi05 share (LeRobot keeps a copy in each policy):
tower sizes (``variants``), joint layers (``gemma``), towers (``backbone``), flow model (``flow``), config
fields and spec (``config``), policy (``policy``) and the config-built processor steps (``processors``).
``policies/pi0`` and ``policies/pi05`` subclass these with their own names, defaults and steps."""
