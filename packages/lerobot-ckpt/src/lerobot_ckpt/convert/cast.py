"""Floating-point casts of raw tensor bytes without torch, bit-equal to ``tensor.to(dtype)``.

``lerobot-convert-dcp --dtype`` must work where only ``lerobot-ckpt`` is installed (no torch, whose
CUDA wheels are gigabytes). NumPy has float16/32/64 with IEEE round-to-nearest-even, which is what
torch does; it has no bfloat16, so bfloat16 is handled as its bit pattern: widening is a 16-bit
shift, narrowing is torch's ``round_to_nearest_even`` (add ``0x7FFF`` plus the lowest kept bit and
truncate). Like torch (whose ``Half`` and ``BFloat16`` are built from a float), a float64 source goes
through float32 on its way to bfloat16 or float16: rounded twice, which differs from rounding once
when float32 lands exactly on a tie. A value too large for the target becomes an infinity.

Every value that is not a NaN is bit-equal to torch's cast: tests/test_ckpt_cast.py compares the
bytes with torch's for every pair of these dtypes on a fixed table of bit patterns (ties with an even
and an odd kept bit, ±0, subnormals, the largest finite values, overflow, ±inf, NaNs of both signs).
A NaN stays a NaN, with its sign except to bfloat16, but its payload is not reproduced: torch's own
payloads differ between its scalar and vectorised kernels (``0x7FC0`` versus ``0xFFFF`` for bfloat16
on the same machine, whatever the NaN's sign), so there is no single answer to match; here bfloat16
NaNs are ``0x7FC0`` (c10's reference) and float16 NaNs are quieted as torch quiets them.
NumPy is imported only when a cast is asked for.
"""

from __future__ import annotations

from typing import Any

from lerobot_ckpt._dtypes import DType

CASTABLE = ("float64", "float32", "float16", "bfloat16")


def _as_float(np: Any, data: memoryview, dtype: DType) -> Any:
    """The values of ``data`` as a NumPy float array (bfloat16 widened to float32, exactly)."""
    if dtype.name == "bfloat16":
        return (np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(
        data, dtype={"float64": np.float64, "float32": np.float32, "float16": np.float16}[dtype.name]
    )


def _to_bfloat16(np: Any, values: Any) -> Any:
    bits = values.astype(np.float32).view(np.uint32)
    rounded = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def _to_float16(np: Any, values: Any) -> Any:
    out = values.astype(np.float32).astype(np.float16).view(np.uint16)  # twice, as torch rounds float64
    return np.where(np.isnan(values), out | np.uint16(0x0200), out)  # quiet NaN, as torch writes it


def cast_bytes(data: memoryview | bytes | bytearray, source: DType, target: DType) -> memoryview:
    """``data`` (little-endian elements of ``source``) as ``target``'s bytes; both floating point."""
    for dtype in (source, target):
        if dtype.name not in CASTABLE:
            raise TypeError(f"cannot cast {dtype}: only {', '.join(CASTABLE)} are supported")
    data = memoryview(data).cast("B")
    if source == target:
        return data
    import numpy as np

    with np.errstate(over="ignore", invalid="ignore"):  # overflow to ±inf is the cast's meaning
        values = _as_float(np, data, source)
        if target.name == "bfloat16":
            out = _to_bfloat16(np, values)
        elif target.name == "float16":
            out = _to_float16(np, values)
        else:
            out = values.astype({"float64": np.float64, "float32": np.float32}[target.name])
    return memoryview(np.ascontiguousarray(out)).cast("B")
