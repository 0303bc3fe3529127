"""A rank forks children that end in one way or another; the job must go on working.

argv: MODE TRIALS [CALLS]. Each trial, one rank (trial % world) starts a child by MODE and
waits for it; then every rank runs CALLS all_reduces and checks every result. Modes:
sys_exit, os_exit, exception, call (the child's minidist call must raise the fork
error), sockets (the child holds none of the rank's sockets), init (child and
grandchild form a job of their own), mp_fork, mp_forkserver, dataloader (torch, two
workers), subprocess. Prints ``RESULT {json}`` per rank.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time

import numpy as np

import minidist as md

LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
          "MASTER_PORT", "MINIDIST_LAUNCHER", "MINIDIST_PORT", "MINIDIST_SECRET",
          "MINIDIST_ADDR", "GROUP_RANK", "NODE_RANK", "TORCHELASTIC_RUN_ID")


def _work(x: int) -> int:  # a multiprocessing child's job
    return x * 2


def _mp_target(q) -> None:
    q.put(_work(21))
    sys.exit(0)


def _own_job(rank: int, port: int) -> int:
    """In a forked child: a world of two of its own; 0 if its all_reduce is right."""
    for k in LAUNCH:
        os.environ.pop(k, None)
    md.init(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port, timeout=20)
    a = np.full(3, rank + 1.0)
    md.all_reduce(a)
    md.destroy()
    return 0 if a.tolist() == [3.0] * 3 else 5


def _sockets() -> int:
    """How many sockets this process holds, beside its standard streams (under
    ``minidist run`` its stdout is the launcher's socket)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        if int(fd) <= 2:
            continue
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child(mode: str) -> int:
    """Start a child by ``mode``; return 0 if it behaved as it should."""
    if mode in ("sys_exit", "os_exit", "exception", "call", "sockets", "init"):
        port = _free_port() if mode == "init" else 0
        pid = os.fork()
        if pid == 0:
            if mode == "sys_exit":
                sys.exit(0)
            if mode == "os_exit":
                os._exit(0)
            if mode == "exception":
                raise RuntimeError("the forked child fails (on purpose)")
            if mode == "call":
                try:
                    md.all_reduce(np.ones(1))
                except md.DistError as e:
                    sys.exit(0 if "forked child" in str(e) else 4)
                sys.exit(3)
            if mode == "sockets":
                os._exit(0 if _sockets() == 0 else 50 + min(_sockets(), 50))
            grand = os.fork()  # mode == "init"
            code = _own_job(1 if grand == 0 else 0, port)
            if grand:
                _, st = os.waitpid(grand, 0)
                code = code or os.waitstatus_to_exitcode(st)
            os._exit(code) if grand == 0 else sys.exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        return 0 if code == (1 if mode == "exception" else 0) else 10 + abs(code)
    if mode in ("mp_fork", "mp_forkserver"):
        ctx = mp.get_context(mode[3:])
        q = ctx.Queue()
        p = ctx.Process(target=_mp_target, args=(q,))
        p.start()
        got = q.get(timeout=60)
        p.join(60)
        return 0 if got == 42 and p.exitcode == 0 else 20
    if mode == "dataloader":
        import torch.utils.data as tud

        class Squares(tud.Dataset):
            def __len__(self) -> int:
                return 16

            def __getitem__(self, i: int) -> np.ndarray:
                return np.array([i * i])

        total = sum(int(b.sum()) for b in tud.DataLoader(Squares(), batch_size=4,
                                                          num_workers=2))
        return 0 if total == sum(i * i for i in range(16)) else 30
    if mode == "subprocess":
        r = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True,
                           text=True, timeout=60)
        return 0 if r.stdout.strip() == "42" else 40
    raise SystemExit(f"unknown mode {mode}")


def main() -> None:
    mode, trials = sys.argv[1], int(sys.argv[2])
    calls = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    if mode == "dataloader":  # imported before the job: it takes seconds on a busy machine
        import torch.utils.data  # noqa: F401
    md.init()
    rank, n = md.get_rank(), md.get_world_size()
    md.barrier()
    if mode == "sockets" and _sockets() == 0:
        raise SystemExit("the rank holds no socket: the check could not fail")
    bad_children, wrong, t0 = 0, 0, time.monotonic()
    for trial in range(trials):
        if trial % n == rank:
            bad_children += child(mode) != 0
        for i in range(calls):
            size = (1, 1000, 100_000)[i % 3]
            a = np.full(size, (rank + 1.0) * (i + 1))
            md.all_reduce(a)
            wrong += not np.all(a == (i + 1) * n * (n + 1) / 2)
    print("RESULT " + json.dumps({"rank": rank, "bad_children": bad_children,
                                  "wrong": wrong, "trials": trials,
                                  "s": round(time.monotonic() - t0, 2)}), flush=True)
    md.destroy()


if __name__ == "__main__":
    main()
