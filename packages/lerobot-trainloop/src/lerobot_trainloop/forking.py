"""Fork DataLoader workers whose garbage collector never touches what they inherited.

Why: a forked worker inherits every object of its rank, garbage not yet collected included, but none of
the rank's threads. When the worker's collector frees such an object, its destructor runs in a process
where the threads it waits for do not exist: a gloo ``ProcessGroup`` left in a reference cycle (an
earlier run's, a torn-down mesh's) joins its threads in its C++ destructor and blocks that worker for
ever, inside whatever allocation triggered the collection (seen: ``collate`` making a shared-memory
batch), and the rank waits on a batch that never comes. A DataLoader iterator's own ``__del__``
likewise fails in a child ("can only test a child process").

So the rank freezes its heap (``gc.freeze()``: every tracked object moves to a generation the collector
never scans) for the instant it forks, and thaws it in itself right after. The workers keep it frozen:
they collect only their own objects, and, as a bonus, do not write the collector's bookkeeping into
thousands of inherited pages (which would copy them: memory per worker). The rank's own garbage is
collected later as usual, where its threads live. A heap already frozen by the caller stays so.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def heap_frozen_for_fork() -> Iterator[None]:
    """Processes forked inside the block never collect an object that existed when they were forked."""
    already = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not already:
            gc.unfreeze()
