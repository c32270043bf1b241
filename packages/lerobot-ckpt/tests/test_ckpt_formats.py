import pytest
from lerobot_ckpt import CheckpointFormat


@pytest.mark.parametrize(
    ("fmt", "safetensors", "dcp"),
    [("safetensors", True, False), ("dcp", False, True), ("safetensors_dcp", True, True)],
)
def test_formats(fmt, safetensors, dcp):
    f = CheckpointFormat(fmt)
    assert (f.writes_safetensors, f.writes_dcp) == (safetensors, dcp)
    assert str(f) == fmt


def test_unknown_format():
    with pytest.raises(ValueError):
        CheckpointFormat("pickle")
