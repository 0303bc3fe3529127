"""Measuring this machine's cost-model parameters, and saving or loading them.

``minidist calibrate`` runs two ranks of a job inside one process, over real Unix
sockets and a real shared-memory segment, and times minidist's own all_reduce on each
path at a small and a large size: the small one gives the cost per message (alpha), the
difference the cost per byte (beta). It saves them, with the core count, as JSON where
every job on the machine reads them (``MINIDIST_CALIBRATION``, default
``~/.cache/minidist/calibration.json``). Without a file the built-in defaults apply.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import numpy as np

from .algorithms.cost import DEFAULT, Costs
from .env import calibration_file


def path() -> Path:
    return Path(calibration_file(os.environ, str(Path.home())))


_loaded: dict[tuple[str, int], Costs] = {}  # (file, mtime) -> what it holds


def load() -> Costs:
    """The saved calibration, or the defaults if there is none (or it is unreadable)."""
    where = path()
    try:
        key = (str(where), where.stat().st_mtime_ns)
        costs = _loaded.get(key)
        if costs is None:
            data = json.loads(where.read_text())
            costs = Costs(**{k: data[k] for k in Costs.__dataclass_fields__ if k in data})
            _loaded.clear()
            _loaded[key] = costs
        return costs
    except (OSError, ValueError, TypeError):
        return DEFAULT


def save(c: Costs, where: Path | None = None) -> Path:
    where = where or path()
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(json.dumps(c.to_dict(), indent=2) + "\n")
    return where


async def _time(sessions, algorithm: str, nbytes: int, reps: int) -> float:
    arrays = [np.zeros(max(1, nbytes // 4), np.float32) for _ in sessions]

    async def once() -> None:
        preps = [s.plan.prepare_all_reduce(a, 0, None, algorithm)
                 for s, a in zip(sessions, arrays)]
        await asyncio.gather(*(s.execute(p) for s, p in zip(sessions, preps)))

    await once()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        await once()
        times.append(time.perf_counter() - start)
    # both ranks share this one thread: a rank's own share is half. The median ignores
    # the calls that a busy machine interrupted (a mean of a few calls does not).
    return float(np.median(times)) / 2


def _memory(nbytes: int, reps: int) -> tuple[float, float]:
    """(gamma, delta): seconds per byte reduced (``np.add``) and copied, best of reps."""
    a = np.ones(max(1, nbytes // 4), np.float32)
    b, out = a.copy(), np.empty_like(a)
    best_add = best_copy = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        np.add(a, b, out=out)
        best_add = min(best_add, time.perf_counter() - start)
        start = time.perf_counter()
        np.copyto(out, a)
        best_copy = min(best_copy, time.perf_counter() - start)
    return best_add / a.nbytes, best_copy / a.nbytes


async def _measure(quick: bool) -> Costs:
    from .env import LaunchConfig
    from .startup import join_all

    secret = os.urandom(12).hex().encode()
    sessions = await join_all([LaunchConfig(r, 2, r, 2, "127.0.0.1", 0, secret, r == 0,
                                            "calibrate") for r in range(2)], 30.0)
    try:
        # The large size must dwarf the small one's noise: at 1 MiB the shared-memory
        # path costs barely more than at 8 bytes (the same two barrier rounds), so a
        # few interrupted calls made the difference negative (beta_m was 1e-12).
        big = (4 << 20) if quick else (16 << 20)
        reps_small, reps_big = (30, 5) if quick else (200, 7)
        gamma, delta = _memory(big, 5)
        out = {"gamma": gamma, "delta": delta}
        for name, alg in (("s", "recursive_doubling"), ("m", "shared_memory")):
            small = await _time(sessions, alg, 8, reps_small)
            large = await _time(sessions, alg, big, reps_big)
            slope = (large - small) / big
            out[f"alpha_{name}"] = small
            if name == "s":  # each byte is sent once and reduced once: beta_s is the first
                out["beta_s"] = max(2 * delta, slope - gamma)  # at least two copies
            else:  # per byte of the vector, a rank copies 1.5 and reduces 0.5 (n = 2)
                out["beta_m"] = max(1.5 * delta + 0.5 * gamma, slope)
        return Costs(**out, cores=os.cpu_count() or 1)
    finally:
        await asyncio.gather(*(s.close() for s in sessions[1:]))
        await sessions[0].close()


def measure(quick: bool = False) -> Costs:
    """Measure this machine (a few seconds; ``quick`` for tests)."""
    return asyncio.run(_measure(quick))
