"""``convert.cast`` (the torch-free ``--dtype`` of the converter) bit for bit against torch's own cast.

A fixed table of bit patterns for each source dtype, chosen where a cast can go wrong: round-to-nearest
ties with an even and an odd kept bit (and one ulp either side), ±0, subnormals (their ties, the
largest one, which rounds up to the smallest normal), the largest finite values (to the largest
target value, and past it to infinity), overflow of wider values, ±inf, and NaNs of both signs, quiet
and signalling. float64 values where rounding twice (through float32, as torch does) differs from
rounding once. Every non-NaN result must equal torch's bytes; a NaN must stay a NaN, with its sign
where torch keeps it (every target but bfloat16: torch writes ``0xFFFF`` from its vectorised kernel,
``0x7FC0`` from its scalar one).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lerobot_ckpt._dtypes import DTYPES
from lerobot_ckpt.convert.cast import CASTABLE, cast_bytes

# fmt: off
F32 = [
    0x00000000, 0x80000000,  # ±0
    0x3F800000, 0xBF800000,  # ±1
    0x3F808000, 0xBF808000,  # ties to bfloat16, kept bit even: down
    0x3F818000, 0xBF818000,  # ties, kept bit odd: up
    0x3F807FFF, 0x3F808001, 0x3F817FFF, 0x3F818001,  # one ulp either side of a tie
    0x3F801000, 0x3F803000, 0x3F802000, 0x3F800FFF, 0x3F801001,  # ties (and neighbours) to float16
    0x00000001, 0x80000001, 0x00008000, 0x00018000, 0x00017FFF,  # subnormals, their ties
    0x007FFFFF, 0x807FFFFF, 0x00800000,  # the largest subnormal, the smallest normal
    0x33000000, 0x33000001, 0x33800000, 0x387FC000, 0x38800000,  # float16's subnormal range, its ties
    0x7F7F7FFF, 0x7F7F8000, 0x7F7E8000, 0x7F7FFFFF, 0xFF7FFFFF,  # the largest finite: kept, tie, overflow
    0x477FE000, 0x477FEFFF, 0x477FF000, 0x47800000,  # float16's largest (65504), its overflow tie
    0x7F800000, 0xFF800000,  # ±inf
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F808000,  # NaNs
]
# fmt: on
F64_EXTRA = [
    1 + 2**-8 + 2**-30,  # above a bfloat16 tie in float64, exactly a tie once in float32
    1 + 2**-11 + 2**-40,  # the same for float16
    -(1 + 2**-8 + 2**-30),
    3.5e38,  # past float32's range: inf through float32
    1e-50,  # below float32's subnormals: zero
    -1e-50,
    np.finfo(np.float64).max,
    np.finfo(np.float64).tiny,
    5e-324,
]
# fmt: off
F16 = [
    0x0000, 0x8000, 0x3C00, 0x0001, 0x8001, 0x03FF, 0x0400,  # ±0, 1, subnormals, smallest normal
    0x7BFF, 0xFBFF, 0x7C00, 0xFC00,  # largest finite, ±inf
    0x7E00, 0xFE00, 0x7C01, 0xFC01, 0x7FFF,  # NaNs
]
# fmt: on
BF16 = [
    0x0000,
    0x8000,
    0x3F80,
    0x0001,
    0x007F,
    0x0080,
    0x7F7F,
    0xFF7F,
    0x7F80,
    0xFF80,
    0x7FC0,
    0xFFC0,
    0x7F81,
    0xFFFF,
]  # fmt: skip


def _source(name: str) -> torch.Tensor:
    f32 = torch.from_numpy(np.array(F32, dtype=np.uint32).view(np.float32).copy())
    if name == "float32":
        return f32
    if name == "float64":
        return torch.cat([f32.double(), torch.tensor(F64_EXTRA, dtype=torch.float64)])
    if name == "float16":
        return torch.from_numpy(np.array(F16, dtype=np.uint16).view(np.float16).copy())
    return torch.from_numpy(np.array(BF16, dtype=np.uint16).view(np.int16).copy()).view(torch.bfloat16)


def _bits(tensor: torch.Tensor) -> np.ndarray:
    raw = tensor.contiguous().view(torch.uint8).numpy()
    return raw.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[tensor.element_size()])


@pytest.mark.parametrize("target", CASTABLE)
@pytest.mark.parametrize("source", CASTABLE)
def test_the_cast_is_torchs_bit_for_bit(source, target):
    values = _source(source)
    expected = values.to(getattr(torch, target))
    got = torch.frombuffer(
        bytearray(cast_bytes(_bits(values).tobytes(), DTYPES[source], DTYPES[target])),
        dtype=getattr(torch, target),
    )
    assert got.shape == expected.shape
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan), (
        f"{source}->{target}: NaN where torch has none (or none where it has)"
    )
    ours, theirs = _bits(got), _bits(expected)
    wrong = [
        f"{_bits(values)[i]:#x}: {ours[i]:#x}, torch {theirs[i]:#x}"
        for i in np.flatnonzero(~nan.numpy() & (ours != theirs))
    ]
    assert not wrong, f"{source}->{target}: {wrong}"
    if target != "bfloat16":
        sign = np.uint64(1) << np.uint64(8 * expected.element_size() - 1)
        mask = nan.numpy()
        assert ((ours[mask].astype(np.uint64) & sign) == (theirs[mask].astype(np.uint64) & sign)).all()


def test_the_table_holds_every_class():
    """The patterns are the classes named above (a table edited by mistake would test less)."""
    f32 = np.array(F32, dtype=np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):
        assert np.isnan(f32).sum() == 7 and np.isinf(f32).sum() == 2 and (f32 == 0).sum() == 2
    subnormal = (np.abs(f32) < np.finfo(np.float32).tiny) & (f32 != 0)
    assert subnormal.sum() >= 6
    ties = [b for b in F32 if b & 0xFFFF == 0x8000 and (b >> 23) & 0xFF not in (0, 0xFF)]
    assert {(b >> 16) & 1 for b in ties} == {0, 1}  # even and odd kept bits
