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
    start = time.perf_counter()
    for _ in range(reps):
        await once()
    # both ranks share this one thread: a rank's own share is half
    return (time.perf_counter() - start) / reps / 2


async def _measure(quick: bool) -> Costs:
    from .env import LaunchConfig
    from .startup import join_all

    secret = os.urandom(12).hex().encode()
    sessions = await join_all([LaunchConfig(r, 2, r, 2, "127.0.0.1", 0, secret, r == 0,
                                            "calibrate") for r in range(2)], 30.0)
    try:
        big = (1 << 20) if quick else (16 << 20)
        reps_small, reps_big = (20, 2) if quick else (200, 5)
        out = {}
        for name, alg in (("s", "recursive_doubling"), ("m", "shared_memory")):
            small = await _time(sessions, alg, 8, reps_small)
            large = await _time(sessions, alg, big, reps_big)
            out[f"alpha_{name}"] = small
            out[f"beta_{name}"] = max(1e-12, (large - small) / big)
        return Costs(**out, cores=os.cpu_count() or 1)
    finally:
        await asyncio.gather(*(s.close() for s in sessions[1:]))
        await sessions[0].close()


def measure(quick: bool = False) -> Costs:
    """Measure this machine (a few seconds; ``quick`` for tests)."""
    return asyncio.run(_measure(quick))
