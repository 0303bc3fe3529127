"""Dtypes and reductions of torch tensors on the three paths (no GPU needed).

* NCCL: which ncclDataType_t / ncclRedOp_t serves a (dtype, op), and how the ones NCCL
  lacks are lowered: bool as uint8 (SUM = MAX, PRODUCT = MIN, as numpy's logical or /
  and), complex as pairs of reals (SUM, AVG), int16/uint16 widened to int32 (modular
  arithmetic keeps the low 16 bits exact), and the bitwise ops gathered and reduced on
  the GPU.
* CUDA IPC: the reduction itself, with torch operators, in a fixed rank order (so every
  rank gets identical bits), float16/bfloat16 accumulated in float32 and rounded once.
* host staging: the numpy array that stands for a tensor, exactly as ``minidist.torch``
  moves CPU tensors (bfloat16 reduced as float32, moved as raw 16-bit values; dtypes
  numpy lacks moved as raw integers of the same width), so a staged CUDA tensor meets a
  CPU rank's tensor on the wire without a mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minidist.ops import ReduceOp

from . import _nccl as N

_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)

#: torch dtype -> ncclDataType_t for the types NCCL reduces natively
NCCL_DTYPES: dict[torch.dtype, int] = {
    torch.int8: N.INT8, torch.uint8: N.UINT8, torch.int32: N.INT32, torch.int64: N.INT64,
    torch.float16: N.FLOAT16, torch.float32: N.FLOAT32, torch.float64: N.FLOAT64,
    torch.bfloat16: N.BFLOAT16,
}
for _name, _code in (("uint32", N.UINT32), ("uint64", N.UINT64)):
    if hasattr(torch, _name):
        NCCL_DTYPES[getattr(torch, _name)] = _code

NCCL_OPS = {ReduceOp.SUM: N.SUM, ReduceOp.PRODUCT: N.PROD, ReduceOp.MIN: N.MIN,
            ReduceOp.MAX: N.MAX, ReduceOp.AVG: N.AVG}

_WIDENED = {torch.int16}
if hasattr(torch, "uint16"):
    _WIDENED.add(torch.uint16)

# torch dtypes numpy has a twin for (as minidist.torch: torch's own .numpy())
_NUMPY = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128}
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _NUMPY.add(getattr(torch, _name))
_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def reducible(dtype: torch.dtype) -> bool:
    """Whether elementwise reductions are defined on ``dtype`` (as on the CPU path)."""
    return dtype in _NUMPY or dtype == torch.bfloat16


def check_reduce(op: ReduceOp, dtype: torch.dtype, what: str) -> None:
    """TypeError, worded as minidist's, if ``op`` is not defined on ``dtype``."""
    if not reducible(dtype):
        raise TypeError(f"{what}: cannot reduce tensors of dtype {dtype} (they can only be "
                        "moved: broadcast, all_gather, send, ...)")
    if op in _BITWISE:
        if dtype.is_floating_point or dtype.is_complex:
            raise TypeError(f"{what}: {op.name} needs an integer or bool tensor, not {dtype}")
    elif op == ReduceOp.AVG:
        if not (dtype.is_floating_point or dtype.is_complex):
            raise TypeError(f"{what}: AVG needs a floating-point tensor, not {dtype}")
    elif dtype.is_complex and op in (ReduceOp.MIN, ReduceOp.MAX):
        raise TypeError(f"{what}: {op.name} is not defined on complex tensors")


@dataclass(frozen=True)
class Lowering:
    """How a reduction of ``dtype`` with ``op`` runs on NCCL.

    ``kind``: ``"direct"`` (ncclDataType ``nccl_dtype``, ncclRedOp ``nccl_op``),
    ``"view"`` (the same bytes seen as ``as_dtype``: bool as uint8, complex as reals),
    ``"widen"`` (copied to ``as_dtype``, reduced, copied back) or ``"gather"`` (NCCL
    gathers every rank's tensor, the GPU reduces them with ``op``).
    """

    kind: str
    as_dtype: torch.dtype
    nccl_dtype: int = -1
    nccl_op: int = -1


_LOWERED: dict[tuple[ReduceOp, torch.dtype], Lowering] = {}


def lower(op: ReduceOp, dtype: torch.dtype, what: str = "reduction") -> Lowering:
    """The NCCL lowering of ``op`` on ``dtype`` (TypeError where it is not defined)."""
    low = _LOWERED.get((op, dtype))
    if low is None:
        check_reduce(op, dtype, what)
        low = _LOWERED[(op, dtype)] = _lower(op, dtype)
    return low


def _lower(op: ReduceOp, dtype: torch.dtype) -> Lowering:
    if dtype == torch.bool:
        table = {ReduceOp.SUM: N.MAX, ReduceOp.MAX: N.MAX, ReduceOp.BOR: N.MAX,
                 ReduceOp.PRODUCT: N.MIN, ReduceOp.MIN: N.MIN, ReduceOp.BAND: N.MIN}
        if op in table:
            return Lowering("view", torch.uint8, N.UINT8, table[op])
        return Lowering("gather", dtype)
    if op in _BITWISE:
        return Lowering("gather", dtype)
    if dtype.is_complex:
        if op in (ReduceOp.SUM, ReduceOp.AVG):
            real = torch.float32 if dtype == torch.complex64 else torch.float64
            return Lowering("view", real, NCCL_DTYPES[real], NCCL_OPS[op])
        return Lowering("gather", dtype)  # PRODUCT: not elementwise on the reals
    if dtype in _WIDENED:
        return Lowering("widen", torch.int32, N.INT32, NCCL_OPS[op])
    if dtype in NCCL_DTYPES:
        return Lowering("direct", dtype, NCCL_DTYPES[dtype], NCCL_OPS[op])
    return Lowering("gather", dtype)


def as_lowered(t: torch.Tensor, low: Lowering) -> torch.Tensor:
    """``t`` (contiguous) as the tensor NCCL reduces for ``low`` ("view" and "direct"
    share memory with ``t``; "widen" is a copy)."""
    if low.kind == "direct":
        return t
    if low.kind == "view":
        if t.dtype.is_complex:
            return torch.view_as_real(t)
        return t.view(low.as_dtype)
    if low.kind == "widen":
        return t.to(low.as_dtype)
    raise ValueError(f"no NCCL tensor for lowering {low.kind!r}")


# ---------------------------------------------------------------------- GPU reductions


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a local reduction accumulates in: float32 for the 16-bit floats."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def combine(acc: torch.Tensor, x: torch.Tensor, op: ReduceOp) -> None:
    """``acc = acc (op) x`` in place (``x`` may have a narrower dtype)."""
    if acc.dtype == torch.bool:
        if op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.BOR):
            acc.logical_or_(x)
        elif op in (ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.BAND):
            acc.logical_and_(x)
        else:  # BXOR
            acc.logical_xor_(x)
        return
    if op in (ReduceOp.SUM, ReduceOp.AVG):
        acc.add_(x)
    elif op == ReduceOp.PRODUCT:
        acc.mul_(x)
    elif op == ReduceOp.MIN:
        torch.minimum(acc, x.to(acc.dtype), out=acc)
    elif op == ReduceOp.MAX:
        torch.maximum(acc, x.to(acc.dtype), out=acc)
    elif op == ReduceOp.BAND:
        acc.bitwise_and_(x)
    elif op == ReduceOp.BOR:
        acc.bitwise_or_(x)
    elif op == ReduceOp.BXOR:
        acc.bitwise_xor_(x)
    else:
        raise ValueError(f"unknown reduce op {op!r}")


def reduce_into(out: torch.Tensor, parts: list[torch.Tensor], op: ReduceOp) -> None:
    """``out`` = the reduction of ``parts`` (same shape and dtype as ``out``), in the
    order given; AVG divides once at the end."""
    acc = parts[0].to(accumulate_dtype(out.dtype), copy=True)
    for x in parts[1:]:
        combine(acc, x, op)
    if op == ReduceOp.AVG:
        acc.div_(len(parts))
    out.copy_(acc)


# ---------------------------------------------------------------------- host staging


def staging_dtype(dtype: torch.dtype, reduce: bool) -> torch.dtype:
    """The CPU dtype a staged tensor takes, as ``minidist.torch`` moves CPU tensors:
    itself when numpy has it; bfloat16 as float32 when reduced, else as int16; other
    dtypes as the integer of their width (moves only)."""
    if dtype in _NUMPY:
        return dtype
    if dtype == torch.bfloat16 and reduce:
        return torch.float32
    raw = _RAW.get(torch.empty(0, dtype=dtype).element_size())
    if raw is None:
        raise TypeError(f"minidist cannot move tensors of dtype {dtype}")
    return raw


def converts(dtype: torch.dtype, reduce: bool) -> bool:
    """Whether staging changes the values' type (a cast), not only the device/view."""
    return dtype == torch.bfloat16 and reduce
