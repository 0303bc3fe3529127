"""The watchdog and the ctypes communicator's waits, with a stand-in libnccl: a call
completes when its event does; an asynchronous NCCL error, a lost peer or a passed
deadline aborts the communicator and fails the call with the minidist error; set-up
waits are bounded the same way."""

from __future__ import annotations

import concurrent.futures
import itertools
import time

import pytest

import minidist
from minidist_native import NcclError, NcclUsageError
from minidist_native._comm import NcclComm, _Pending
from minidist_native._errors import nccl_error
from minidist_native._exchange import SetupFailed
from minidist_native._keys import group_key
from minidist_native._watchdog import Watchdog

pytestmark = pytest.mark.timeout(60)


class FakeLib:
    """What NcclComm asks of a libnccl, scripted: ``codes`` are the successive answers
    of ncclCommGetAsyncError (the last one repeats)."""

    def __init__(self, *codes):
        self.codes = list(codes) or [0]
        self.aborted = []

    def async_error(self, comm):
        return self.codes.pop(0) if len(self.codes) > 1 else self.codes[0]

    def error(self, code, call, comm=None, **context):
        return nccl_error(code, call=call, text="scripted", last_error="", **context)

    def abort(self, comm):
        self.aborted.append(comm)
        return 0


class FakeEvent:
    def __init__(self, done_after=None):
        self.t0 = time.monotonic()
        self.done_after = done_after

    def query(self):
        return self.done_after is not None and time.monotonic() - self.t0 >= self.done_after


def comm_with(lib, timeout=5.0):
    c = NcclComm(lib, group_key(9, (0, 1), 0), None, (0, 1), 0, 0, timeout)
    c.comm = 0xC0FFEE
    return c


def watch(dog, comm, event, timeout):
    return dog.add(_Pending(comm, event, time.monotonic() + timeout, "all_reduce", []))


@pytest.fixture
def dog():
    d = Watchdog(name="test-watchdog")
    yield d
    d.stop()


def test_a_call_completes_with_its_event(dog):
    lib = FakeLib(0)
    c = comm_with(lib)
    f = watch(dog, c, FakeEvent(done_after=0.05), 5)
    assert f.result(5) is None
    assert lib.aborted == [] and c.failure is None


def test_an_async_error_aborts_and_fails_with_the_mapped_error(dog):
    lib = FakeLib(0, 0, 6)
    c = comm_with(lib)
    f = watch(dog, c, FakeEvent(), 5)
    with pytest.raises(minidist.PeerLostError, match="ncclRemoteError"):
        f.result(5)
    assert lib.aborted == [0xC0FFEE] and c.comm == 0
    with pytest.raises(minidist.PeerLostError, match="unusable since a call on it failed"):
        c._usable("broadcast")


def test_a_deadline_aborts_and_fails_with_a_timeout(dog):
    lib = FakeLib(7)
    c = comm_with(lib, timeout=0.2)
    t0 = time.monotonic()
    f = watch(dog, c, FakeEvent(), 0.2)
    with pytest.raises(minidist.DistTimeoutError, match="communicator was aborted"):
        f.result(5)
    assert time.monotonic() - t0 < 3
    assert lib.aborted == [0xC0FFEE]


def test_a_lost_peer_aborts_every_call_in_flight(dog):
    lib = FakeLib(0)
    c = comm_with(lib)
    fs = [watch(dog, c, FakeEvent(), 30) for _ in range(3)]
    time.sleep(0.05)
    c.peer_lost(1, minidist.PeerLostError("rank 1 died", ranks=(1,)))
    for f in fs:
        with pytest.raises(minidist.PeerLostError) as info:
            f.result(5)
        assert info.value.ranks == (1,)
    assert lib.aborted == [0xC0FFEE]  # once


def test_the_watchdog_serves_many_and_sleeps_when_idle(dog):
    lib = FakeLib(0)
    c = comm_with(lib)
    fs = [watch(dog, c, FakeEvent(done_after=0.01 * (i % 5)), 5) for i in range(50)]
    concurrent.futures.wait(fs, 5)
    assert all(f.done() and f.exception() is None for f in fs)
    time.sleep(0.05)
    assert dog.pending() == 0


def test_set_up_waits_while_in_progress_then_succeeds():
    lib = FakeLib(7, 7, 7, 0)
    c = comm_with(lib)
    c._progress(7, "ncclCommInitRankConfig", time.monotonic() + 5)
    assert c.failure is None and lib.aborted == []


def test_set_up_past_its_deadline_is_aborted():
    lib = FakeLib(7)
    c = comm_with(lib, timeout=0.1)
    with pytest.raises(minidist.DistTimeoutError, match="did not finish"):
        c._progress(7, "ncclCommInitRankConfig", time.monotonic() + 0.1)
    assert lib.aborted == [0xC0FFEE]


def test_set_up_stops_when_another_member_failed():
    lib = FakeLib(7)
    c = comm_with(lib)
    calls = itertools.count()

    def check():
        if next(calls) >= 1:
            raise SetupFailed("rank 1: no GPU memory")

    with pytest.raises(SetupFailed, match="no GPU memory"):
        c._progress(7, "ncclCommInitRankConfig", time.monotonic() + 10, check)
    assert lib.aborted == [0xC0FFEE]


def test_set_up_failures_map_and_abort():
    lib = FakeLib(7, 2)
    c = comm_with(lib)
    with pytest.raises(NcclError, match="ncclSystemError"):
        c._progress(7, "ncclCommInitRankConfig", time.monotonic() + 5)
    assert lib.aborted == [0xC0FFEE]


def test_a_refused_call_breaks_the_communicator():
    lib = FakeLib(0)
    c = comm_with(lib)
    with pytest.raises(NcclUsageError):
        c._issue(4, "all_reduce")
    assert c.failure is not None and lib.aborted == [0xC0FFEE]


def test_a_peer_that_left_lets_calls_in_flight_finish(dog):
    lib = FakeLib(0)
    c = comm_with(lib)
    done = watch(dog, c, FakeEvent(done_after=0.3), 30)
    c.peer_lost(1, minidist.PeerLostError("rank 1 left", ranks=(1,), left=True))
    assert done.result(5) is None  # it completed within the grace
    assert lib.aborted == []
    stuck = watch(dog, c, FakeEvent(), 30)
    with pytest.raises(minidist.PeerLostError) as info:
        stuck.result(10)  # never completes: fails after the grace
    assert info.value.left is True
    assert lib.aborted == [0xC0FFEE]
    with pytest.raises(minidist.PeerLostError, match="unusable"):
        c._usable("all_reduce")


def test_a_call_after_a_peer_left_fails_at_once():
    lib = FakeLib(0)
    c = comm_with(lib)
    c.peer_lost(1, minidist.PeerLostError("rank 1 left", ranks=(1,), left=True))
    with pytest.raises(minidist.PeerLostError, match="unusable since a call on it failed"):
        c._usable("broadcast")
    assert lib.aborted == [0xC0FFEE]


class Counting:
    """An item that counts its polls and which threads polled it."""

    def __init__(self, done_after_polls, error=None):
        import threading

        self.future = concurrent.futures.Future()
        self.polls = 0
        self.threads = set()
        self.left = done_after_polls
        self.error = error
        self._threading = threading

    def poll(self, now):
        self.polls += 1
        self.threads.add(self._threading.current_thread().name)
        self.left -= 1
        return (self.left <= 0), (self.error if self.left <= 0 else None)


def test_a_deferred_item_is_settled_on_the_callers_thread_only():
    dog = Watchdog(name="test-dog-defer")
    item = Counting(30)
    f = dog.defer(item)
    assert dog.settle(f) and f.result() is None
    assert item.threads == {"MainThread"} and item.polls == 30
    assert dog.pending() == 0 and dog._thread is None  # the thread never started
    bad = Counting(3, minidist.PeerLostError("gone"))
    f = dog.defer(bad)
    assert dog.settle(f)
    with pytest.raises(minidist.PeerLostError):
        f.result()


def test_a_settle_that_times_out_hands_the_item_to_the_thread():
    dog = Watchdog(name="test-dog-handover")
    item = Counting(10**9)
    f = dog.defer(item)
    assert not dog.settle(f, timeout=0.05)
    assert dog.pending() == 1  # the thread watches it now
    item.left = 1
    f.result(timeout=5)
    assert "test-dog-handover" in item.threads
    dog.stop()


def test_a_started_item_is_taken_back_by_a_waiting_caller():
    dog = Watchdog(name="test-dog-start")
    slow = Counting(10**9)
    f = dog.defer(slow)
    dog.start(f)
    assert dog.pending() == 1
    slow.left = 10**9
    assert not dog.settle(f, timeout=0.05)  # claimed, polled here, then handed back
    assert dog.pending() == 1
    slow.left = 1
    assert dog.settle(f, timeout=5) and f.done()
    dog.stop()
