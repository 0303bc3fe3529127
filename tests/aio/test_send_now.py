"""Frames written from the caller's thread (Connection.send_now) beside frames written on
the loop: never interleaved, never half-written, nothing written when refused."""

import asyncio
import socket
import struct
import threading

import numpy as np

from minidist.transport.endpoint import SEND_NOW_MAX, Connection
from minidist.transport.sockets import recv_exactly

_HEAD = struct.Struct("<QQ")  # payload length, frame number


def frame(number: int, nbytes: int) -> tuple[bytes, memoryview]:
    payload = np.full(nbytes, number % 251, np.uint8)
    return _HEAD.pack(nbytes, number), memoryview(payload)


async def read_frames(sock: socket.socket, count: int) -> list[int]:
    """Read ``count`` frames; each must carry its own number in every byte."""
    numbers = []
    for _ in range(count):
        nbytes, number = _HEAD.unpack(await recv_exactly(sock, _HEAD.size))
        body = await recv_exactly(sock, nbytes)
        assert body == bytes([number % 251]) * nbytes, f"frame {number} is mangled"
        numbers.append(number)
    return numbers


def pair(family=socket.AF_UNIX) -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(family)
    a.setblocking(False)
    b.setblocking(False)
    return a, b


async def test_frames_from_a_thread_and_the_loop_never_interleave():
    loop = asyncio.get_running_loop()
    a, b = pair()
    conn = Connection(a, peer=1)
    small, large = 3000, 40
    written: list[int] = []
    stop = threading.Event()  # set when the test ends, however it ends

    def caller_thread() -> None:
        n = 0
        while n < small and not stop.is_set():
            if conn.send_now(loop, *frame(2 * n, 1000)):
                written.append(2 * n)
                n += 1

    async def loop_sends() -> None:
        for i in range(large):
            await conn.send(*frame(2 * i + 1, 200_000))

    t = threading.Thread(target=caller_thread, daemon=True)
    try:
        t.start()
        got, _ = await asyncio.wait_for(asyncio.gather(
            read_frames(b, small + large), loop_sends()), 60)
        await asyncio.to_thread(t.join, 10)
        assert not t.is_alive()
        # every frame arrives whole; each writer's frames keep their order
        assert [n for n in got if n % 2 == 0] == written
        assert [n for n in got if n % 2] == [2 * i + 1 for i in range(large)]
    finally:
        stop.set()
        conn.close()
        b.close()


async def test_refused_frames_write_nothing():
    loop = asyncio.get_running_loop()
    a, b = pair()
    conn = Connection(a, peer=1)
    try:
        assert not conn.send_now(loop, *frame(1, SEND_NOW_MAX))  # too large
        with conn._writing:  # another thread is writing a frame
            assert not conn.send_now(loop, *frame(2, 10))
        while True:  # fill the socket until it takes no more
            try:
                a.send(b"\0" * 65536)
            except BlockingIOError:
                break
        assert not conn.send_now(loop, *frame(3, 100))
        queued = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        drained = 0
        while True:
            try:
                chunk = b.recv(1 << 20)
            except BlockingIOError:
                break
            assert set(chunk) <= {0}, "a refused frame left bytes behind"
            drained += len(chunk)
        assert drained > 0 and queued > 0
        assert conn.send_now(loop, *frame(4, 100))
        assert await read_frames(b, 1) == [4]
    finally:
        conn.close()
        b.close()


async def test_a_partly_written_frame_is_finished_on_the_loop():
    # TCP may take part of a frame: the loop must write the rest before any other frame
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
    listener.close()
    for s in (a, b):
        s.setblocking(False)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn = Connection(a, peer=1)
    try:
        partial = False
        for number in range(2000):
            head, body = frame(number, 500 + number * 997 % 3500)
            if not conn.send_now(loop, head, body):
                break
            if conn._writing.locked():  # held until the loop has written the rest
                partial = True
                break
        sent = number + 1 if partial else number
        # a loop-side frame queued behind the partial one
        after = asyncio.ensure_future(conn.send(*frame(99_999, 10)))
        got = await asyncio.wait_for(read_frames(b, sent + 1), 30)
        await after
        assert got == [*range(sent), 99_999]
        assert partial, "the kernel never took part of a frame; nothing was tested"
    finally:
        conn.close()
        b.close()
