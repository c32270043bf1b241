"""check_batch_fits:
a global batch larger than the frames trained on is one line naming the flags to change."""

from __future__ import annotations

import pytest
from lerobot_cli.batch_fit import check_batch_fits
from lerobot_cli.cli.errors import UsageError


def _message(*args) -> str:
    with pytest.raises(UsageError) as caught:
        check_batch_fits(*args)
    return str(caught.value)


def test_a_batch_that_fits_passes():
    check_batch_fits(8, 2, 16, None)


def test_the_message_names_the_product_and_only_the_fixes_that_apply():
    assert _message(20, 1, 16, None) == (
        "--batch_size=20 x 1 dp workers = 20 samples is larger than the dataset "
        "(16 frames); lower --batch_size to at most 16"
    )
    assert _message(3, 8, 4, [0]) == (
        "--batch_size=3 x 8 dp workers = 24 samples is larger than the dataset "
        "(4 frames in the 1 episode(s) of --dataset.episodes); launch fewer "
        "processes, or select more episodes"
    )
