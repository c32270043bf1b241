"""What a resume says about the EMA: changed settings, a shadow that starts late or is dropped (the
files side: tests/test_ema_layouts.py and packages/lerobot-ckpt/tests/test_ckpt_ema.py)."""

from __future__ import annotations

from types import SimpleNamespace

from lerobot_cli.checkpointing import _ema_notes
from lerobot_cli.config import TrainConfig
from lerobot_cli.runplan import ema_changes
from lerobot_trainloop import EmaConfig


def test_changed_settings_are_listed_only_when_both_runs_keep_an_ema():
    on = TrainConfig(ema=EmaConfig(enable=True))
    assert ema_changes(TrainConfig(ema=EmaConfig(enable=True, power=0.5, update_after_step=3)), on) == [
        "ema.update_after_step: 0 → 3",
        "ema.power: 0.75 → 0.5",
    ]
    assert ema_changes(on, on) == []
    assert (
        ema_changes(TrainConfig(ema=EmaConfig(enable=True, power=0.5)), TrainConfig()) == []
    )  # saved had none
    assert ema_changes(on, None) == []


def test_a_shadow_that_does_not_continue_is_said():
    def state(has_ema: bool):
        artifacts = SimpleNamespace(ema=has_ema)
        return SimpleNamespace(step=40, record=SimpleNamespace(artifacts=artifacts))

    (late,) = _ema_notes(SimpleNamespace(ema=object()), state(False))
    assert "has no EMA shadow" in late and "starts from the resumed weights at step 40" in late
    (dropped,) = _ema_notes(SimpleNamespace(ema=None), state(True))
    assert "not continued (--ema.enable=false)" in dropped
    assert _ema_notes(SimpleNamespace(ema=object()), state(True)) == []
    assert _ema_notes(SimpleNamespace(ema=None), state(False)) == []
