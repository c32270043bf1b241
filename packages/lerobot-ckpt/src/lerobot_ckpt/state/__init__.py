"""Each kind of training state and its on-disk form.

``record`` (``training_step.json``, :class:`RunInfo`, :class:`CheckpointFormat`; torch-free),
``rng`` (every rank's generators), ``model`` (the weights file, checked against the model),
``optimizer`` (one safetensors + JSON file, LeRobot's keys), ``scheduler_scaler`` (their JSON
files) over ``json_codec`` (state dicts as JSON, typed back like the live object), and ``fqn``
(FQN-keyed state of any topology, what resharding reads into). Internal: the public names are
exported by :mod:`lerobot_ckpt`.
"""
