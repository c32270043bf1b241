"""Crash-safe file-system work: what makes a checkpoint appear whole or not at all.

``filesystem`` (fsync, atomic exchange, symlink swap), ``staging`` (write under a dot-name, then
rename and swap ``last``), ``set_aside`` (move superseded checkpoints, never rewrite them) and
``run_lock`` (one run per output directory). Torch-free. Internal: the public names are exported
by :mod:`lerobot_ckpt`.
"""
