"""A stranger on the node (run as another local user, standard library only).

It binds the abstract Unix address of a rank that was killed and answers every
connection there with a made-up challenge and an "OK" ack, counting what the connector
sends: a connector that goes on sending after that ack has completed a handshake with a
stranger, and every ``b"MD" + version 1`` in the bytes received after the challenge is a
data-frame header. It also opens connections to the live ranks' addresses and sends them
junk. At the end it prints ``SUMMARY {json}``.

Parameters (JSON, first argument): ``key`` (the job key), ``victim``, ``live`` (ranks),
``duration`` (seconds; SIGTERM ends it sooner), ``junk_per_rank``, ``junk_pause``
(seconds between junk connections).
"""

import json
import os
import signal
import socket
import struct
import sys
import threading
import time

P = json.loads(sys.argv[1])
CHALLENGE = b"MDHS" + bytes([1, 2, 0, 0]) + os.urandom(16)  # version 1, role PEER
ACK_OK = b"MDHS" + bytes([1, 0, 0, 0])  # version 1, status OK
FRAME = b"MD\x01"
stats = {"bound": False, "connections": 0, "hellos": 0, "handshakes": 0, "frames": 0,
         "bytes_after_challenge": 0, "bytes_after_ack": 0, "junk_attempts": 0,
         "junk_connected": 0, "junk_refused": 0}
lock = threading.Lock()
stop = threading.Event()  # SIGTERM: wrap up and print the summary


def address(rank):
    return f"\0minidist-{P['key']}-r{rank}".encode()


def add(**kw):
    with lock:
        for k, v in kw.items():
            stats[k] += v


def read_for(conn, seconds, want=None):
    """Bytes read until EOF, ``seconds`` pass, or ``want`` bytes arrived; and a count
    of frame headers in them (headers split across reads are counted too)."""
    got = bytearray()
    end = time.monotonic() + seconds
    while time.monotonic() < end and (want is None or len(got) < want):
        try:
            b = conn.recv(1 << 16)
        except TimeoutError:
            continue
        except OSError:
            break
        if not b:
            break
        got += b
        if len(got) > (1 << 20):  # keep memory bounded: count and keep the tail
            add(frames=bytes(got[:-2]).count(FRAME), bytes_after_challenge=len(got) - 2)
            got = got[-2:]
    return got


def serve(conn):
    add(connections=1)
    conn.settimeout(0.2)
    try:
        conn.sendall(CHALLENGE)
        pre = read_for(conn, 3.0, want=48)
        if pre.startswith(b"MDHS"):
            add(hellos=1)
        try:
            conn.sendall(ACK_OK)
        except OSError:
            pass
        post = read_for(conn, 5.0)
        add(bytes_after_ack=len(post), handshakes=1 if post else 0)
        data = bytes(pre) + bytes(post)
        add(frames=data.count(FRAME), bytes_after_challenge=len(data))
    finally:
        conn.close()


def squat(deadline):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    while True:
        try:
            s.bind(address(P["victim"]))
            break
        except OSError:
            if time.monotonic() > deadline:
                print("SUMMARY " + json.dumps(stats), flush=True)
                sys.exit(2)
            time.sleep(0.01)
    s.listen(64)
    s.settimeout(0.2)
    stats["bound"] = True
    print("BOUND", flush=True)
    return s


JUNK = [
    lambda r: os.urandom(48),
    lambda r: b"MDHS" + bytes([1, 2, 0, 0]) + struct.pack("<ii", P["victim"], r) + os.urandom(32),
    lambda r: b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    lambda r: struct.pack("<2sBBBBBBQQiiIIQQQ", b"MD", 1, 2, 11, 0, 0, 0, 0, 5, P["victim"],
                          -1, 0, 0, 1, 4, 0) + b"\0\0\0\0",
    lambda r: b"\x00" * 100,
    lambda r: b"MDHS" * 50,
]


def junk(end):
    pause = P.get("junk_pause", 0.03)
    k = 0
    for _ in range(P["junk_per_rank"]):
        for r in P["live"]:
            if time.monotonic() > end or stop.is_set():
                return
            add(junk_attempts=1)
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.settimeout(0.3)
            try:
                c.connect(address(r))
                add(junk_connected=1)
                try:
                    c.recv(64)  # a challenge, maybe
                except OSError:
                    pass
                c.sendall(JUNK[k % len(JUNK)](r))
                try:
                    c.recv(64)
                except OSError:
                    pass
            except OSError:
                add(junk_refused=1)  # the rank closed on us
            finally:
                c.close()
            k += 1
            time.sleep(pause)


def junk_then_say_so(end):
    junk(end)
    print("JUNKDONE", flush=True)


def main():
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    start = time.monotonic()
    end = start + P["duration"]
    listener = squat(start + 10.0)
    workers = [threading.Thread(target=junk_then_say_so, args=(end,), daemon=True)]
    workers[0].start()
    while time.monotonic() < end and not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        t = threading.Thread(target=serve, args=(conn,), daemon=True)
        t.start()
        workers.append(t)
    listener.close()
    for t in workers:
        t.join(timeout=10)
    print("SUMMARY " + json.dumps(stats), flush=True)


main()
