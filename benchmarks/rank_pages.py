"""Where one rank's private memory comes from, read from /proc/self/smaps at three points:
when the script starts (forked from the launcher), after ``init()`` and a barrier, and
after the footprint benchmark's workload (``footprint_rank.py``'s ``each`` or ``rl``):

    python -m minidist run -n 128 benchmarks/rank_pages.py each 5
    python -m minidist run -n 128 benchmarks/rank_pages.py each 5 --traced

Rank 5 (the second argument) prints its Private_Dirty in all and the mappings that hold
most of it. With ``--traced`` it also counts, with tracemalloc, what Python allocated
after the fork (tracemalloc's own bookkeeping then adds to the private pages, so the two
are measured in separate runs): the rest of the private pages are the launcher's pages
that the rank wrote into (copy-on-write) as it ran.
"""

from __future__ import annotations

import os
import sys
import tracemalloc
from pathlib import Path

TRACED = "--traced" in sys.argv
if TRACED:
    tracemalloc.start(1)
sys.path.insert(0, str(Path(__file__).resolve().parent))


def mappings() -> list[tuple[int, int, str]]:
    """(Private_Dirty KiB, size KiB, name) of every mapping of this process."""
    out: list[list] = []
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if "-" in parts[0] and not parts[0].endswith(":"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append([0, (hi - lo) // 1024, parts[5] if len(parts) > 5 else "[anon]"])
        elif parts[0] == "Private_Dirty:":
            out[-1][0] = int(parts[1])
    return [tuple(m) for m in out]


def report(stage: str, maps: list, traced: int | None) -> None:
    total = sum(m[0] for m in maps)
    extra = f", Python objects allocated since the fork {traced / 2**20:.2f} MiB" \
        if traced is not None else ""
    print(f"{stage}: private dirty {total / 1024:.2f} MiB{extra}")
    for dirty, size, name in sorted(maps, reverse=True)[:6]:
        print(f"    {dirty / 1024:6.2f} MiB of a {size / 1024:7.2f} MiB mapping  {name[-60:]}")


def traced_bytes() -> int | None:
    return tracemalloc.get_traced_memory()[0] if TRACED else None


def main() -> None:
    import footprint_rank

    import minidist as md

    workload, who = sys.argv[1], int(sys.argv[2])
    start = (mappings(), traced_bytes())
    md.init()
    rank, world = md.get_rank(), md.get_world_size()
    md.barrier()
    after_init = (mappings(), traced_bytes())
    if workload != "init":
        getattr(footprint_rank, f"{workload}_numpy")(md, rank, world)
    md.barrier()
    after = (mappings(), traced_bytes())
    if rank == who:
        print(f"rank {rank} of {world}, pid {os.getpid()}, workload {workload}")
        report("script start", *start)
        report("after init()", *after_init)
        report(f"after {workload}", *after)
        if TRACED:
            print("what Python allocated since the fork and still holds, by line:")
            for stat in tracemalloc.take_snapshot().statistics("lineno")[:15]:
                print(f"    {stat.size / 1024:8.1f} KiB {stat.count:7d} blocks  {stat.traceback}")
    md.barrier()
    md.destroy()


if __name__ == "__main__":
    main()
