"""Fork DataLoader workers whose garbage collector never touches what they inherited.

Why: a forked worker inherits every object of its rank, garbage not yet collected included, but none of
the rank's threads. When the worker's collector frees such an object, its destructor runs in a process
where the threads it waits for do not exist: a gloo ``ProcessGroup`` left in a reference cycle (an
earlier run's, a torn-down mesh's) joins its threads in its C++ destructor and blocks that worker for
ever, inside whatever allocation triggered the collection (seen: ``collate`` making a shared-memory
batch), and the rank waits on a batch that never comes. A DataLoader iterator's own ``__del__``
likewise fails in a child ("can only test a child process").

So (the recipe of Python's ``gc.freeze`` documentation, on the child's side): the rank pauses its
collector while it forks (:func:`collector_paused_for_fork`), so no collection can run in a child
before its first act; that act (:class:`FreezeInherited`, the start of the worker's ``worker_init_fn``)
is ``gc.freeze()``: every inherited object moves to a generation the collector never scans, then the
collector resumes as the rank had it. A worker thus collects only its own objects, and does not write
the collector's bookkeeping into inherited pages (which would copy them: memory per worker). The rank's
own heap, and whatever it froze itself, are untouched; its garbage is collected where its threads live.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class FreezeInherited:
    """A ``worker_init_fn`` that first freezes what the worker inherited, then calls ``inner``."""

    def __init__(self, inner: Callable[[int], None] | None = None) -> None:
        self.inner = inner
        self.collector_was_enabled = gc.isenabled()  # the rank's, set again before each fork

    def __call__(self, worker_id: int) -> None:
        gc.freeze()
        if self.collector_was_enabled:
            gc.enable()
        if self.inner is not None:
            self.inner(worker_id)


@contextmanager
def collector_paused_for_fork(init: FreezeInherited) -> Iterator[None]:
    """No automatic collection in the rank, hence none in a child forked inside the block before its
    ``init`` freezes what it inherited; the rank's collector is as before afterwards."""
    was_enabled = gc.isenabled()
    init.collector_was_enabled = was_enabled
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
