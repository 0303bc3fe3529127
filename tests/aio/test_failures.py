"""Failures seen from inside one loop: departures, broken groups, late frames, and the
handshake refusing a stranger. Every wait here is bounded far below the job timeout, so
a test that waits out the timeout fails instead of passing slowly."""

import asyncio
import logging
import os
import socket

import numpy as np
import pytest

import minidist
from minidist import wire
from minidist.errors import ProtocolError
from minidist.ops import ReduceOp
from minidist.transport.mailbox import Mailbox
from minidist.transport.reader import FrameReader
from minidist.transport.sockets import (
    HandshakeFailures,
    accept_handshake,
    connect_handshake,
    recv_exactly,
    send_all,
)

from ..conftest import start_job, stop_job

JOB_TIMEOUT = 60.0  # what a call would wait if nothing told it about a failure


async def elapsed(coro, limit: float):
    """(result or exception, seconds): AssertionError if it takes ``limit`` or more."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        async with asyncio.timeout(limit):
            result = await coro
    except TimeoutError as e:
        if not isinstance(e, minidist.DistError):
            raise AssertionError(f"still waiting after {limit} s") from None
        result = e
    except minidist.DistError as e:
        result = e
    return result, loop.time() - t0


async def test_a_rank_that_leaves_is_reported_to_a_rank_waiting_on_it():
    """No connection between the two ranks exists: only the rendezvous can tell."""
    sessions = await start_job(3, timeout=JOB_TIMEOUT)
    try:
        waiting = asyncio.ensure_future(sessions[2].recv(
            sessions[2].plan.prepare_recv(np.empty(4), 1, 0, None)))
        await asyncio.sleep(0.1)
        await sessions[1].close(graceful=True)  # destroy(): a normal departure
        err, took = await elapsed(waiting, 10)
        assert isinstance(err, minidist.PeerLostError), err
        assert err.ranks == (1,) and err.left, err
        assert "left" in str(err)
        # a departure is not an error for ranks that do not wait on it
        buf = np.zeros(3)
        await asyncio.gather(
            sessions[0].send(sessions[0].plan.prepare_send(np.arange(3.0), 2, 5, None)),
            sessions[2].recv(sessions[2].plan.prepare_recv(buf, 0, 5, None)))
        assert (buf == np.arange(3.0)).all()
        # and nobody connects to a departed rank again
        with pytest.raises(minidist.PeerLostError, match="left"):
            await sessions[0].send(sessions[0].plan.prepare_send(np.ones(2), 1, 0, None))
    finally:
        await stop_job([sessions[0], sessions[2]])


async def test_what_a_departed_rank_sent_before_leaving_is_still_received():
    sessions = await start_job(2, timeout=JOB_TIMEOUT)
    try:
        await sessions[1].send(sessions[1].plan.prepare_send(np.arange(5.0), 0, 0, None))
        await sessions[1].close(graceful=True)
        await asyncio.sleep(0.3)  # the departure is known by now
        buf = np.zeros(5)
        await sessions[0].recv(sessions[0].plan.prepare_recv(buf, 1, 0, None))
        assert (buf == np.arange(5.0)).all()
        with pytest.raises(minidist.PeerLostError):
            await sessions[0].recv(sessions[0].plan.prepare_recv(buf, 1, 0, None))
    finally:
        await stop_job(sessions[:1])


async def test_after_a_timeout_every_later_call_on_the_group_raises_at_once():
    sessions = await start_job(3, timeout=1.0)
    try:
        arrays = [np.ones(4) for _ in sessions]
        preps = [s.plan.prepare_all_reduce(a, ReduceOp.SUM, None, None)
                 for s, a in zip(sessions[:2], arrays)]
        results = await asyncio.gather(*(s.execute(p) for s, p in zip(sessions, preps)),
                                       return_exceptions=True)
        assert all(isinstance(r, minidist.DistTimeoutError) for r in results), results
        # the late rank arrives: its call fails at once, as does every later call
        late, took = await elapsed(sessions[2].execute(
            sessions[2].plan.prepare_all_reduce(arrays[2], ReduceOp.SUM, None, None)), 5)
        assert isinstance(late, minidist.DistTimeoutError), late
        assert took < 0.9
        for s, a in zip(sessions, arrays):
            err, took = await elapsed(s.execute(s.plan.prepare_all_reduce(a, ReduceOp.SUM, None,
                                                                     None)), 5)
            assert isinstance(err, minidist.DistTimeoutError) and took < 0.5, (err, took)
            assert "unusable" in str(err) and "timed out" in str(err)
        # other groups are not affected
        g = [s.plan.new_group([0, 1, 2]) for s in sessions]
        xs = [np.full(3, s.rank, np.int64) for s in sessions]
        await asyncio.gather(*(s.execute(s.plan.prepare_all_reduce(x, ReduceOp.SUM, gg, None))
                               for s, x, gg in zip(sessions, xs, g)))
        assert all((x == 3).all() for x in xs)
    finally:
        await stop_job(sessions)


@pytest.mark.parametrize("kind", ["broadcast", "scatter"])
async def test_a_root_disagreement_with_no_receiver_raises_on_the_next_call(kind):
    """Each rank thinks it is the root: each only sends and returns. The frame that
    arrives for the finished call is checked, and the group breaks on both ranks."""
    sessions = await start_job(2, timeout=JOB_TIMEOUT)
    try:
        preps = []
        for s in sessions:
            x = np.arange(4, dtype=np.float32)
            if kind == "broadcast":
                preps.append(s.plan.prepare_broadcast(x, s.rank, None, None))
            else:
                preps.append(s.plan.prepare_scatter(np.empty(2, np.float32), x, s.rank, None, None))
        await asyncio.gather(*(s.execute(p) for s, p in zip(sessions, preps)),
                             return_exceptions=True)
        await asyncio.sleep(0.2)
        for s in sessions:
            err, _ = await elapsed(s.execute(s.plan.prepare_barrier(None)), 5)
            assert isinstance(err, minidist.CollectiveMismatchError), err
            assert "root=0" in str(err) and "root=1" in str(err)
            assert "algorithm#" not in str(err)
    finally:
        await stop_job(sessions)


async def test_a_read_only_array_can_be_the_broadcast_source(job):
    src = np.arange(10.0)
    src.flags.writeable = False
    outs = [src if s.rank == 1 else np.zeros(10) for s in job]
    await asyncio.gather(*(s.execute(s.plan.prepare_broadcast(o, 1, None, None))
                           for s, o in zip(job, outs)))
    for o in outs:
        assert (o == np.arange(10.0)).all()
    with pytest.raises(ValueError, match="read-only"):  # a receiver still needs to write
        job[0].plan.prepare_broadcast(src, 1, None, None)


async def test_an_empty_mismatched_frame_is_dropped_without_error():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    closed = []
    mb = Mailbox()
    reader = FrameReader(b, 1, mb, closed.append)
    try:
        h = wire.Header(wire.Kind.ALL_REDUCE, 10, 0, 0, 0, 0, 1, -1, 0, 0, 1, 0)
        fut = mb.post((1, 0, 0, 0, False), memoryview(bytearray(4)),
                      lambda got: minidist.CollectiveMismatchError("no"))
        good = wire.Header(wire.Kind.ALL_REDUCE, 10, 0, 0, 0, 1, 1, -1, 0, 0, 1, 4)
        await send_all(a, [wire.encode_header(h), wire.encode_header(good), b"abcd"])
        with pytest.raises(minidist.CollectiveMismatchError):
            await asyncio.wait_for(fut, 5)
        await asyncio.sleep(0.05)
        assert closed == []  # the stream stays in step
        got = mb.post((1, 0, 1, 0, False), memoryview(bytearray(4)), lambda h: None)
        assert (await asyncio.wait_for(got, 5)).nbytes == 4
    finally:
        reader.close()
        a.close()
        b.close()


async def test_an_acceptor_that_does_not_know_the_secret_is_refused():
    """A squatter on a dead rank's address answers 'OK' without the secret: the
    connector refuses it before sending anything but its hello."""
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    try:
        async def squatter():
            await send_all(b, [wire.encode_challenge(wire.Role.PEER, os.urandom(16))])
            await recv_exactly(b, wire.HELLO_SIZE)
            await send_all(b, [wire.encode_ack(wire.AckStatus.OK)])

        task = asyncio.ensure_future(squatter())
        with pytest.raises(ProtocolError, match="does not know the job secret"):
            await connect_handshake(a, b"secret", wire.Role.PEER, 0, 1, 5)
        await task
    finally:
        a.close()
        b.close()


async def test_both_ends_of_a_good_handshake_are_proved():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    try:
        hello, _ = (await asyncio.gather(
            accept_handshake(b, b"secret", wire.Role.PEER, wire.Role.PEER, 1, 5),
            connect_handshake(a, b"secret", wire.Role.PEER, 0, 1, 5)))[0]
        assert (hello.src, hello.dst) == (0, 1)
    finally:
        a.close()
        b.close()


def test_failed_handshakes_are_logged_at_most_once_a_minute(caplog):
    failures = HandshakeFailures()
    log = logging.getLogger("minidist.test")
    with caplog.at_level(logging.WARNING, logger="minidist.test"):
        for _ in range(500):
            failures.note(log, "rank 0", ProtocolError("junk"))
    assert failures.total == 500
    assert len(caplog.records) == 1


async def test_small_calls_that_disagree_raise_on_every_rank_through_shared_slots(job):
    arrays = [np.arange(4 if s.rank != 2 else 5, dtype=np.float32) for s in job]
    before = [a.copy() for a in arrays]
    preps = [s.plan.prepare_all_reduce(a, ReduceOp.SUM, None, None) for s, a in zip(job, arrays)]
    assert all(p.fast >= 0 for p in preps)  # the shared-slots path, not sockets
    results = await asyncio.wait_for(asyncio.gather(
        *(s.execute(p) for s, p in zip(job, preps)), return_exceptions=True), 20)
    for r in results:
        assert isinstance(r, minidist.CollectiveMismatchError), r
        assert "count=5" in str(r) and "count=4" in str(r)
    for a, b in zip(arrays, before):
        np.testing.assert_array_equal(a, b)


async def test_a_small_call_that_waits_out_its_deadline_names_the_missing_rank():
    sessions = await start_job(3, timeout=1.0)
    try:
        preps = [s.plan.prepare_barrier(None) for s in sessions[:2]]
        assert all(p.fast >= 0 for p in preps)
        results = await asyncio.wait_for(asyncio.gather(
            *(s.execute(p) for s, p in zip(sessions, preps)), return_exceptions=True), 20)
        for r in results:
            assert isinstance(r, minidist.DistTimeoutError), r
            assert r.missing == (2,), r
    finally:
        await stop_job(sessions)
