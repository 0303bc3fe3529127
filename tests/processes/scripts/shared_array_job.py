"""SharedArray in a job: ``basic`` (versions, views, waits, bad input, mismatch),
``kill`` (the publisher is killed while the others wait), ``stress SECONDS MIB`` (the
publisher as fast as it can while readers check every version they read), ``hosts
VERSIONS MIB`` (versions across nodes)."""

import os
import signal
import sys
import time

import numpy as np

import minidist

mode = sys.argv[1]
minidist.init(timeout=float(os.environ.get("JOB_TIMEOUT", "30")))
rank, n = minidist.get_rank(), minidist.get_world_size()
print(f"JOB {minidist.api.door().job}", flush=True)


def basic() -> None:
    shared = minidist.SharedArray("w", (3, 4), np.float32, src=0)
    view, v = shared.read()
    assert v == 0 and view.shape == (3, 4) and view.dtype == np.float32 and not view.any()
    assert not view.flags.writeable
    try:
        view[0, 0] = 1
        raise AssertionError("a view was writable")
    except ValueError:
        pass
    minidist.barrier()  # every rank saw version 0
    if rank == 0:
        try:
            shared.publish(np.ones((4, 3), np.float32))
            raise AssertionError("a wrong shape was published")
        except ValueError:
            pass
        try:
            shared.publish(np.ones((3, 4), np.float64))
            raise AssertionError("a wrong dtype was published")
        except TypeError:
            pass
        assert shared.latest == 0  # bad input changed nothing
        assert shared.publish(np.full((3, 4), 1, np.float32)) == 1
        assert shared.publish(np.full((3, 4), 2, np.float32)) == 2
    else:
        try:
            shared.publish(np.ones((3, 4), np.float32))
            raise AssertionError("a reader published")
        except minidist.DistError:
            pass
    assert shared.wait(2, timeout=20) >= 2
    view, v = shared.read()
    assert v == 2 and (view == 2).all(), (v, view)
    t, cpu = time.monotonic(), time.process_time()
    try:
        shared.wait(3, timeout=0.5)
        raise AssertionError("wait did not time out")
    except minidist.DistTimeoutError as e:
        assert 0.45 < time.monotonic() - t < 3, time.monotonic() - t
        assert "version 3" in str(e)
    cpu = time.process_time() - cpu
    assert cpu < 0.05, f"a wait of 0.5 s used {cpu:.3f} s of CPU"  # it sleeps
    minidist.barrier()
    if rank == 0:  # three more versions while every reader holds version 2's view
        for k in (3, 4, 5):
            shared.publish(np.full((3, 4), k, np.float32))
    minidist.barrier()
    assert (view == 2).all(), view  # a held view keeps its version
    view, v = shared.read()
    assert v == 5 and (view == 5).all()
    shared.close()
    try:
        shared.read()
        raise AssertionError("read after close")
    except minidist.DistError:
        pass
    # a different shape on one rank: every rank raises, naming it
    try:
        minidist.SharedArray("m", (4,) if rank != n - 1 else (5,), np.int64)
        raise AssertionError("a mismatch went unnoticed")
    except minidist.CollectiveMismatchError as e:
        assert f"rank {n - 1}" in str(e) and "(5,)" in str(e), e
    # a group that is not the world; src not its first rank
    g = minidist.new_group([1, 2]) if n >= 3 else None
    if g is not None and rank in (1, 2):
        s2 = minidist.SharedArray("g", 5, np.int32, src=2, group=g)
        if rank == 2:
            s2.publish(np.arange(5, dtype=np.int32))
        s2.wait(1, timeout=20)
        assert s2.read()[0].tolist() == [0, 1, 2, 3, 4]
        s2.close()
    print("SHARED BASIC OK", flush=True)


def kill() -> None:
    shared = minidist.SharedArray("w", 1 << 16, np.float32, src=0)
    if rank == 0:
        shared.publish(np.ones(1 << 16, np.float32))
    shared.wait(1, timeout=20)
    minidist.barrier()
    print("READY", flush=True)
    if rank == 0:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    t = time.monotonic()
    try:
        shared.wait(2, timeout=25)
    except minidist.PeerLostError as e:
        print(f"LOST ranks={','.join(map(str, e.ranks))} after={time.monotonic() - t:.2f} "
              f"msg={e}", flush=True)
        os._exit(3)
    os._exit(1)


def stress(seconds: float, mib: float) -> None:
    count = int(mib * (1 << 20)) // 8
    shared = minidist.SharedArray("s", count, np.int64, src=0)
    minidist.barrier()
    end = time.monotonic() + seconds
    if rank == 0:
        a = np.empty(count, np.int64)
        v = 0
        while time.monotonic() < end:
            a.fill(v + 1)
            v = shared.publish(a)
        print(f"PUBLISHED {v}", flush=True)
        minidist.barrier()
        shared.close()
        return
    torn = checked = last = 0
    while time.monotonic() < end:
        view, v = shared.read()
        if v == 0:
            continue
        if v < last:
            torn += 1  # versions never go back
        last = v
        # every element holds the version: a torn buffer would mix two
        if not (view[0] == v and (view == v).all()):
            torn += 1
        checked += 1
        if checked % 7 == 0:  # hold the view a while: it must not change
            time.sleep(0.001)
            if not (view == v).all():
                torn += 1
    shared.release()  # else the publisher waits for this reader to move on
    minidist.barrier()
    shared.close()
    print(f"CHECKED {checked} TORN {torn}", flush=True)


def hosts(versions: int, mib: float) -> None:
    count = int(mib * (1 << 20)) // 8
    shared = minidist.SharedArray("h", count, np.int64, src=0)
    minidist.barrier()
    print("READY", flush=True)
    gate = os.environ.get("MINIDIST_TEST_GATE")
    if gate and rank == 0:  # the test counts the network's bytes from here
        end = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < end:
            time.sleep(0.02)
    if rank == 0:  # longer than the job's timeout: a leader's receive must outwait it
        time.sleep(float(os.environ.get("FIRST_AFTER", "0")))
    for k in range(1, versions + 1):
        if rank == 0:
            shared.publish(np.full(count, k, np.int64))
        shared.wait(k, timeout=60)
        view, v = shared.read()
        assert v >= k and (view == v).all(), (v, k)
        minidist.barrier()
    minidist.barrier()
    shared.close()
    print(f"HOSTS OK node={minidist.get_node_rank()}", flush=True)


def reader_dies() -> None:
    """Two buffers; rank 1 holds version 1's view and is killed: the publisher, which
    needs that buffer for version 3, clears the dead reader's pin and goes on."""
    shared = minidist.SharedArray("r", 4096, np.int64, src=0, buffers=2)
    if rank == 0:
        shared.publish(np.full(4096, 1, np.int64))
    shared.wait(1, timeout=20)
    view, v = shared.read()  # every rank holds version 1
    minidist.barrier()
    if rank == 1:
        print("READY", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 2:
        shared.release()
    if rank == 0:
        shared.release()
        shared.publish(np.full(4096, 2, np.int64))  # into version 0's buffer
        t = time.monotonic()
        shared.publish(np.full(4096, 3, np.int64))  # version 1's buffer: rank 1's pin
        print(f"PUBLISHED 3 after={time.monotonic() - t:.2f}", flush=True)
    else:
        shared.wait(3, timeout=30)
        view, v = shared.read()
        assert v == 3 and (view == 3).all(), v
        print("READER OK", flush=True)
    os._exit(0)


def leader_dies() -> None:
    """Two hosts of three ranks: the second host's leader (rank 3) is killed; the
    learner publishes on to the first host, the second host's readers hear it."""
    shared = minidist.SharedArray("l", 1024, np.int64, src=0)
    if rank == 0:
        shared.publish(np.full(1024, 1, np.int64))
    shared.wait(1, timeout=20)
    minidist.barrier()
    print("READY", flush=True)
    if rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0:
        time.sleep(0.5)
        for k in (2, 3, 4):
            shared.publish(np.full(1024, k, np.int64))
            time.sleep(0.2)
        print(f"PUBLISHED {shared.latest}", flush=True)
    elif rank in (1, 2):
        shared.wait(4, timeout=20)
        assert (shared.read()[0] == 4).all()
        print("HOST0 OK", flush=True)
    else:
        try:
            shared.wait(2, timeout=20)
        except minidist.PeerLostError as e:
            print(f"LEADER LOST ranks={','.join(map(str, e.ranks))} msg={e}", flush=True)
    os._exit(0)


if mode == "basic":
    basic()
elif mode == "kill":
    kill()
elif mode == "stress":
    stress(float(sys.argv[2]), float(sys.argv[3]))
elif mode == "reader_dies":
    reader_dies()
elif mode == "leader_dies":
    leader_dies()
elif mode == "hosts":
    hosts(int(sys.argv[2]), float(sys.argv[3]))
minidist.destroy()
