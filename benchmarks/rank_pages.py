"""Where one rank's private memory comes from, read from /proc/self/smaps at three points:
when the script starts (forked from the launcher), after ``init()`` and a barrier, and
after the footprint benchmark's workload (``footprint_rank.py``'s ``each`` or ``rl``):

    python -m minidist run -n 128 benchmarks/rank_pages.py each 5
    python -m minidist run -n 128 benchmarks/rank_pages.py each 5 --traced
    python -m minidist run -n 128 benchmarks/rank_pages.py each 5 --functions
    python -m minidist run -n 128 benchmarks/rank_pages.py each 5 --words

Rank 5 (the second argument) prints its Private_Dirty in all and the mappings that hold
most of it. With ``--traced`` it also counts, with tracemalloc, what Python allocated
after the fork (tracemalloc's own bookkeeping then adds to the private pages, so the two
are measured in separate runs): the rest of the private pages are the launcher's pages
that the rank wrote into (copy-on-write) as it ran. With ``--functions`` it counts the
distinct Python functions each stage ran, by module (a profile hook, in a separate run
too): CPython 3.11 writes into a function's code object, and the reference counts of
what it uses, whenever it runs it, so each of them copies the pages it lies on. With
``--words`` (root: it reads the launcher's memory; a separate run) it compares its copies
of the launcher's pages with the launcher's, word by word, and names the objects and
fields that changed (``copied_words.py``).
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import tracemalloc
from pathlib import Path

TRACED = "--traced" in sys.argv
FUNCTIONS = "--functions" in sys.argv
WORDS = "--words" in sys.argv
if TRACED:
    tracemalloc.start(1)
_ran: dict = {}  # code object -> the stage that first ran it (--functions)
_stage = ["script start"]


def _profile(frame, event, arg) -> None:
    if event == "call" and frame.f_code not in _ran:
        _ran[frame.f_code] = _stage[0]


def count_functions(stage: str) -> None:
    """From now on, the functions run first are counted for ``stage``."""
    _stage[0] = stage
    if FUNCTIONS and stage != "done":
        sys.setprofile(_profile)
        threading.setprofile(_profile)
    elif FUNCTIONS:
        sys.setprofile(None)
        threading.setprofile(None)


def report_functions() -> None:
    for stage in dict.fromkeys(_ran.values()):
        codes = [c for c, s in _ran.items() if s == stage]
        by_module = collections.Counter(
            c.co_filename.split("site-packages/")[-1].split("python3.11/")[-1]
            for c in codes)
        print(f"functions first run by {stage}: {len(codes)} "
              f"({sum(sys.getsizeof(c) for c in codes) / 1024:.0f} KiB of code objects)")
        for module, n in by_module.most_common(12):
            print(f"    {n:4d}  {module[-60:]}")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def mappings() -> list[tuple[int, int, str]]:
    """(Private_Dirty KiB, size KiB, name) of every mapping of this process."""
    out: list[list] = []
    with open("/proc/self/smaps") as f:  # (no pathlib: its functions would count)
        text = f.read()
    for line in text.splitlines():
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
    count_functions("init()")
    md.init()
    rank, world = md.get_rank(), md.get_world_size()
    md.barrier()
    after_init = (mappings(), traced_bytes())
    count_functions(workload)
    if workload != "init":
        getattr(footprint_rank, f"{workload}_numpy")(md, rank, world)
    md.barrier()
    count_functions("done")
    after = (mappings(), traced_bytes())
    if rank == who:
        print(f"rank {rank} of {world}, pid {os.getpid()}, workload {workload}")
        report("script start", *start)
        report("after init()", *after_init)
        report(f"after {workload}", *after)
        if FUNCTIONS:
            report_functions()
        if WORDS:
            import copied_words

            copied_words.report(os.getppid())
        if TRACED:
            print("what Python allocated since the fork and still holds, by line:")
            for stat in tracemalloc.take_snapshot().statistics("lineno")[:15]:
                print(f"    {stat.size / 1024:8.1f} KiB {stat.count:7d} blocks  {stat.traceback}")
    md.barrier()
    md.destroy()


if __name__ == "__main__":
    main()
