"""The size of the rooted calls' area in a group's fast segment
(:mod:`minidist.shm.rooted_area`), which :func:`minidist.shm.fast_slots.segment_bytes` counts:
a header per rank and parity, then two pieces per rank. Pure arithmetic."""

from __future__ import annotations

MAX_PIECE = 32 << 10  # the largest piece per rank (a stack of 84 x 84 frames fits)
AREA_BUDGET = 9 << 20  # the pieces of a group's area, at most (pages untouched cost nothing)
HEADER = 64  # a rank's header in the area


def piece_bytes(size: int) -> int:
    """The largest share of one rank in a call on ``size`` ranks: MAX_PIECE, less on
    groups so large that their pieces would pass AREA_BUDGET (a multiple of 64)."""
    return max(64, min(MAX_PIECE, AREA_BUDGET // (2 * size)) // 64 * 64)


def area_bytes(size: int) -> int:
    """The bytes of the area of a group of ``size`` ranks."""
    return pieces_at(size) + 2 * size * piece_bytes(size)


def pieces_at(size: int) -> int:
    """Where the pieces start in the area: after its headers, on a page."""
    return -(-(2 * size * HEADER + 8 * size) // 4096) * 4096
