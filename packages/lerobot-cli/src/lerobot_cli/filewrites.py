"""A failed write names its file, as the guide promises for a full disk.

``Path.write_text`` and safetensors' ``save_file`` report a full disk (ENOSPC), a file-size limit (EFBIG)
or a quota without the file's name (only a failed ``open`` names it), so the run's one line said
"OSError: [Errno 28] No space left on device" and nothing more. Every file this package writes into a
checkpoint's ``pretrained_model/`` (config, train config, processors, adapter config) is written inside
:func:`writing`, which turns such an error into ``lerobot_ckpt``'s :class:`CheckpointWriteError` naming
the file: the sentence the checkpoint library gives for the weights it writes itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lerobot_ckpt import CheckpointError, CheckpointWriteError
from safetensors import SafetensorError


@contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """Run the block that writes ``path``; an OS or safetensors write error is re-raised naming it."""
    try:
        yield
    except CheckpointError:
        raise
    except (OSError, SafetensorError) as exc:
        text = str(exc).strip().splitlines()
        detail = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
        raise CheckpointWriteError(f"could not write {path}: {detail}", path=path, os_error=exc) from exc
