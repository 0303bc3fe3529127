"""Shared helpers of the minidist_native tests (CPU machines: GPU tests skip)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def has_cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def libnccl():
    """The installed libnccl (ctypes binding), or None."""
    from minidist_native import _nccl

    lib, _ = _nccl.load()
    return lib
