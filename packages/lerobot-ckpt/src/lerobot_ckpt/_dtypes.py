"""Tensor dtypes as plain values, so code that only moves bytes never imports torch.

Importing a CUDA build of torch costs ~0.6 GB of resident memory and seconds of start-up. The
offline converter needs a dtype's name, element size, whether it is floating point and its
safetensors code, never torch itself; :class:`DType` carries exactly that, under torch's own
attribute name (``"bfloat16"``), and :meth:`DType.torch` returns the real ``torch.dtype`` for the
code paths that do compute (casts, ``torch.load``). :func:`dtype_of` accepts either kind, so
functions shared with the training-time path (which passes ``torch.dtype``) take both.
"""

from __future__ import annotations

from typing import Any

from attrs import define


@define(frozen=True)
class DType:
    name: str  # torch's attribute name: torch.<name> is the dtype
    itemsize: int
    is_floating_point: bool
    code: str | None = None  # safetensors' dtype code; None where safetensors has none

    @property
    def torch(self) -> Any:
        """The ``torch.dtype`` (imports torch)."""
        import torch

        return getattr(torch, self.name)

    def __str__(self) -> str:
        return f"torch.{self.name}"


def _table(*rows: tuple[str, int, bool, str | None]) -> dict[str, DType]:
    return {name: DType(name, size, floating, code) for name, size, floating, code in rows}


# Every dtype torch 2.15 defines (tests/test_ckpt_dcp_meta.py checks this table against torch).
DTYPES: dict[str, DType] = _table(
    ("float64", 8, True, "F64"),
    ("float32", 4, True, "F32"),
    ("float16", 2, True, "F16"),
    ("bfloat16", 2, True, "BF16"),
    ("float8_e4m3fn", 1, True, "F8_E4M3"),
    ("float8_e5m2", 1, True, "F8_E5M2"),
    ("float8_e4m3fnuz", 1, True, None),
    ("float8_e5m2fnuz", 1, True, None),
    ("float8_e8m0fnu", 1, True, None),
    ("float4_e2m1fn_x2", 1, True, None),
    ("int64", 8, False, "I64"),
    ("int32", 4, False, "I32"),
    ("int16", 2, False, "I16"),
    ("int8", 1, False, "I8"),
    ("uint64", 8, False, "U64"),
    ("uint32", 4, False, "U32"),
    ("uint16", 2, False, "U16"),
    ("uint8", 1, False, "U8"),
    ("bool", 1, False, "BOOL"),
    ("complex128", 16, False, None),
    ("complex64", 8, False, "C64"),
    ("complex32", 4, False, None),
    ("bcomplex32", 4, False, None),
    ("qint32", 4, False, None),
    ("qint8", 1, False, None),
    ("quint8", 1, False, None),
    ("quint4x2", 1, False, None),
    ("quint2x4", 1, False, None),
    ("bits16", 2, False, None),
    ("bits8", 1, False, None),
    ("bits1x8", 1, False, None),
    ("bits2x4", 1, False, None),
    ("bits4x2", 1, False, None),
    *((f"int{n}", 1, False, None) for n in range(1, 8)),
    *((f"uint{n}", 1, False, None) for n in range(1, 8)),
)
ALIASES = {
    "double": "float64",
    "float": "float32",
    "half": "float16",
    "long": "int64",
    "int": "int32",
    "short": "int16",
    "cdouble": "complex128",
    "cfloat": "complex64",
    "chalf": "complex32",
    "bit": "uint1",
}


def by_name(name: str) -> DType | None:
    """``torch.<name>``'s dtype (aliases such as ``half`` included), None for a name torch lacks."""
    return DTYPES.get(ALIASES.get(name, name))


def dtype_of(value: Any) -> DType:
    """A :class:`DType` for a ``DType``, a ``torch.dtype`` or a name (``"bfloat16"``, ``"torch.half"``)."""
    if isinstance(value, DType):
        return value
    text = str(value)
    found = by_name(text.removeprefix("torch."))
    if found is None:
        raise TypeError(f"not a known tensor dtype: {value!r}")
    return found


def torch_dtype(value: Any) -> Any:
    """The ``torch.dtype`` for a ``DType`` (a ``torch.dtype`` passes through)."""
    return value.torch if isinstance(value, DType) else value
