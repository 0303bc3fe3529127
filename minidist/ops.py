"""Reduction operators and the dtypes minidist moves, over numpy only (pure)."""

from __future__ import annotations

import enum

import numpy as np


class ReduceOp(enum.IntEnum):
    """Reduction operators, named as in torch.distributed."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    BAND = 4
    BOR = 5
    BXOR = 6
    AVG = 7


_UFUNC = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,  # summed, then divided once by the group size
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}

# dtype <-> one-byte wire code. Order is part of the wire format: append only.
DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(t)
    for t in (
        "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
)
_CODE = {dt: i for i, dt in enumerate(DTYPES)}


def dtype_code(dtype: np.dtype) -> int:
    """The wire code of a numpy dtype; raises TypeError for dtypes minidist cannot move."""
    try:
        code = _CODE.get(dtype)  # a numpy dtype is its own key (no np.dtype() per call)
        return code if code is not None else _CODE[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise TypeError(f"minidist cannot move arrays of dtype {dtype!r}") from None


def dtype_from_code(code: int) -> np.dtype:
    """The numpy dtype of a wire code; raises ValueError for an unknown code."""
    if 0 <= code < len(DTYPES):
        return DTYPES[code]
    raise ValueError(f"unknown dtype code {code}")


def as_op(op: ReduceOp | int) -> ReduceOp:
    """``op`` as a ReduceOp (ValueError if it names none)."""
    return op if type(op) is ReduceOp else ReduceOp(op)


_DEFINED: set[tuple[object, object]] = set()  # (op, dtype) pairs that passed check_op


def check_op(op: ReduceOp, dtype: np.dtype) -> None:
    """Raise TypeError if ``op`` is not defined on ``dtype``."""
    key = (op, dtype)
    if key in _DEFINED:
        return
    dtype = np.dtype(dtype)
    op = as_op(op)
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        if dtype.kind not in "biu":
            raise TypeError(f"{op.name} needs an integer or bool array, not {dtype}")
    elif op == ReduceOp.AVG:
        if dtype.kind not in "fc":
            raise TypeError(f"AVG needs a floating-point array, not {dtype}")
    elif dtype.kind == "b" and op in (ReduceOp.SUM, ReduceOp.PRODUCT):
        pass  # numpy defines these as logical or / and
    elif dtype.kind == "c" and op in (ReduceOp.MIN, ReduceOp.MAX):
        raise TypeError(f"{op.name} is not defined on complex arrays")
    _DEFINED.add(key)


def reduce_into(op: ReduceOp, out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """Write ``op(a, b)`` elementwise into ``out`` (which may alias ``a`` or ``b``)."""
    _UFUNC[op](a, b, out=out)


def reduce_all_into(op: ReduceOp, out: np.ndarray, parts: list[np.ndarray]) -> None:
    """Write ``parts`` reduced elementwise in their order into ``out``:
    ``op(...op(op(parts[0], parts[1]), parts[2])...)``, the same bits wherever it runs.
    ``out`` may alias ``parts[0]`` or ``parts[1]``, not a later part."""
    if len(parts) == 1:
        np.copyto(out, parts[0])
        return
    reduce_into(op, out, parts[0], parts[1])
    for part in parts[2:]:
        reduce_into(op, out, out, part)


def finish(op: ReduceOp, out: np.ndarray, size: int) -> None:
    """Apply the final step an operator needs after combining ``size`` inputs (AVG divides)."""
    if op == ReduceOp.AVG and size > 1 and out.size:
        np.divide(out, size, out=out)


def identity(op: ReduceOp, dtype: np.dtype) -> np.generic:
    """The value ``x`` with ``op(x, y) == y`` for every ``y`` of ``dtype`` (AVG: that of
    its sum). TypeError if ``op`` is not defined on ``dtype``."""
    dtype = np.dtype(dtype)
    check_op(op, dtype)
    op = as_op(op)
    if op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.BOR, ReduceOp.BXOR):
        return dtype.type(0)
    if op == ReduceOp.PRODUCT:
        return dtype.type(1)
    if dtype.kind == "b":  # MIN is a logical and, MAX an or; BAND an and
        return dtype.type(op != ReduceOp.MAX)
    if op == ReduceOp.BAND:
        return dtype.type(np.iinfo(dtype).max if dtype.kind == "u" else -1)
    if dtype.kind == "f":
        return dtype.type(np.inf if op == ReduceOp.MIN else -np.inf)
    info = np.iinfo(dtype)
    return dtype.type(info.max if op == ReduceOp.MIN else info.min)
