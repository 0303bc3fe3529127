"""minidist.gymnasium.AsyncVectorEnv against gymnasium's own vector envs, its first-k
interface, its errors, and its workers' deaths."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from functools import partial

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium", reason="minidist.gymnasium needs gymnasium "
                          "(pip install -e '.[test]')")

from gymnasium.error import (  # noqa: E402
    AlreadyPendingCallError,
    ClosedEnvironmentError,
    NoAsyncCallError,
)
from gymnasium.utils.env_checker import data_equivalence  # noqa: E402
from gymnasium.vector import AutoresetMode, SyncVectorEnv  # noqa: E402
from gymnasium.vector.async_vector_env import _async_worker  # noqa: E402

from minidist.gymnasium import AsyncVectorEnv, WorkerLostError  # noqa: E402

from .envs import Broken, Counter, Quitter, Rich, Words  # noqa: E402


def run_both(make, actions: list, **kwargs) -> tuple[list, list]:
    """Step minidist's class and SyncVectorEnv alike, with ``actions`` in turn; every
    result of each."""
    mode = kwargs.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    out = []
    for env in (AsyncVectorEnv(make, **kwargs), SyncVectorEnv(make, autoreset_mode=mode)):
        try:
            got = [env.reset(seed=7)]
            got += [env.step(a) for a in actions]
        finally:
            env.close()
        out.append(got)
    return out[0], out[1]


@pytest.mark.parametrize("num_workers", [None, 3, 1])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_cartpole_steps_exactly_as_sync_vector_env(num_workers, mode, no_leftovers):
    fns = [lambda: gym.make("CartPole-v1") for _ in range(8)]
    acts = list(np.random.default_rng(0).integers(0, 2, (80, 8)))
    mine, sync = run_both(fns, acts, num_workers=num_workers, autoreset_mode=mode)
    assert any(r[2].any() for r in sync[1:])  # episodes ended on the way
    for a, b in zip(mine, sync, strict=True):
        assert data_equivalence(a, b, exact=True)


@pytest.mark.parametrize("num_workers", [None, 2])
def test_every_flat_space_kind_and_infos_travel(num_workers, no_leftovers):
    fns = [partial(Rich, i) for i in range(4)]
    rng = np.random.default_rng(1)
    acts = [(rng.integers(0, 4, 4), rng.uniform(-1, 1, (4, 2)).astype(np.float32))
            for _ in range(9)]
    mine, sync = run_both(fns, acts, num_workers=num_workers)
    for a, b in zip(mine, sync, strict=True):
        assert data_equivalence(a, b, exact=True)
    assert mine[4][4]["t"].tolist() == [4, 4, 4, 4]


def test_custom_spaces_are_pickled(no_leftovers):
    with pytest.raises(ValueError, match="shared_memory"):
        AsyncVectorEnv([Words] * 2)
    env = AsyncVectorEnv([Words] * 3, shared_memory=False)
    try:
        assert env.reset()[0] == ("start",) * 3
        obs, rew, *_ = env.step(("a", "b", "c"))
        assert obs == ("said a", "said b", "said c") and rew.tolist() == [1.0] * 3
    finally:
        env.close()


@pytest.mark.parametrize("num_workers,info_bytes", [(2, 20_000), (None, 20_000), (1, 20_000),
                                                    (None, 40), (1, 40)])
def test_big_observations_and_infos_go_around_the_rows(num_workers, info_bytes, no_leftovers):
    fns = [partial(Counter, i, limit=1000, info_bytes=info_bytes) for i in range(3)]
    env = AsyncVectorEnv(fns, num_workers=num_workers)
    try:
        env.reset(seed=0)
        for t in range(1, 6):
            obs, _, _, _, info = env.step(np.full(3, 2))
            assert obs[:, 1].tolist() == [2 * t] * 3
            assert info["blob"].shape == (3, info_bytes)
            assert (info["blob"] == (2 * t) % 251).all()
        # a call's big result: each env's whole blob back
        assert [len(x) for x in env.call("_obs")] == [3, 3, 3]
    finally:
        env.close()


def test_actions_of_another_dtype_reach_the_env_as_given(no_leftovers):
    seen = AsyncVectorEnv([partial(Counter, i) for i in range(2)])
    try:
        seen.reset()
        obs, *_ = seen.step(np.array([1.0, 2.0]))  # float64 for a Discrete space
        assert obs[:, 1].tolist() == [1, 2]
    finally:
        seen.close()


def test_call_get_and_set_attr_reset_mask_and_render(no_leftovers):
    env = AsyncVectorEnv([partial(Counter, i, limit=3) for i in range(5)], num_workers=2)
    try:
        env.reset(seed=[1, 2, 3, 4, 5])
        assert env.get_attr("ident") == (0, 1, 2, 3, 4)
        env.set_attr("limit", [9, 9, 9, 9, 9])
        env.set_attr("ident", 7)
        assert env.get_attr("ident") == (7,) * 5
        env.step(np.array([2, 2, 2, 2, 2]))
        obs, info = env.reset(seed=[10, 11, 12, 13, 14],
                              options={"reset_mask": np.array([1, 0, 1, 0, 0], bool)})
        assert obs[:, 1].tolist() == [0, 2, 0, 2, 2]
        assert info["seed"].tolist() == [10, 0, 12, 0, 0]
        assert info["_seed"].tolist() == [True, False, True, False, False]
        with pytest.raises(ValueError, match="Trying to call function `step`"):
            env.call("step", 1)
    finally:
        env.close()


def test_calls_out_of_order_raise_gymnasiums_errors(no_leftovers):
    env = AsyncVectorEnv([partial(Counter, i) for i in range(2)])
    with pytest.raises(NoAsyncCallError):
        env.step_wait()
    env.reset_async()
    with pytest.raises(AlreadyPendingCallError):
        env.step_async(np.zeros(2, int))
    env.reset_wait()
    with pytest.raises(ValueError):  # 3 actions for 2 envs: nothing was sent
        env.step(np.zeros(3, int))
    obs, *_ = env.step(np.ones(2, int))
    assert obs[:, 1].tolist() == [1, 1]
    env.close()
    with pytest.raises(ClosedEnvironmentError):
        env.reset()


@pytest.mark.parametrize("num_workers", [None, 1])
def test_an_envs_error_is_raised_as_gymnasium_does(num_workers, no_leftovers):
    env = AsyncVectorEnv([partial(Broken, i) for i in range(3)], num_workers=num_workers)
    try:
        env.reset()
        env.step(np.array([1, 1, 1]))
        with pytest.warns(UserWarning, match="Received the following error from Worker-1"):
            with pytest.raises(ValueError, match="env 1 refuses action 2"):
                env.step(np.array([1, 2, 1]))
        with pytest.raises(RuntimeError, match="env 1 was shut down"):
            env.step(np.array([1, 1, 1]))
    finally:
        env.close()


def test_a_timed_out_step_is_finished_before_the_next_call(no_leftovers):
    env = AsyncVectorEnv([partial(Counter, i, delay=lambda s: 0.3 if s == 1 else 0)
                          for i in range(3)])
    try:
        env.reset()
        env.step_async(np.array([1, 1, 1]))
        with pytest.raises(multiprocessing.TimeoutError):
            env.step_wait(timeout=0.05)
        obs, *_ = env.step(np.array([2, 2, 2]))  # the late answers are dropped
        assert obs[:, 1].tolist() == [3, 3, 3]
    finally:
        env.close()


def test_close_terminate_with_a_call_pending(no_leftovers):
    env = AsyncVectorEnv([partial(Counter, i, delay=5.0) for i in range(2)])
    env.reset()
    env.step_async(np.array([1, 1]))
    start = time.monotonic()
    with pytest.warns(UserWarning, match="pending call to `step`"):
        env.close(terminate=True)
    assert time.monotonic() - start < 4


def test_bad_arguments_change_nothing():
    fns = [partial(Counter, i) for i in range(3)]
    for kwargs in ({"num_workers": 0}, {"num_workers": 4}, {"batch_size": 0},
                   {"batch_size": 4}, {"max_concurrency": 0}):
        with pytest.raises(ValueError):
            AsyncVectorEnv(fns, **kwargs)
    with pytest.raises(ValueError, match="custom `worker`"):
        AsyncVectorEnv(fns, worker=_async_worker, num_workers=1)
    assert not multiprocessing.active_children()


def test_a_custom_worker_runs_on_gymnasiums_class(no_leftovers):
    env = AsyncVectorEnv([partial(Counter, i) for i in range(2)], worker=_async_worker)
    try:
        assert type(env) is gym.vector.AsyncVectorEnv
        obs, *_ = env.step(np.array([2, 1])) if env.reset() else None
        assert obs[:, 1].tolist() == [2, 1]
    finally:
        env.close()


# ---------------------------------------------------------------------- first k


@pytest.mark.parametrize("num_workers", [None, 3])
def test_recv_takes_the_first_k_envs_ready(num_workers, no_leftovers):
    # env i's steps take 0.02 * i s: the quick ones come back first and most often
    fns = [partial(Counter, i, limit=10**6, delay=0.02 * i) for i in range(6)]
    env = AsyncVectorEnv(fns, batch_size=2, num_workers=num_workers)
    counts = np.zeros(6, int)
    try:
        env.async_reset(seed=0)
        with pytest.raises(AlreadyPendingCallError):
            env.send(np.array([1]), [0])
        for _ in range(30):
            obs, rew, term, trunc, info = env.recv()
            ids = info["env_id"]
            assert len(ids) == 2 and obs.shape == (2, 3)
            assert obs[:, 0].tolist() == ids.tolist()  # each row is its env's
            assert obs[:, 1].tolist() == counts[ids].tolist()
            counts[ids] += 1
            env.send(np.ones(2, int), ids)
        assert counts[0] + counts[1] > counts[4] + counts[5]
        with pytest.raises(AlreadyPendingCallError):
            env.step(np.zeros(6, int))
    finally:
        env.close()


def test_recv_needs_k_envs_stepping(no_leftovers):
    env = AsyncVectorEnv([partial(Counter, i) for i in range(4)], batch_size=3)
    try:
        with pytest.raises(NoAsyncCallError):
            env.recv()
        env.send(np.ones(2, int), [0, 1])
        with pytest.raises(NoAsyncCallError):
            env.recv()
        with pytest.raises(ValueError):
            env.send(np.ones(2, int), [2, 2])
        env.send(np.ones(1, int), [3])
        _, _, _, _, info = env.recv()
        assert sorted(info["env_id"].tolist()) == [0, 1, 3]
        obs, *_ = env.step(np.ones(4, int))  # the lockstep API still works
        assert obs[:, 1].tolist() == [2, 2, 1, 2]
    finally:
        env.close()


# ---------------------------------------------------------------------- deaths


@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_killed_worker_is_named_within_seconds(batch_size, no_leftovers):
    for _ in range(10):
        env = AsyncVectorEnv([partial(Counter, i, limit=10**6, delay=0.05) for i in range(4)],
                             batch_size=batch_size)
        try:
            env.reset()
            env.step_async(np.ones(4, int)) if batch_size is None else \
                env.send(np.ones(4, int))
            _kill_worker_of_pid(env, 2)
            start = time.monotonic()
            with pytest.raises(WorkerLostError, match=r"env 2 died .*SIGKILL") as got:
                if batch_size is None:
                    env.step_wait()
                else:
                    for _ in range(3):
                        env.recv()
            assert time.monotonic() - start < 5
            assert got.value.env_ids == [2]
        finally:
            env.close()


def _kill_worker_of_pid(env: AsyncVectorEnv, env_id: int) -> None:
    os.kill(env._job.processes[env_id].pid, signal.SIGKILL)


@pytest.mark.parametrize("batch_size", [None, 2])
def test_restart_failed_rebuilds_the_env_and_goes_on(batch_size, no_leftovers):
    env = AsyncVectorEnv([partial(Counter, i, limit=10**6, delay=0.01) for i in range(4)],
                         restart_failed=True, batch_size=batch_size)
    expected = np.zeros(4, int)  # the count each env's next result shows
    restarts = 0
    awaiting: set[int] = set()  # killed, restart not yet reported
    try:
        env.reset()
        expected[:] = 1
        if batch_size is not None:
            env.async_reset()
            expected[:] = 0
        t = 0
        while t < 30 or (restarts < 10 and t < 200):  # first-k: the last may come late
            t += 1
            kill = t <= 30 and t % 3 == 1
            if batch_size is None:
                env.step_async(np.ones(4, int))
                if kill:
                    _kill_worker_of_pid(env, t % 4)
                obs, _, _, _, info = env.step_wait()
                ids = np.arange(4)
            else:
                if kill:  # an env stepping whose last restart was reported
                    victim = next(i for i in np.flatnonzero(env._in_flight).tolist()
                                  if i not in awaiting)
                    awaiting.add(victim)
                    _kill_worker_of_pid(env, victim)
                obs, _, _, _, info = env.recv()
                ids = info["env_id"]
            back = info["restarted"] & info["_restarted"] if "restarted" in info else \
                np.zeros(len(ids), bool)
            restarts += int(back.sum())
            awaiting.difference_update(ids[back].tolist())
            assert obs[:, 0].tolist() == ids.tolist()
            assert obs[:, 1].tolist() == np.where(back, 0, expected[ids]).tolist()
            expected[ids] = obs[:, 1] + 1
            if batch_size is not None:
                env.send(np.ones(len(ids), int), ids)
        assert restarts == 10
    finally:
        env.close()


# ---------------------------------------------------------------------- ranks of a job


def test_envs_on_the_ranks_of_a_running_job():
    from ..processes.harness import Job

    script = __import__("pathlib").Path(__file__).parent / "scripts" / "serve_job.py"
    with Job(3, script) as job:
        rc = job.wait(timeout=90)
        assert rc == 0, job.out + job.err
        assert "SERVED" in job.out


def test_a_stopped_worker_gives_right_results_after_sigcont(no_leftovers):
    env = AsyncVectorEnv([partial(Counter, i, limit=10**6) for i in range(4)])
    try:
        env.reset()
        for t in range(1, 31):
            env.step_async(np.full(4, 1))
            if t % 10 == 5:
                pid = env._job.processes[t % 4].pid
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.5)
                os.kill(pid, signal.SIGCONT)
            obs, *_ = env.step_wait()
            assert obs[:, 1].tolist() == [t] * 4
            assert obs[:, 0].tolist() == [0, 1, 2, 3]
    finally:
        env.close()


@pytest.mark.parametrize("restart_failed", [False, True])
def test_a_worker_that_exits_mid_step(restart_failed, no_leftovers):
    env = AsyncVectorEnv([partial(Quitter, i, limit=10**6) for i in range(3)],
                         restart_failed=restart_failed)
    try:
        env.reset()
        env.step(np.array([1, 1, 1]))
        if not restart_failed:
            with pytest.raises(WorkerLostError, match="env 1 (left|died)"):
                env.step(np.array([1, 2, 1]))
            with pytest.raises(RuntimeError, match="lost a worker"):
                env.step(np.array([1, 1, 1]))
            return
        obs, _, _, _, info = env.step(np.array([1, 2, 1]))
        assert obs[:, 1].tolist() == [2, 0, 2]
        assert info["_restarted"].tolist() == [False, True, False]
        obs, *_ = env.step(np.array([1, 1, 1]))
        assert obs[:, 1].tolist() == [3, 1, 3]
    finally:
        env.close()
