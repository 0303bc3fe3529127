"""all_reduce through memory shared by the ranks of one node.

"tmp" is one area seen by every rank (``Schedule.shared_tmp``), laid out as two banks
(even and odd chunks), each with one slot per rank and a result slot. The vector moves
in chunks of ``chunk`` elements; for chunk ``k`` every rank copies into its slot the
parts of the chunk that the others reduce, reduces its own share across all ranks (its
own part read in place) into the result slot and into its vector, and copies the
others' shares of the result out. One barrier of empty messages per chunk orders it all:

    copy in 0 | B0 | reduce 0, copy in 1 | B1 | copy out 0, reduce 1, copy in 2 | B2 | ...

Two banks make that safe: what a rank writes after barrier ``k`` was last read before
barrier ``k - 1`` ended. Each element of the result is reduced by one rank in one
order, so every rank gets the same bits. Each rank copies (n-1)/n of the vector in
and (n-1)/n out, reads n shares of 1/n for its reduction, and sends only empty
messages. The caller's vector is first written after barrier 0, by which time every
rank has been heard from (so mismatches are caught before).
"""

from __future__ import annotations

import dataclasses
import functools

from . import barrier
from ._common import build, chunk_bounds, step
from .schedule import Copy, Reduce, Schedule, Step

COLLECTIVE = "all_reduce"
BARRIER_TAGS = 64  # tags used by one barrier (a dissemination barrier needs log2 n)


def _barrier_then(rank: int, size: int, k: int, compute: list) -> list[Step]:
    """Barrier number ``k`` (a dissemination barrier, its own tags), then ``compute``."""
    sync = barrier.dissemination(rank, size, 0, 0).steps
    if not sync:
        return [step(compute=compute)]
    out = []
    for i, st in enumerate(sync):
        comms = [type(c)(c.peer, c.tag + k * BARRIER_TAGS, c.buf, c.lo, c.hi)
                 for c in st.comms]
        out.append(step(comms, compute if i == len(sync) - 1 else ()))
    return out


def layout(size: int, chunk: int) -> tuple[int, int]:
    """(elements of one bank, elements of the whole area) for ``size`` ranks."""
    bank = (size + 1) * chunk
    return bank, 2 * bank


@functools.lru_cache(maxsize=256)
def shared_memory(rank: int, size: int, count: int, chunk: int) -> Schedule:
    """The schedule of ``rank`` for an all_reduce of ``count`` elements in chunks of
    ``chunk`` elements through a shared "tmp" of ``layout(size, chunk)[1]`` elements."""
    if chunk < 1:
        raise ValueError("chunk must be at least 1 element")
    bank, area = layout(size, chunk)
    chunks = [(lo, min(lo + chunk, count)) for lo in range(0, count, chunk)] or [(0, 0)]
    m = len(chunks)

    def slot(k: int, r: int) -> int:
        return (k % 2) * bank + r * chunk

    def result(k: int) -> int:
        return (k % 2) * bank + size * chunk

    def slices(k: int) -> list[tuple[int, int]]:
        lo, hi = chunks[k]
        return chunk_bounds(hi - lo, size)

    def copy_in(k: int) -> list[Copy]:
        # only the parts the other ranks reduce: this rank reads its own from "out"
        lo = chunks[k][0]
        return [Copy("tmp", slot(k, rank) + a, "out", lo + a, b - a)
                for j, (a, b) in enumerate(slices(k)) if j != rank and b > a]

    def reduce_share(k: int) -> list[Reduce | Copy]:
        lo = chunks[k][0]
        a, b = slices(k)[rank]
        n = b - a
        if n == 0:
            return []

        def operand(j: int) -> tuple[str, int]:
            return ("out", lo + a) if j == rank else ("tmp", slot(k, j) + a)

        dst = result(k) + a
        if size == 1:
            return []
        ops: list[Reduce | Copy] = [Reduce("tmp", dst, *operand(0), *operand(1), n)]
        ops += [Reduce("tmp", dst, "tmp", dst, *operand(j), n) for j in range(2, size)]
        ops.append(Copy("out", lo + a, "tmp", dst, n))  # this rank's share of its result
        return ops

    def copy_out(k: int) -> list[Copy]:
        lo = chunks[k][0]
        return [Copy("out", lo + a, "tmp", result(k) + a, b - a)
                for j, (a, b) in enumerate(slices(k)) if j != rank and b > a]

    steps: list[Step] = [step(compute=copy_in(0))]
    for k in range(m + 1):
        compute: list[Reduce | Copy] = []
        if k >= 1:
            compute += copy_out(k - 1)
        if k < m:
            compute += reduce_share(k)
        if k + 1 < m:
            compute += copy_in(k + 1)
        steps += _barrier_then(rank, size, k, compute)
    return dataclasses.replace(
        build(COLLECTIVE, "shared_memory", rank, size, count, 0, steps, tmp_size=area,
              out_size=count), shared_tmp=True)


SEGMENT_BYTES = 64 << 20  # the most shared memory one group's all_reduce may map
CHUNK_BYTES = 2 << 20  # per rank and chunk: small enough for a lean peak memory


def chunk_elements(size: int, itemsize: int) -> int:
    """Elements per chunk for ``size`` ranks: CHUNK_BYTES, less for large groups so that
    the area stays within SEGMENT_BYTES."""
    per_rank = min(CHUNK_BYTES, SEGMENT_BYTES // (2 * (size + 1)))
    return max(1, per_rank // itemsize)


@functools.lru_cache(maxsize=256)
def broadcast_shared_memory(rank: int, size: int, count: int, root: int,
                            chunk: int) -> Schedule:
    """Broadcast through a shared "tmp" of two banks of ``chunk`` elements: the root
    copies chunk ``k`` in, one barrier, the others copy it out (while the root copies
    chunk ``k + 1`` into the other bank)."""
    if chunk < 1:
        raise ValueError("chunk must be at least 1 element")
    chunks = [(lo, min(lo + chunk, count)) for lo in range(0, count, chunk)] or [(0, 0)]
    m = len(chunks)

    def bank(k: int) -> int:
        return (k % 2) * chunk

    def copy_in(k: int) -> list[Copy]:
        lo, hi = chunks[k]
        return [Copy("tmp", bank(k), "out", lo, hi - lo)] if rank == root and hi > lo else []

    def copy_out(k: int) -> list[Copy]:
        lo, hi = chunks[k]
        return [Copy("out", lo, "tmp", bank(k), hi - lo)] if rank != root and hi > lo else []

    steps: list[Step] = [step(compute=copy_in(0))]
    for k in range(m):
        steps += _barrier_then(rank, size, k, copy_out(k) + (copy_in(k + 1) if k + 1 < m
                                                             else []))
    return dataclasses.replace(
        build("broadcast", "shared_memory", rank, size, count, root, steps,
              tmp_size=2 * chunk, out_size=count), shared_tmp=True)


BROADCAST_CHUNK_BYTES = 4 << 20


def all_reduce_default(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """:func:`shared_memory` in the chunks of 4-byte elements."""
    return shared_memory(rank, size, count, chunk_elements(size, 4))


def broadcast_default(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """:func:`broadcast_shared_memory` in chunks of BROADCAST_CHUNK_BYTES of 4-byte
    elements."""
    return broadcast_shared_memory(rank, size, count, root, BROADCAST_CHUNK_BYTES // 4)


def sized(collective: str, rank: int, size: int, count: int, root: int,
          itemsize: int) -> Schedule:
    """The shared_memory algorithm of ``collective`` (all_reduce or broadcast) in chunks
    sized for elements of ``itemsize`` bytes, no longer than the vector (a short one
    needs, and reserves, less memory)."""
    if collective == "all_reduce":
        return shared_memory(rank, size, count,
                             min(chunk_elements(size, itemsize), max(1, count)))
    return broadcast_shared_memory(rank, size, count, root,
                                   min(max(1, BROADCAST_CHUNK_BYTES // itemsize),
                                       max(1, count)))
