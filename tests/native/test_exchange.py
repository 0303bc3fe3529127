"""The set-up's exchange against an in-process store (the job tests run it over the
real rendezvous): host declarations, deadlines, failures, clean-up."""

from __future__ import annotations

import threading
import time

import pytest

import minidist
from minidist_native._exchange import Exchange, SetupFailed
from minidist_native._keys import Ordinals, group_key, host_declaration
from minidist_native._records import DeviceRecord

pytestmark = pytest.mark.timeout(60)


class DictStore:
    """minidist.Store's methods over a dict (waits poll)."""

    def __init__(self):
        self.d = {}
        self.lock = threading.Lock()

    def set(self, k, v):
        with self.lock:
            self.d[k] = v if isinstance(v, bytes) else v.encode()

    def check(self, keys):
        with self.lock:
            return all(k in self.d for k in keys)

    def get(self, k, timeout=None):
        self.wait([k], timeout)
        with self.lock:
            return self.d[k]

    def wait(self, keys, timeout=None):
        end = time.monotonic() + (timeout if timeout is not None else 60)
        while not self.check(keys):
            if time.monotonic() > end:
                raise minidist.DistTimeoutError("store: keys not set")
            time.sleep(0.005)

    def add(self, k, amount=1):
        with self.lock:
            v = int(self.d.get(k, b"0")) + amount
            self.d[k] = str(v).encode()
            return v

    def delete_key(self, k):
        with self.lock:
            return self.d.pop(k, None) is not None


def members(store, ranks, deadline_s=10.0):
    names = Ordinals().next(group_key(5, ranks, 0))
    return [Exchange(store, names, ranks, i, time.monotonic() + deadline_s, "t")
            for i in range(len(ranks))]


def rec(rank):
    return DeviceRecord(rank=rank, uuid=f"GPU-{rank}", nccl="2.21.5", binding="ctypes")


def in_threads(fns):
    out, errors = [None] * len(fns), []

    def run(i):
        try:
            out[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    return out, errors


def test_records_uid_and_clean_up():
    store = DictStore()
    ranks = (10, 11, 12)
    exs = members(store, ranks)

    def member(i):
        ex = exs[i]
        ex.publish(rec(ranks[i]))
        records = ex.gather(rec(ranks[i]))
        uid = ex.share_uid(lambda: b"u" * 128)
        ex.finish()
        return [r.rank for r in records], uid

    out, errors = in_threads([lambda i=i: member(i) for i in range(3)])
    assert not errors, errors
    assert all(o == ([10, 11, 12], b"u" * 128) for o in out)
    assert store.d == {}  # the last member removed every key


def test_a_declared_host_rank_stands_in_without_publishing():
    store = DictStore()
    store.set(host_declaration(11), b"1")
    exs = members(store, (10, 11, 12))
    out, errors = in_threads([
        lambda: (exs[0].publish(rec(10)), exs[0].gather(rec(10)))[1],
        lambda: (exs[2].publish(rec(12)), exs[2].gather(rec(12)))[1]])
    assert not errors
    for records in out:
        assert [r.kind for r in records] == ["cuda", "host", "cuda"]
    assert exs[0].participants == 2


def test_a_missing_member_is_named_at_the_deadline():
    store = DictStore()
    ex = members(store, (0, 1, 2), deadline_s=0.5)[0]
    ex.publish(rec(0))
    t0 = time.monotonic()
    with pytest.raises(minidist.DistTimeoutError) as info:
        ex.gather(rec(0))
    assert info.value.missing == (1, 2)
    assert 0.4 < time.monotonic() - t0 < 5


def test_a_members_failure_ends_the_others_waits():
    store = DictStore()
    exs = members(store, (0, 1))
    exs[0].fail("no GPU memory")
    with pytest.raises(SetupFailed, match="global rank 0: no GPU memory"):
        exs[1].share_uid(lambda: b"x" * 128)
    with pytest.raises(SetupFailed):
        exs[1].gather(rec(1))
