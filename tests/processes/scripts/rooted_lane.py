"""The RL loop's scatter and gather repeated with the same arrays take their role of the
rooted area straight from minidist.shm.repeat (not the general run), and stay exact
around what must send them the general way (argv: steps):

* steps 0 .. steps: the learner scatters one action per worker (and varies the array it
  scatters from every 7th step: another array of the same shape), the workers gather a
  64-byte observation; every 50th step an all_reduce on the world in between; at step
  steps // 3 the learner stops worker 2 with SIGSTOP for 0.5 s (the values right after
  SIGCONT are checked like every other);
* then ranks 0 and 1 break a group of their own (an all_reduce of different sizes:
  CollectiveMismatchError on both) and, once their engines know of it, the loop goes on
  for 60 steps: a rank that knows of a failed call sends its repeated calls the general
  way, still exact.

Every rank counts its repeated calls that took the general run; prints ``LANE OK
rank general=<before> of <calls> after=<general after the break>``."""

import os
import signal
import sys
import time

import numpy as np

import minidist
from minidist.errors import CollectiveMismatchError
from minidist.shm import repeat

steps = int(sys.argv[1])
minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
general = [0]
real = repeat.Repeat._general


def counted(self, *args):
    general[0] += 1
    return real(self, *args)


repeat.Repeat._general = counted
act = np.zeros(1, np.int64)
acts = [np.zeros(n, np.int64), np.zeros(n, np.int64)]
obs = np.zeros(64, np.uint8)
allobs = np.zeros((n, 64), np.uint8)


def step(i: int) -> None:
    src = acts[(i // 7) % 2]
    if rank == 0:
        src[:] = np.arange(n) * 1000 + i
    act[0] = -1
    minidist.scatter(act, src if rank == 0 else None, src=0)
    assert act[0] == rank * 1000 + i, (rank, i, act)
    obs[:] = (rank * 7 + i) % 256
    obs[:8] = np.frombuffer(np.int64(i * 100 + rank).tobytes(), np.uint8)
    allobs[:] = 0
    minidist.gather(obs, allobs if rank == 0 else None, dst=0)
    if rank == 0:
        for r in range(n):
            assert allobs[r, :8].view(np.int64)[0] == i * 100 + r, (i, r, allobs[r, :8])
            assert (allobs[r, 8:] == (r * 7 + i) % 256).all(), (i, r)
    if i % 50 == 49:
        x = np.full(3, i + rank, np.float64)
        minidist.all_reduce(x)
        assert (x == n * i + n * (n - 1) // 2).all(), x


for i in range(steps):
    step(i)
    if rank == 0 and i == steps // 3:
        pid = np.zeros(1, np.int64)
        minidist.recv(pid, 2)
        os.kill(int(pid[0]), signal.SIGSTOP)
        time.sleep(0.5)
        os.kill(int(pid[0]), signal.SIGCONT)
    elif rank == 2 and i == steps // 3:
        minidist.send(np.array([os.getpid()], np.int64), 0)
before = general[0]
if rank in (0, 1):
    pair = minidist.new_group([0, 1])
else:
    minidist.new_group([0, 1])
if rank in (0, 1):
    try:
        minidist.all_reduce(np.zeros(4 + rank, np.float64), group=pair)
        raise SystemExit("a mismatch went unnoticed")
    except CollectiveMismatchError:
        pass
    # the engine hears of the failed call from the loop's thread, a moment after the
    # caller: the loop below counts from when this rank knows
    deadline = time.monotonic() + 30
    while not minidist.api.door().fast_calls.engine.may_refuse():
        assert time.monotonic() < deadline, "the failed call never reached the engine"
        time.sleep(0.001)
general[0] = 0
for i in range(steps, steps + 60):
    step(i)
print(f"LANE OK {rank} general={before} of {2 * steps} after={general[0]}", flush=True)
minidist.destroy()
