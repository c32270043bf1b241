"""print_once_per_job: the main rank prints, a peer waits for it and stays silent, or prints its own line.

The store is faked (the protocol is set/wait on one key); tests/test_bad_inputs.py runs the real thing
on two torchrun ranks (rows with ``"once": true``).
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from lerobot_parallel import job_message


class FakeStore:
    def __init__(self, printed: bool = False) -> None:
        self.keys = {job_message.PRINTED_KEY} if printed else set()
        self.waited = []

    def set(self, key, value) -> None:
        self.keys.add(key)

    def wait(self, keys, timeout) -> None:
        self.waited.append(timeout.total_seconds())
        if not set(keys) <= self.keys:
            raise RuntimeError("Socket Timeout")  # what torch's store raises (DistStoreError)


def _runtime(rank: int):
    return SimpleNamespace(is_main=rank == 0, is_distributed=True, timeout_s=600)


@pytest.fixture
def store(monkeypatch):
    holder = FakeStore()
    monkeypatch.setattr(job_message, "_store", lambda: holder)
    return holder


def test_the_main_rank_prints_and_says_so(store):
    out = io.StringIO()
    job_message.print_once_per_job("prog: error: x", _runtime(0), stream=out)
    assert out.getvalue() == "prog: error: x\n" and job_message.PRINTED_KEY in store.keys


def test_a_peer_stays_silent_once_the_main_rank_printed(store):
    store.keys.add(job_message.PRINTED_KEY)
    out = io.StringIO()
    job_message.print_once_per_job("prog: error: x", _runtime(1), stream=out)
    assert out.getvalue() == "" and store.waited == [job_message.DEFAULT_WAIT_S]


def test_a_peer_that_failed_alone_prints_after_the_bounded_wait(store):
    out = io.StringIO()
    job_message.print_once_per_job("prog: error: only rank 1", _runtime(1), stream=out, wait_s=0.5)
    assert out.getvalue() == "prog: error: only rank 1\n" and store.waited == [0.5]


def test_without_a_session_or_a_store_every_caller_prints(monkeypatch):
    monkeypatch.setattr(job_message, "_store", lambda: None)
    for runtime in (None, _runtime(1)):
        out = io.StringIO()
        job_message.print_once_per_job("prog: error: x", runtime, stream=out)
        assert out.getvalue() == "prog: error: x\n"
