"""``torch.distributed.checkpoint`` directories (``pytorch_model_fsdp_0/``, ``optimizer_0/``).

``metadata`` reads ``.metadata`` with a restricted unpickler (no torch, no code from the file),
``index`` checks a directory against a model and reads one stored chunk at a time, ``raw`` locates a
chunk's tensor bytes inside its shard file so they can be copied, not decoded (all three torch-free),
and ``save_load`` is the collective DCP save and resharding load, with our errors. Internal.
"""
