"""The launcher's heap made dense before it forks the ranks.

A forked rank shares the launcher's pages until it writes to them. The blocks that the
launcher freed while it imported (the holes in CPython's small-object pools and in
the C heap) are where a rank's own first allocations would land, each copying a whole
page of the launcher's live objects for a few bytes of its own. :func:`fill_holes`
takes those free blocks, once, before the first fork (they stay taken: the memory they
hold was already the launcher's), so that the ranks' allocations go to fresh pages,
packed together. Where the interpreter or the C library is not the one this reads
(another Python, another allocator, ``PYTHONMALLOC``, musl), it does nothing."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import tempfile

_ROW = re.compile(r"\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$")
_C_SIZES = [1 << k for k in range(15, 4, -1)]  # C heap holes taken: 32 KiB down to 32 B
_C_BLOCKS = 20_000  # at most this many blocks taken from the C heap


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def fill_holes() -> int:
    """Take the launcher's free heap blocks (see the module's doc); return the bytes
    taken (0 where nothing could be read)."""
    taken = 0
    with contextlib.suppress(Exception):
        taken += _fill_c_heap()
    with contextlib.suppress(Exception):  # last: the C heap's filling frees objects too
        taken += _fill_pymalloc()
    return taken


def pymalloc_free_blocks() -> list[tuple[int, int]]:
    """(block size, free blocks in pools in use) of each of CPython's small-object size
    classes, read from ``sys._debugmallocstats``; empty if it says nothing of them."""
    stats = getattr(sys, "_debugmallocstats", None)
    if stats is None:
        return []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            stats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode(errors="replace")
    out: list[tuple[int, int]] = []
    for line in text.splitlines():
        m = _ROW.match(line)
        if m:
            out.append((int(m[2]), int(m[5])))
        elif out:
            break
    return out


def _fill_pymalloc() -> int:
    malloc = ctypes.pythonapi.PyObject_Malloc
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    taken = 0
    for _ in range(2):  # the first round's own temporaries leave a few blocks free
        for size, free in pymalloc_free_blocks():
            for _ in range(free):
                malloc(size)
            taken += size * free
    return taken


def _fill_c_heap() -> int:
    """Take glibc's free chunks of the main heap, largest first, without growing it:
    a block that came from the heap's top is given back and the next smaller size
    tried."""
    libc = ctypes.CDLL(None)
    info = libc.mallinfo2
    info.restype = _MallInfo2
    malloc, free = libc.malloc, libc.free
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.argtypes = [ctypes.c_void_p]
    taken = blocks = 0
    holes = info().fordblks  # free bytes of the heap, its top included
    for size in _C_SIZES:
        while blocks < _C_BLOCKS and taken + size <= holes:
            before = info()
            p = malloc(size)
            if not p:
                return taken
            after = info()
            if after.keepcost != before.keepcost or after.arena != before.arena:
                free(p)  # from the heap's top (or it grew): no hole of this size left
                break
            taken += size
            blocks += 1
    return taken
