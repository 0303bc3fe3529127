"""The CPU an RL step costs each rank, from the OS: a learner (rank 0) and W env workers
in lockstep (scatter + gather, or send / recv) or first-k (``recv_many`` and sends);
every rank's user + system time (``os.times``) over the timed steps, per step.

    python -m minidist run -n 9 benchmarks/step_cpu.py --mode scatter
    python -m minidist run -n 33 benchmarks/step_cpu.py --mode firstk -k 8 --vary
    python -m minidist run -n 9 benchmarks/step_cpu.py --mode scatter --api torch

Prints one JSON line on rank 0: env steps per second, the learner's CPU per env step,
and the workers' CPU per env step (median and max over workers), and their context
switches per env step (voluntary, involuntary; ``getrusage``). On a machine whose
cores the ranks crowd, a step's throughput is bound by the sum of these; run it from
two checkouts in turn to compare code (the machine's speed drifts: alternate).
A worker's env step writes the action into its 256-byte observation, and with
``--vary`` sleeps uniform 0 - 1 ms (the sleep's own CPU counts too). ``--api torch``
runs the same loop on CPU tensors through ``import minidist.torch as dist``, written as
a torch user writes it (a list of tensors on the root).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import numpy as np

import minidist as md

STOP = -1


def usage() -> np.ndarray:
    """This process's (CPU seconds, voluntary and involuntary context switches)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([r.ru_utime + r.ru_stime, r.ru_nvcsw, r.ru_nivcsw])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("scatter", "p2p", "firstk"), default="scatter")
    p.add_argument("--seconds", type=float, default=4.0, help="timed seconds (after 1 s)")
    p.add_argument("-k", type=int, default=8, help="firstk: observations per learner step")
    p.add_argument("--obs", type=int, default=256, help="observation bytes (>= 8)")
    p.add_argument("--vary", action="store_true", help="workers sleep uniform 0 - 1 ms")
    p.add_argument("--api", choices=("numpy", "torch"), default="numpy")
    a = p.parse_args()
    if a.api == "torch":
        global md
        md = TorchCalls()
    md.init()
    rank, n = md.get_rank(), md.get_world_size()
    if n < 2:
        raise SystemExit("step_cpu: run it with at least 2 ranks (minidist run -n N)")
    act = np.zeros(1, np.int64)
    if rank == 0:
        report = learner(a, n, act)
    else:
        report = worker(a, rank, act)
    reports = md.all_gather_object(report)
    if rank == 0:
        steps, seconds, (learner_cpu, l_vol, l_inv) = reports[0]
        per_worker = [c[0] / s for s, c in reports[1:] if s]
        vol = [c[1] / s for s, c in reports[1:] if s]
        inv = [c[2] / s for s, c in reports[1:] if s]
        print(json.dumps({
            "mode": a.mode, "workers": n - 1, "k": a.k if a.mode == "firstk" else None,
            "vary": a.vary, "env_steps_per_s": round(steps / seconds),
            "learner_cpu_us_per_env_step": round(learner_cpu / steps * 1e6, 1),
            "worker_cpu_us_per_env_step": round(statistics.median(per_worker) * 1e6, 1),
            "worker_cpu_us_per_env_step_max": round(max(per_worker) * 1e6, 1),
            # context switches per env step (voluntary: it waited; involuntary: preempted)
            "learner_switches_per_env_step": [round(l_vol / steps, 2), round(l_inv / steps, 2)],
            "worker_switches_per_env_step": [round(statistics.median(vol), 2),
                                             round(statistics.median(inv), 2)]}),
            flush=True)
    md.destroy()


class TorchCalls:
    """The calls this benchmark makes, on CPU tensors through ``minidist.torch``: the
    arrays become tensors sharing their memory, and the root's scatter and gather
    lists are lists of one tensor per rank, as torch.distributed takes them."""

    def __init__(self) -> None:
        import torch

        import minidist
        import minidist.torch as dist

        self.torch, self.dist, self.all_gather_object = torch, dist, minidist.all_gather_object
        self.tensors: dict[int, tuple] = {}
        self.lists: dict[int, list] = {}

    def init(self) -> None:
        self.dist.init_process_group()

    def destroy(self) -> None:
        self.dist.destroy_process_group()

    def get_rank(self) -> int:
        return self.dist.get_rank()

    def get_world_size(self) -> int:
        return self.dist.get_world_size()

    def _t(self, arr: np.ndarray):
        got = self.tensors.get(id(arr))
        if got is None:  # made once: a user's tensor, kept across steps
            got = self.tensors[id(arr)] = (arr, self.torch.from_numpy(arr))
        return got[1]

    def _rows(self, arr: np.ndarray) -> list:
        got = self.lists.get(id(arr))
        if got is None:  # made once: a user's list of tensors, kept across steps
            got = self.lists[id(arr)] = [self.torch.from_numpy(row)
                                         for row in arr.reshape(len(arr), -1)]
        return got

    def scatter(self, out, ins, src: int) -> None:
        self.dist.scatter(self._t(out), None if ins is None else self._rows(ins), src=src)

    def gather(self, inp, outs, dst: int) -> None:
        self.dist.gather(self._t(inp), None if outs is None else self._rows(outs), dst=dst)

    def send(self, arr, dst: int) -> None:
        self.dist.send(self._t(arr), dst)

    def recv(self, arr, src: int | None = None) -> int:
        return self.dist.recv(self._t(arr), src)

    def recv_many(self, out) -> np.ndarray:
        return self.dist.recv_many(self._t(out)).numpy()


def learner(a, n: int, act: np.ndarray) -> tuple[int, float, list]:
    """Step until the time is up; (env steps timed, seconds, :func:`usage` over them)."""
    W, B = n - 1, a.obs
    start = time.perf_counter()
    timed_from = c0 = None
    steps = step = 0
    if a.mode == "firstk":
        got = np.zeros((a.k, B), np.uint8)
        act[0] = 1
        for w in range(1, n):
            md.send(act, w)
    else:
        acts = np.zeros(n, np.int64)
        obs = np.zeros((n, B), np.uint8)
        rows = list(obs)  # one view per rank, made once
        mine = np.zeros(B, np.uint8)
    while True:
        now = time.perf_counter()
        if timed_from is None and now - start >= 1.0:
            timed_from, c0 = now, usage()
        elif timed_from is not None and now - timed_from >= a.seconds:
            break
        step += 1
        if a.mode == "scatter":
            acts[:] = step
            md.scatter(act, acts, src=0)
            md.gather(mine, obs, dst=0)
            taken = W
        elif a.mode == "p2p":
            act[0] = step
            for w in range(1, n):
                md.send(act, w)
            for w in range(1, n):
                md.recv(rows[w], w)
            taken = W
        else:
            senders = md.recv_many(got).tolist()
            act[0] = step
            for s in senders:
                md.send(act, s)
            taken = a.k
        if timed_from is not None:
            steps += taken
    seconds, used = time.perf_counter() - timed_from, usage() - c0
    if a.mode == "firstk":
        for _ in range(W):  # every worker has one observation outstanding
            md.recv(got[0])
    act[0] = STOP
    if a.mode == "scatter":
        acts[:] = STOP
        md.scatter(act, acts, src=0)
    else:
        for w in range(1, n):
            md.send(act, w)
    return steps, seconds, used.tolist()


def worker(a, rank: int, act: np.ndarray) -> tuple[int, list]:
    """Step until told to stop; (env steps, CPU seconds) over those after the first
    second."""
    obs = np.zeros(max(a.obs, 8), np.uint8)[:a.obs]
    rng = np.random.default_rng(rank)
    start = time.perf_counter()
    c0 = None
    steps = 0
    while True:
        if a.mode == "scatter":
            md.scatter(act, None, src=0)
        else:
            md.recv(act, 0)
        if act[0] == STOP:
            break
        if c0 is None and time.perf_counter() - start >= 1.0:
            c0 = usage()
        obs[:8] = act.view(np.uint8)
        if a.vary:
            time.sleep(rng.uniform(0.0, 1e-3))
        if c0 is not None:
            steps += 1
        if a.mode == "scatter":
            md.gather(obs, None, dst=0)
        else:
            md.send(obs, 0)
    return steps, (usage() - c0).tolist() if c0 is not None else [0.0, 0, 0]


if __name__ == "__main__":
    main()
