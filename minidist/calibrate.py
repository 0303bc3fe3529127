"""Measuring this machine's cost-model parameters, and saving or loading them.

``minidist calibrate`` runs a real job of two processes (``minidist run -n 2``) that
times minidist's own all_reduce through the blocking API on the socket path and on the
shared-memory path, at a small and a large size, in wall and CPU time: the small sizes
give the cost of a call and of a message (alpha), the large ones the cost per byte
(beta, and the copies of the shared-memory path); reductions and copies (gamma, delta)
and the fixed cost of one local operation (sigma) are timed in this process. It saves
them, with the core count, as JSON where every job on the machine reads them
(``MINIDIST_CALIBRATION``, default ``~/.cache/minidist/calibration.json``). Without a
file the built-in defaults apply.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    # (plain strings and os calls: a rank that finds it loaded before the fork runs no
    # pathlib code of its own)
    where = calibration_file(os.environ, os.path.expanduser("~"))
    try:
        key = (where, os.stat(where).st_mtime_ns)
        costs = _loaded.get(key)
        if costs is None:
            with open(where, encoding="utf-8") as f:
                data = json.loads(f.read())
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


def _per_op(reps: int, ops_per_rep: int = 500) -> float:
    """sigma: the fixed seconds of one local operation of a schedule, as the engine runs
    it (:func:`apply_compute` on one-element Copy and Reduce ops, half each), best of
    reps."""
    from . import ops
    from .algorithms.schedule import Copy, Reduce, apply_compute

    bufs = {"tmp": np.zeros(2 * ops_per_rep, np.float32),
            "out": np.zeros(2 * ops_per_rep, np.float32)}
    work = [Copy("tmp", i, "out", i + 1, 1) if i % 2 else
            Reduce("tmp", i, "tmp", i, "out", i + 1, 1) for i in range(ops_per_rep)]

    def combine(out, a, b):
        ops.reduce_into(ops.ReduceOp.SUM, out, a, b)

    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        apply_compute(work, bufs, combine)
        best = min(best, time.perf_counter() - start)
    return best / ops_per_rep


RANKS = 4
"""Ranks of the timing job: enough for recursive doubling, the ring and the shared-memory
path to differ in their numbers of messages and copies (and, on a small machine, to
share cores as jobs do)."""


def _job(quick: bool, timeout: float = 120.0) -> dict[str, dict[str, float]]:
    """Run the timing worker (:mod:`minidist.calibrate_job`) as a real job of
    :data:`RANKS` processes on this node (``minidist run``); what its rank 0 found, per
    case: ``wall`` (seconds per call, the slowest rank's) and ``cpu`` (CPU seconds per
    call, both of a rank's threads, the mean over ranks), medians over batches of calls;
    ``count``: elements."""
    cmd = [sys.executable, "-m", "minidist", "run", "-n", str(RANKS), "--no-prefix", "-m",
           "minidist.calibrate_job"] + (["--quick"] if quick else [])
    env = {**os.environ, "MINIDIST_FASTPATH": "0"}  # time the schedules, not the slots
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"calibrate: the timing job took more than {timeout:.0f} s") \
            from None
    for line in out.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    raise RuntimeError(f"calibrate: the timing job failed (exit {out.returncode}): "
                       f"{(out.stderr or out.stdout).strip()[-500:]}")


RESULT = "minidist-calibration "  # the timing job's rank 0 prints this, then its JSON
SMALL = 4  # elements: one per rank, so that the ring runs


def cases(quick: bool) -> list[tuple[str, str, int]]:
    """(name, algorithm, elements) of each timing in the job."""
    big = ((4 << 20) if quick else (16 << 20)) // 4
    return [("rd", "recursive_doubling", SMALL), ("ring", "ring", SMALL),
            ("shm", "shared_memory", SMALL), ("rd_big", "recursive_doubling", big),
            ("shm_big", "shared_memory", big)]


def _per_unit(algorithm: str, count: int, **unit: float) -> float:
    """A rank's mean CPU seconds in the replay of one call when only the given costs are
    set (``alpha_s=1``: the messages a rank takes part in, counted half each way), with
    a core per rank: what one unit of that cost adds to the rank's time."""
    from .algorithms import cost, schedules

    zero = dict.fromkeys(("alpha_s", "beta_s", "alpha_m", "beta_m", "gamma", "delta",
                          "alpha_n", "beta_n", "sigma", "call_s"), 0.0)
    c = Costs(**{**zero, **unit}, cores=RANKS)
    busy = cost.replay(schedules("all_reduce", algorithm, RANKS, count), c).busy
    return sum(busy) / len(busy)


def _fit(found: dict[str, dict[str, float]], gamma: float, sigma: float,
         floor: float) -> dict[str, float]:
    """The cost model's parameters from the timing job, by inverting the replay on the
    schedules that ran: a rank's CPU per call is ``call_s`` plus, for each cost, what the
    replay charges it (:func:`_per_unit`). The ring and recursive doubling at a few
    elements differ only in messages: ``alpha_s``; then ``call_s``; recursive doubling's
    extra CPU at the large size: ``beta_s`` (less what it reduces, at ``gamma``); the
    shared-memory path's: ``delta``, the copies as a job makes them (in and out of a
    shared area, caches shared with other processes), which cost more than one copy
    in one process (``floor``). ``alpha_m``/``beta_m`` (the shared-memory path's closed
    form) are its wall time per call and per byte."""
    rd, ring, shm, rd_big, shm_big = (found[k] for k in ("rd", "ring", "shm", "rd_big",
                                                         "shm_big"))
    small, big = rd["count"], rd_big["count"]

    def ops(alg: str, count: int) -> float:
        return _per_unit(alg, count, sigma=sigma, gamma=gamma)

    msgs_rd = _per_unit("recursive_doubling", small, alpha_s=1.0)
    msgs_ring = _per_unit("ring", small, alpha_s=1.0)
    rest_rd = rd["cpu"] - ops("recursive_doubling", small)
    alpha = max(1e-6, (ring["cpu"] - ops("ring", small) - rest_rd) / (msgs_ring - msgs_rd))
    call = max(0.0, rest_rd - alpha * msgs_rd)
    extra = rd_big["cpu"] - rd["cpu"] - (ops("recursive_doubling", big)
                                          - ops("recursive_doubling", small))
    beta = max(2 * floor, extra / (_per_unit("recursive_doubling", big, beta_s=1.0)
                                   - _per_unit("recursive_doubling", small, beta_s=1.0)))
    def known(count: int) -> float:  # the shared-memory path's work but its copies
        return _per_unit("shared_memory", count, sigma=sigma, gamma=gamma, alpha_s=alpha,
                         beta_s=beta)

    extra = shm_big["cpu"] - shm["cpu"] - (known(big) - known(small))
    delta = max(floor, extra / (_per_unit("shared_memory", big, delta=1.0)
                                - _per_unit("shared_memory", small, delta=1.0)))
    # the closed form counts the work of one rank (its wall time times the cores the
    # ranks shared, over the ranks): two barriers of log2(RANKS) rounds at a few
    # elements, then per byte
    rounds = 2 * max(1, (RANKS - 1).bit_length())
    share = min(RANKS, os.cpu_count() or 1) / RANKS
    b = (big - small) * 4
    return {"alpha_s": alpha, "call_s": call, "beta_s": beta, "delta": delta,
            "alpha_m": shm["wall"] / rounds * share,
            "beta_m": max(floor, (shm_big["wall"] - shm["wall"]) / b * share)}


def measure(quick: bool = False) -> Costs:
    """Measure this machine (a few seconds; ``quick`` for tests). RuntimeError when the
    timing job cannot run."""
    big = (4 << 20) if quick else (16 << 20)
    gamma, delta = _memory(big, 5)
    sigma = _per_op(5)
    found = _job(quick)
    return Costs(**_fit(found, gamma, sigma, delta), gamma=gamma, sigma=sigma,
                 cores=os.cpu_count() or 1)
