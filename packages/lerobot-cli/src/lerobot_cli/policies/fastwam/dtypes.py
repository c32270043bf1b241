"""``TORCH_DTYPES``: ``--policy.torch_dtype``'s names as torch dtypes.

``config.py`` lists the names and stays torch-free; the networks (``model.py``), the frozen parts
(``frozen.py``), the policy's inputs (``modeling.py``) and the precomputed task contexts (``precompute.py``)
all take their dtype from this one table.
"""

from __future__ import annotations

import torch

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
