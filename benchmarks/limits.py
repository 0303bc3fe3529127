"""The physical limits of this machine, for reading ``minidist bench`` tables against.

* memcpy: ``np.copyto(dst, src)`` and ``np.add(a, b, out=a)`` of 64 MiB float32 on one
  core (GB/s = bytes of one operand / time);
* stream: one Unix-socket stream and one TCP loopback stream between two processes
  (a forked sender ``sendall``s a preallocated buffer, the receiver ``recv_into``s a
  preallocated buffer: the best a socket ring step can do);
* ping-pong: the round trip of an 8-byte message over each (blocking sockets), the floor
  under a small collective's latency: unpinned, then both processes pinned to one core
  (each message is a context switch) and to two cores (each is a cross-core wake-up).

Each figure is measured ``--repeat`` times; the table gives the best and the median
(on a shared machine the best is the machine, the median is the machine plus neighbours).

    python benchmarks/limits.py                  # everything, about 20 s on 2 cores
    python benchmarks/limits.py --json limits.json
    python benchmarks/limits.py --only stream --stream-mib 4096
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time

import numpy as np

MIB = 1 << 20


def memcpy(nbytes: int, repeat: int) -> dict[str, list[float]]:
    src = np.ones(nbytes // 4, np.float32)
    dst = np.zeros_like(src)
    b = np.ones_like(src)
    out = {"memcpy": [], "np.add (in place)": []}
    np.copyto(dst, src)  # fault the pages in
    np.add(dst, b, out=dst)
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        out["memcpy"].append(nbytes / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        np.add(dst, b, out=dst)
        out["np.add (in place)"].append(nbytes / (time.perf_counter() - t0) / 1e9)
    return out


def _pair(family: str) -> tuple[socket.socket, socket.socket]:
    if family == "unix":
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    a = socket.create_connection(lst.getsockname())
    b, _ = lst.accept()
    lst.close()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


def _child(fn) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fn()
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return pid


def stream(family: str, total: int, chunk: int, repeat: int) -> list[float]:
    """GB/s of one stream from a forked sender to this process, ``repeat`` times."""
    a, b = _pair(family)
    payload = memoryview(np.ones(chunk, np.uint8))
    rounds = max(1, total // chunk)

    def sender() -> None:
        b.close()
        for _ in range(repeat):
            a.recv(1)  # go
            for _ in range(rounds):
                a.sendall(payload)

    pid = _child(sender)
    a.close()
    buf = memoryview(np.empty(chunk, np.uint8))
    results = []
    try:
        for _ in range(repeat):
            want = rounds * chunk
            t0 = time.perf_counter()
            b.sendall(b"g")
            while want:
                got = b.recv_into(buf, min(chunk, want))
                if not got:
                    raise RuntimeError("the sender went away")
                want -= got
            results.append(rounds * chunk / (time.perf_counter() - t0) / 1e9)
    finally:
        b.close()
        os.waitpid(pid, 0)
    return results


def pingpong(family: str, rounds: int, repeat: int,
             cpus: tuple[int, int] | None = None) -> list[float]:
    """Microseconds of one 8-byte round trip (mean over ``rounds``), ``repeat`` times.

    ``cpus``: pin this process and the echoing one to these CPUs (the same CPU twice:
    every message is a context switch; two CPUs: every message is a cross-CPU wake-up).
    """
    a, b = _pair(family)
    saved = os.sched_getaffinity(0) if cpus else None

    def echo() -> None:
        if cpus:
            os.sched_setaffinity(0, {cpus[1]})
        b.close()  # the parent's end: closing it there must mean EOF here
        msg = bytearray(8)
        while True:
            if a.recv_into(msg, 8) == 0:
                return
            a.sendall(msg)

    pid = _child(echo)
    a.close()
    if cpus:
        os.sched_setaffinity(0, {cpus[0]})
    msg, back = b"\x01" * 8, bytearray(8)
    results = []
    try:
        for _ in range(rounds // 10):  # warm up
            b.sendall(msg)
            b.recv_into(back, 8)
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(rounds):
                b.sendall(msg)
                b.recv_into(back, 8)
            results.append((time.perf_counter() - t0) / rounds * 1e6)
    finally:
        b.close()
        os.waitpid(pid, 0)
        if saved:
            os.sched_setaffinity(0, saved)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("memcpy", "stream", "pingpong"), action="append")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--memcpy-mib", type=int, default=64)
    p.add_argument("--stream-mib", type=int, default=1024, help="bytes per stream measurement")
    p.add_argument("--chunk-kib", type=int, default=1024, help="send/recv size (default 1 MiB)")
    p.add_argument("--rounds", type=int, default=5000, help="round trips per ping-pong figure")
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args(argv)
    parts = a.only or ["memcpy", "stream", "pingpong"]
    rows: list[tuple[str, str, list[float]]] = []
    if "memcpy" in parts:
        for name, vals in memcpy(a.memcpy_mib * MIB, a.repeat).items():
            rows.append((f"{name}, {a.memcpy_mib} MiB, one core", "GB/s", vals))
    if "stream" in parts:
        for family in ("unix", "tcp"):
            vals = stream(family, a.stream_mib * MIB, a.chunk_kib * 1024, a.repeat)
            label = "Unix socket" if family == "unix" else "TCP loopback"
            rows.append((f"one {label} stream, {a.chunk_kib} KiB sends", "GB/s", vals))
    if "pingpong" in parts:
        placements: list[tuple[str, tuple[int, int] | None]] = [("", None)]
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) >= 2:
            placements += [(", one core", (cpus[0], cpus[0])),
                           (", two cores", (cpus[0], cpus[1]))]
        for family in ("unix", "tcp"):
            label = "Unix socket" if family == "unix" else "TCP loopback"
            for where, pin in placements:
                vals = pingpong(family, a.rounds, a.repeat, pin)
                rows.append((f"8-byte round trip, {label}{where}", "us", vals))

    load = [round(x, 2) for x in os.getloadavg()]
    print(f"# {os.cpu_count()} cpus, python {platform.python_version()}, numpy "
          f"{np.__version__}, load average {' '.join(map(str, load))}")
    print(f"# {'what':<46}{'best':>10}{'median':>10}  unit")
    for name, unit, vals in rows:
        best = min(vals) if unit == "us" else max(vals)
        print(f"  {name:<46}{best:>10.2f}{statistics.median(vals):>10.2f}  {unit}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"load": load, "cpus": os.cpu_count(),
                       "rows": [{"what": n, "unit": u, "values": v} for n, u, v in rows]},
                      f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
