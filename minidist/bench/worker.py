"""One rank of a ``minidist bench`` job: ``python -m minidist.bench.worker --system S
--config JSON``.

Run by ``minidist run -n N -m minidist.bench.worker`` (minidist), by N processes that
``minidist bench`` spawns with torch's env:// variables (gloo), or by ``mpirun -n N``
(mpi4py). Every system runs the same loop over the sizes, on the same numpy buffers
(torch tensors are zero-copy views of them):

1. ``warmup`` untimed calls;
2. the system's barrier, then ``iters`` timed calls; this rank's time is their mean;
3. the max of that time over the ranks (one all_reduce MAX, not timed);
4. with ``--check``: refill the buffers with a known pattern, one call, count the
   elements that differ from the expected result (max over the ranks).

The timed calls run on zero-filled buffers, so that repeated in-place sums stay finite.
Rank 0 prints one line per size, ``@@minidist-bench {json}``, which the parent collects.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import collectives
from .report import GENERATED

MARK = "@@minidist-bench "


# ----------------------------------------------------------------------------- buffers


def make_buffers(collective: str, count: int, n: int, dtype: str) -> dict[str, np.ndarray]:
    """Zero-filled numpy buffers for one call; ``count`` is the whole vector's elements.

    all_reduce / broadcast: ``buf``; all_gather: ``inp`` (count / n) -> ``out`` (count);
    reduce_scatter: ``inp`` (count) -> ``out`` (count / n); all_to_all: ``inp`` (count)
    -> ``out`` (count); barrier: none.
    """
    dt = np.dtype(dtype)
    if collective in ("all_reduce", "broadcast", "pingpong") or collective in GENERATED:
        return {"buf": np.zeros(count, dt)}
    if collective == "all_gather":
        return {"inp": np.zeros(count // n, dt), "out": np.zeros(count, dt)}
    if collective == "reduce_scatter":
        return {"inp": np.zeros(count, dt), "out": np.zeros(count // n, dt)}
    if collective == "all_to_all":
        return {"inp": np.zeros(count, dt), "out": np.zeros(count, dt)}
    if collective == "barrier":
        return {}
    raise ValueError(f"unknown collective {collective!r}")


def pattern(rank: int, start: int, count: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s values for elements ``start .. start+count``: ``(rank + i) % 4``.

    Sums over up to hundreds of ranks stay exact small integers in every dtype (integer
    sums wrap the same way in any order), so a checked result is bit-exact.
    """
    return ((np.arange(start, start + count, dtype=np.int64) + rank) % 4).astype(dtype)


def _summed(n: int, start: int, count: int, dtype: str) -> np.ndarray:
    total = np.zeros(count, np.int64)
    for r in range(n):
        total += (np.arange(start, start + count, dtype=np.int64) + r) % 4
    return total.astype(dtype)


def fill_for_check(collective: str, bufs: dict[str, np.ndarray], rank: int, n: int,
                   root: int = 0) -> None:
    """Refill ``bufs`` in place with this rank's check pattern."""
    dtype = next(iter(bufs.values())).dtype.name if bufs else "float32"
    if collective == "all_reduce":
        bufs["buf"][:] = pattern(rank, 0, bufs["buf"].size, dtype)
    elif collective == "broadcast":
        if rank == root:
            bufs["buf"][:] = pattern(root, 0, bufs["buf"].size, dtype)
        else:
            bufs["buf"][:] = 5  # never a pattern value
    elif collective == "all_gather":
        bufs["inp"][:] = pattern(rank, 0, bufs["inp"].size, dtype)
        bufs["out"][:] = 5
    elif collective in ("reduce_scatter", "all_to_all"):
        bufs["inp"][:] = pattern(rank, 0, bufs["inp"].size, dtype)
        bufs["out"][:] = 5
    elif collective == "pingpong":  # the even rank's pattern goes there and back
        bufs["buf"][:] = pattern(rank, 0, bufs["buf"].size, dtype) if rank % 2 == 0 else 5
    elif collective in GENERATED:
        bufs["buf"][:] = pattern(rank, 0, bufs["buf"].size, dtype)


def count_wrong(collective: str, bufs: dict[str, np.ndarray], rank: int, n: int,
                root: int = 0) -> int:
    """Elements of this rank's result that differ from the expected one."""
    if collective == "barrier" or (collective == "pingpong" and (rank ^ 1) >= n):
        return 0
    if collective == "pingpong":
        got = bufs["buf"]
        want = pattern(rank & ~1, 0, got.size, got.dtype.name)
    elif collective in ("all_reduce", "broadcast"):
        got = bufs["buf"]
        dtype = got.dtype.name
        want = (_summed(n, 0, got.size, dtype) if collective == "all_reduce"
                else pattern(root, 0, got.size, dtype))
    elif collective == "all_gather":
        got = bufs["out"]
        per = bufs["inp"].size
        want = np.concatenate([pattern(r, 0, per, got.dtype.name) for r in range(n)])
    elif collective == "reduce_scatter":
        got = bufs["out"]
        per = got.size
        want = _summed(n, rank * per, per, got.dtype.name)
    elif collective == "all_to_all":  # block j: block `rank` of rank j's input
        got = bufs["out"]
        per = got.size // n
        want = np.concatenate([pattern(j, rank * per, per, got.dtype.name) for j in range(n)])
    elif collective in GENERATED:  # the record's own reference, summed in int64
        got = bufs["buf"]
        inputs = [pattern(r, 0, got.size, "int64") for r in range(n)]
        want = collectives.get(collective).expected(
            inputs, lambda parts: np.sum(parts, axis=0), np.concatenate, root)[rank]
        want = want.astype(got.dtype.name)
    else:
        raise ValueError(f"unknown collective {collective!r}")
    return int(np.count_nonzero(got != want))


# ----------------------------------------------------------------------------- systems


class System:
    """What the loop needs of a system: rank, size, barrier, max, and the collectives."""

    name = ""
    rank = 0
    size = 1

    def info(self) -> dict[str, Any]:
        return {}

    def barrier(self) -> None:
        raise NotImplementedError

    def reduce_max(self, values: np.ndarray) -> None:
        """In place: the element-wise max over the ranks (float64)."""
        raise NotImplementedError

    def call(self, collective: str, bufs: dict[str, np.ndarray], algorithm: str | None
             ) -> Callable[[], Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Minidist(System):
    name = "minidist"

    def __init__(self) -> None:
        import minidist

        self.md = minidist
        minidist.init()
        self.rank = minidist.get_rank()
        self.size = minidist.get_world_size()

    def info(self) -> dict[str, Any]:
        try:
            import uvloop  # noqa: F401
            loop = "uvloop" if os.environ.get("MINIDIST_UVLOOP", "1") != "0" else "asyncio"
        except ImportError:
            loop = "asyncio"
        return {"event_loop": loop}

    def barrier(self) -> None:
        self.md.barrier()

    def reduce_max(self, values: np.ndarray) -> None:
        self.md.all_reduce(values, op=self.md.ReduceOp.MAX)

    def call(self, collective, bufs, algorithm):
        md, kw = self.md, ({"algorithm": algorithm} if algorithm else {})
        if collective == "all_reduce":
            buf = bufs["buf"]
            return lambda: md.all_reduce(buf, **kw)
        if collective == "broadcast":
            buf = bufs["buf"]
            return lambda: md.broadcast(buf, src=0, **kw)
        if collective == "all_gather":
            out, inp = bufs["out"], bufs["inp"]
            return lambda: md.all_gather(out, inp, **kw)
        if collective == "reduce_scatter":
            out, inp = bufs["out"], bufs["inp"]
            return lambda: md.reduce_scatter(out, inp, **kw)
        if collective == "all_to_all":
            out, inp = bufs["out"], bufs["inp"]
            return lambda: md.all_to_all(out, inp, **kw)
        if collective == "barrier":  # its algorithm comes from MINIDIST_ALGO_BARRIER
            return md.barrier
        if collective == "pingpong":
            return pingpong(self.rank, self.size, bufs["buf"], md.send, md.recv)
        if collective in GENERATED:
            buf, fn = bufs["buf"], getattr(md, collectives.get(collective).front.function)
            return lambda: fn(buf, **kw)
        raise ValueError(collective)

    def close(self) -> None:
        self.md.destroy()


class Gloo(System):
    name = "gloo"

    def __init__(self) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        timeout = float(os.environ.get("MINIDIST_BENCH_TIMEOUT", 600))
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()

    def info(self) -> dict[str, Any]:
        return {"torch": self.torch.__version__,
                "torch_threads": self.torch.get_num_threads()}

    def barrier(self) -> None:
        self.dist.barrier()

    def reduce_max(self, values: np.ndarray) -> None:
        self.dist.all_reduce(self.torch.from_numpy(values), op=self.dist.ReduceOp.MAX)

    def call(self, collective, bufs, algorithm):
        dist = self.dist
        t = {k: self.torch.from_numpy(v) for k, v in bufs.items()}  # views, no copies
        if collective == "all_reduce":
            buf = t["buf"]
            return lambda: dist.all_reduce(buf)
        if collective == "broadcast":
            buf = t["buf"]
            return lambda: dist.broadcast(buf, src=0)
        if collective == "all_gather":
            out, inp = t["out"], t["inp"]
            return lambda: dist.all_gather_into_tensor(out, inp)
        if collective == "reduce_scatter":
            out, inp = t["out"], t["inp"]
            return lambda: dist.reduce_scatter_tensor(out, inp)
        if collective == "all_to_all":
            out, inp = t["out"], t["inp"]
            return lambda: dist.all_to_all_single(out, inp)
        if collective == "barrier":
            return dist.barrier
        if collective == "pingpong":
            return pingpong(self.rank, self.size, t["buf"], dist.send, dist.recv)
        raise ValueError(collective)

    def close(self) -> None:
        self.dist.destroy_process_group()


class Mpi(System):
    name = "mpi"

    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()

    def info(self) -> dict[str, Any]:
        import mpi4py

        return {"mpi4py": mpi4py.__version__,
                "library": self.MPI.Get_library_version().strip("\x00 \n").splitlines()[0]}

    def barrier(self) -> None:
        self.comm.Barrier()

    def reduce_max(self, values: np.ndarray) -> None:
        self.comm.Allreduce(self.MPI.IN_PLACE, values, op=self.MPI.MAX)

    def call(self, collective, bufs, algorithm):
        comm, in_place = self.comm, self.MPI.IN_PLACE
        if collective == "all_reduce":
            buf = bufs["buf"]
            return lambda: comm.Allreduce(in_place, buf)
        if collective == "broadcast":
            buf = bufs["buf"]
            return lambda: comm.Bcast(buf, root=0)
        if collective == "all_gather":
            out, inp = bufs["out"], bufs["inp"]
            return lambda: comm.Allgather(inp, out)
        if collective == "reduce_scatter":
            out, inp = bufs["out"], bufs["inp"]
            return lambda: comm.Reduce_scatter_block(inp, out)
        if collective == "all_to_all":
            out, inp = bufs["out"], bufs["inp"]
            return lambda: comm.Alltoall(inp, out)
        if collective == "barrier":
            return comm.Barrier
        if collective == "pingpong":
            return pingpong(self.rank, self.size, bufs["buf"], comm.Send,
                            lambda buf, src: comm.Recv(buf, source=src))
        raise ValueError(collective)


def pingpong(rank: int, n: int, buf, send: Callable, recv: Callable) -> Callable[[], Any]:
    """One round trip: an even rank sends ``buf`` to the next rank and receives it back
    (``send(buf, dst)``, ``recv(buf, src)``); a last rank without a partner idles."""
    peer = rank ^ 1
    if peer >= n:
        return lambda: None
    if rank % 2 == 0:
        def there_and_back() -> None:
            send(buf, peer)
            recv(buf, peer)
        return there_and_back

    def back() -> None:
        recv(buf, peer)
        send(buf, peer)
    return back


SYSTEMS: dict[str, type[System]] = {"minidist": Minidist, "gloo": Gloo, "mpi": Mpi}


# ----------------------------------------------------------------------------- the loop


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(event) + "\n")
    sys.stdout.flush()


def measure(system: System, cfg: dict[str, Any]) -> None:
    """Run every size of ``cfg``; rank 0 emits one line per size."""
    collective, dtype = cfg["collective"], cfg["dtype"]
    iters, warmup = int(cfg["iters"]), int(cfg["warmup"])
    algorithm, check = cfg.get("algorithm"), bool(cfg.get("check"))
    n, rank = system.size, system.rank
    if n != cfg["n"]:
        raise RuntimeError(f"expected {cfg['n']} ranks, the job has {n}")
    if rank == 0:
        emit({"event": "start", "system": system.name, "n": n, "info": system.info()})
    stats = np.zeros(2, np.float64)
    for count in cfg["counts"]:
        bufs = make_buffers(collective, count, n, dtype)
        op = system.call(collective, bufs, algorithm)
        for _ in range(warmup):
            op()
        system.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            op()
        elapsed = (time.perf_counter() - t0) / iters
        wrong = -1.0
        if check:
            fill_for_check(collective, bufs, rank, n)
            op()
            wrong = float(count_wrong(collective, bufs, rank, n))
        stats[0], stats[1] = elapsed, wrong
        system.reduce_max(stats)
        if rank == 0:
            emit({"event": "row", "count": count, "time_us": stats[0] * 1e6,
                  "wrong": None if stats[1] < 0 else int(stats[1])})
        del op, bufs
    system.barrier()
    if rank == 0:
        emit({"event": "done"})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minidist.bench.worker",
                                description="one rank of a minidist bench job")
    p.add_argument("--system", choices=tuple(SYSTEMS), required=True)
    p.add_argument("--config", required=True, help="the job, as JSON")
    a = p.parse_args(argv)
    cfg = json.loads(a.config)
    system = SYSTEMS[a.system]()
    try:
        measure(system, cfg)
    finally:
        system.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
