"""This process's state (minidist.process_state): one door per front end, one way to
join and leave, the errors a front end gets without a door, and what a forked child
forgets. The real front ends are tried on a world of one (no socket)."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

import minidist
import minidist.aio
from minidist import api
from minidist.errors import DistError
from minidist.process_state import STATE, ProcessState


class FakeDoor:
    """Records how it was left."""

    def __init__(self) -> None:
        self.left: list[bool] = []
        self.closed = 0

    def leave(self, graceful: bool = True) -> None:
        self.left.append(graceful)

    async def close(self) -> None:
        self.closed += 1


@pytest.fixture
def no_torch(monkeypatch):
    """The error of the blocking API names torch's init once minidist.torch is loaded."""
    monkeypatch.delitem(sys.modules, "minidist.torch", raising=False)


@pytest.fixture
def hooks(monkeypatch):
    """The exit hooks a join puts in place, caught instead (the test process's own stay)."""
    registered: list = []
    monkeypatch.setattr("atexit.register", registered.append)
    monkeypatch.setattr(sys, "excepthook", lambda *a: None)
    return registered


def test_every_front_end_reaches_the_one_state():
    # the blocking API's door() is the state's own method (one attribute read per call),
    # minidist.aio's too; none keeps a door of its own
    assert api.door.__self__ is STATE and api.door.__func__ is ProcessState.door
    assert minidist.aio._d.__self__ is STATE
    assert not hasattr(api, "_door") and not hasattr(minidist.aio, "_door")


def test_without_a_door_each_front_end_says_what_to_call(no_torch):
    st = ProcessState()
    with pytest.raises(DistError, match=r"not initialized: call minidist.init\(\) first"):
        st.door()
    with pytest.raises(DistError, match=r"await minidist.aio.init\(\) first"):
        st.aio_door()
    st.aio = FakeDoor()
    with pytest.raises(DistError, match="this process uses minidist.aio"):
        st.door()
    st.aio, st.blocking = None, FakeDoor()
    with pytest.raises(DistError, match="this process uses the blocking API"):
        st.aio_door()
    assert st.door() is st.blocking


def test_the_blocking_error_names_torch_once_it_is_loaded(monkeypatch):
    monkeypatch.setitem(sys.modules, "minidist.torch", object())
    with pytest.raises(DistError, match=r"call init_process_group\(\)"):
        ProcessState().door()


def test_a_second_join_is_refused_before_it_starts_anything(hooks):
    st = ProcessState()
    first = FakeDoor()
    assert st.join(lambda: first) is first and st.door() is first

    def never() -> FakeDoor:
        raise AssertionError("a refused join started a door")

    with pytest.raises(DistError, match=r"already initialized; call minidist.destroy\(\)"):
        st.join(never)
    assert st.door() is first
    st.leave()
    assert first.left == [True] and st.blocking is None
    second = FakeDoor()
    assert st.join(lambda: second) is second  # leave, then join again
    assert hooks == [st.leave]  # once per process, however often it joins


async def test_the_two_front_ends_exclude_each_other(hooks):
    st = ProcessState()

    async def start() -> FakeDoor:
        return FakeDoor()

    await st.join_aio(start)
    with pytest.raises(DistError, match="minidist.aio is already initialized"):
        await st.join_aio(start)
    with pytest.raises(DistError, match="this process already uses minidist.aio"):
        st.join(FakeDoor)
    d = st.aio
    await st.leave_aio()
    assert d.closed == 1 and st.aio is None
    st.join(FakeDoor)
    with pytest.raises(DistError, match="this process already uses the blocking API"):
        await st.join_aio(start)


def test_after_an_uncaught_error_the_door_leaves_without_waiting(hooks):
    st = ProcessState()
    d = st.join(FakeDoor)
    sys.excepthook(ValueError, ValueError("boom"), None)  # the hook the join put in place
    assert st.crashed
    st.leave()
    assert d.left == [False]


def test_a_forked_child_forgets_everything():
    st = ProcessState()
    st.blocking, st.aio, st.crashed = FakeDoor(), FakeDoor(), True
    st.jobs.append("a ray job")
    lock = st.lock
    lock.acquire()  # held by another thread of the parent at the fork
    st.forget()
    assert (st.blocking, st.aio, st.jobs, st.crashed) == (None, None, [], False)
    assert st.lock is not lock and st.lock.acquire(blocking=False)


def test_the_blocking_api_joins_leaves_and_joins_again(no_torch):
    assert not minidist.is_initialized()
    with pytest.raises(DistError, match=r"call minidist.init\(\) first"):
        minidist.get_rank()
    for _ in range(2):
        minidist.init(rank=0, world_size=1, timeout=10)
        try:
            assert minidist.is_initialized() and STATE.blocking is api.door()
            with pytest.raises(DistError, match="already initialized"):
                minidist.init(rank=0, world_size=1, timeout=10)
            x = np.arange(4.0)
            minidist.all_reduce(x)
            assert x.tolist() == [0.0, 1.0, 2.0, 3.0]
            with pytest.raises(DistError, match="this process uses the blocking API"):
                minidist.aio.get_rank()
        finally:
            minidist.destroy()
        assert not minidist.is_initialized() and STATE.blocking is None
    minidist.destroy()  # nothing to leave: nothing happens


async def test_minidist_aio_joins_leaves_and_joins_again():
    for _ in range(2):
        await minidist.aio.init(rank=0, world_size=1, timeout=10)
        try:
            assert minidist.aio.is_initialized() and not minidist.is_initialized()
            with pytest.raises(DistError, match="this process already uses minidist.aio"):
                minidist.init(rank=0, world_size=1, timeout=10)
            with pytest.raises(DistError, match="this process uses minidist.aio"):
                minidist.get_rank()
            x = np.ones(3)
            await minidist.aio.all_reduce(x)
            assert x.tolist() == [1.0, 1.0, 1.0]
        finally:
            await minidist.aio.destroy()
        assert STATE.aio is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_from_a_rank_cannot_use_its_job_but_may_join_its_own():
    minidist.init(rank=0, world_size=1, timeout=10)
    parents = api.door()
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit codes say what went wrong
            code = 0
            try:
                if STATE.blocking is not None:
                    code = 2
                try:  # the session's methods the parent's door holds are cut off too
                    parents._send_now(None, None)
                    code = code or 7
                except DistError as e:
                    code = code or (0 if "forked child" in str(e) else 8)
                try:
                    minidist.get_rank()
                    code = 3
                except DistError as e:
                    code = code or (0 if "forked child" in str(e) else 4)
                minidist.init(rank=0, world_size=1, timeout=10)
                if minidist.get_rank() != 0:
                    code = code or 5
                minidist.destroy()
            except BaseException:  # noqa: BLE001 - any failure is a code
                code = code or 6
            os._exit(code)
        end = time.monotonic() + 60
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > end:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child did not finish")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0
        assert minidist.get_rank() == 0  # the parent's job is untouched
    finally:
        minidist.destroy()
