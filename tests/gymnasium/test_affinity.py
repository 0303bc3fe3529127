"""Where a vector env's workers run: the order CPUs are dealt in (pure, a made-up
topology) and the workers' affinity as the kernel reports it."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

from minidist.gymnasium import AsyncVectorEnv  # noqa: E402
from minidist.gymnasium._affinity import spread, worker_cpus  # noqa: E402

TWO_THREADS = {0: "0,4", 4: "0,4", 1: "1,5", 5: "1,5", 2: "2,6", 6: "2,6", 3: "3,7",
               7: "3,7"}  # 4 cores of 2 threads, numbered as Intel does
ADJACENT = {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3"}  # numbered as some AMD boards do


def test_every_core_gets_a_worker_before_any_core_gets_two():
    assert spread(range(8), TWO_THREADS.get) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert spread(range(4), ADJACENT.get) == [0, 2, 1, 3]
    assert spread({3, 2, 1}, ADJACENT.get) == [1, 2, 3]  # 1 and 3: the second threads
    assert spread([5, 1, 6], lambda c: None) == [1, 5, 6]  # unknown: a core each


def test_workers_are_dealt_round_robin_over_the_allowed_cpus_and_the_vector_envs():
    first = worker_cpus(5, [0, 1])
    assert first in ([0, 1, 0, 1, 0], [1, 0, 1, 0, 1])
    assert worker_cpus(1, [0, 1]) == [1 - first[-1]]  # the next env goes on from there
    assert worker_cpus(1, [0, 1]) == [first[-1]]
    assert worker_cpus(2, [7]) == [7, 7]
    mine = spread(os.sched_getaffinity(0))
    got = worker_cpus(3)
    assert got == [mine[(mine.index(got[0]) + w) % len(mine)] for w in range(3)]
    with pytest.raises(ValueError):
        worker_cpus(1, [])


def _affinities(env: AsyncVectorEnv) -> list[set[int]]:
    return [os.sched_getaffinity(p.pid) for p in env._job.processes]


def test_each_worker_runs_on_its_own_cpu_and_a_restarted_one_on_the_same(no_leftovers):
    mine = os.sched_getaffinity(0)
    env = AsyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(4)],
                         num_workers=2, restart_failed=True)
    try:
        env.reset(seed=0)
        want = _affinities(env)
        assert all(len(cpus) == 1 and cpus <= mine for cpus in want)
        if len(mine) > 1:
            assert want[0] != want[1]
        old = env._job.processes[1].pid
        os.kill(old, signal.SIGKILL)
        _, _, _, _, info = env.step(np.zeros(4, int))  # finds it dead, starts it again
        assert info["restarted"][2:].all()
        assert env._job.processes[1].pid != old
        assert _affinities(env) == want
    finally:
        env.close()


def test_pin_workers_false_leaves_them_where_the_caller_may_run(no_leftovers):
    env = AsyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)],
                         pin_workers=False)
    try:
        env.reset(seed=0)
        assert _affinities(env) == [os.sched_getaffinity(0)] * 3
    finally:
        env.close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_two_one_worker_vector_envs_take_two_cpus(no_leftovers):
    envs = []
    try:
        for _ in range(2):
            envs.append(AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2, num_workers=1))
        a, b = (_affinities(e)[0] for e in envs)
        assert len(a) == len(b) == 1 and a != b
    finally:
        for e in envs:
            e.close()
