"""InterruptWatch (one process): a repeat of the same signal soon after the first is the same stop
request delivered twice (a scheduler signals every process, the launcher forwards its copy); a later
or a different signal is the user insisting, and gets out at once."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from lerobot_cli import interrupt
from lerobot_cli.interrupt import InterruptWatch, TrainingInterrupted


def _signal_self(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # the handler runs on the main thread at the next bytecode


def test_a_prompt_repeat_of_the_signal_is_the_same_request():
    with InterruptWatch(torch.device("cpu"), distributed=False) as watch:
        _signal_self(signal.SIGTERM)
        try:
            _signal_self(signal.SIGTERM)  # the launcher's forwarded copy
        except KeyboardInterrupt:
            pytest.fail("a prompt repeat of the signal was taken for a second one")
        with pytest.raises(TrainingInterrupted) as stopped:
            watch.check()
    assert stopped.value.signum == signal.SIGTERM


def test_a_later_repeat_gets_out(monkeypatch):
    monkeypatch.setattr(interrupt, "REPEAT_S", 0.2)
    with InterruptWatch(torch.device("cpu"), distributed=False):
        _signal_self(signal.SIGINT)
        time.sleep(0.3)
        with pytest.raises(KeyboardInterrupt):
            _signal_self(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_another_signal_gets_out_at_once():
    previous = signal.getsignal(signal.SIGTERM)
    with InterruptWatch(torch.device("cpu"), distributed=False):
        _signal_self(signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt):
            _signal_self(signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is previous
