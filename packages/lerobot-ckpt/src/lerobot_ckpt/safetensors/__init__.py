"""safetensors files: whole (``files``: ties as header aliases, LeRobot-compatible), streamed tensor by
tensor from a layout planned up front (``stream``; torch-free at import), and gathered from a sharded
model one tensor at a time (``gather``). Internal: :func:`lerobot_ckpt.read_tensors` and
:func:`lerobot_ckpt.write_tensors` are the public entry points.
"""
