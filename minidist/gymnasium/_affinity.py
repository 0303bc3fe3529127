"""Which CPU each worker process of a vector env runs on.

A vector env's workers are woken together and step at the same time; left to itself the
scheduler may queue two of them on one core while another core idles, for as long as
neither moves (a step then takes twice as long). Each worker is pinned to one CPU of
those the parent may use, round-robin (on from the vector envs made before in the
process), one hardware thread of every core before a core's second thread, as Sample
Factory does by default."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable

SYS_CPUS = "/sys/devices/system/cpu"


def _siblings(cpu: int) -> str | None:
    """The kernel's list of ``cpu``'s hardware threads (None: not known)."""
    try:
        with open(f"{SYS_CPUS}/cpu{cpu}/topology/thread_siblings_list") as f:
            return f.read().strip()
    except OSError:
        return None


def spread(allowed: Iterable[int], siblings: Callable[[int], str | None] = _siblings
           ) -> list[int]:
    """``allowed`` CPUs in the order workers take them: the first thread of every core
    (in CPU order), then every core's second thread, and so on (``siblings(cpu)``: the
    kernel's list of the threads of ``cpu``'s core, None where unknown: its own core)."""
    cpus = sorted(set(allowed))
    turn: dict[int, int] = {}  # cpu -> its place among its core's threads
    seen: dict[str, int] = {}  # core (its sibling list) -> threads placed so far
    for cpu in cpus:
        core = siblings(cpu) or f"cpu{cpu}"
        turn[cpu] = seen.get(core, 0)
        seen[core] = turn[cpu] + 1
    return sorted(cpus, key=lambda c: (turn[c], c))


_dealt = 0  # workers placed by this process so far: the next vector env goes on from there
_dealing = threading.Lock()


def worker_cpus(num_workers: int, allowed: Iterable[int] | None = None) -> list[int]:
    """The CPU of each of ``num_workers`` workers: round-robin over :func:`spread` of
    ``allowed`` (default the CPUs this process may run on), going on from where the
    vector envs made before in this process left off (two one-worker envs take two
    CPUs, not one twice)."""
    global _dealt
    order = spread(os.sched_getaffinity(0) if allowed is None else allowed)
    if not order:
        raise ValueError("no CPU to place the workers on")
    with _dealing:
        first, _dealt = _dealt, _dealt + num_workers
    return [order[(first + w) % len(order)] for w in range(num_workers)]


def pin(cpu: int | None) -> None:
    """Run this process on ``cpu`` only (None: leave it as it is). A CPU the process may
    not use (its cgroup changed meanwhile) leaves it as it is."""
    if cpu is None:
        return
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        pass
