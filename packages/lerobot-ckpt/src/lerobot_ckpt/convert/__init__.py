"""``lerobot-convert-dcp``: DCP weight shards merged offline into one safetensors file.

``merge`` is the converter (:func:`lerobot_ckpt.convert_dcp`; torch-free unless it casts), ``cli``
the console script around it, ``hub`` the upload of a converted ``pretrained_model/``
(:func:`lerobot_ckpt.push_to_hub`). This ``__init__`` imports nothing, so the console script pays
only for what it uses.
"""
