"""The chaos harness itself: its parsing, and the squatter's counting (a naive rank that
trusts any acceptor must show up as a completed handshake and data frames)."""

from __future__ import annotations

import json
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from .scenarios import SCRIPTS, internal_numbers, parse

pytestmark = pytest.mark.timeout(60)


def test_result_lines_parse():
    d = parse('[rank2]: RESULT rank=2 kind=PeerLostError dist=True ranks=[1,3] left=False '
              'missing=[] t=12.5000 phase=first msg="rank 1 died (x=1)"')
    assert d == {"tag": "RESULT", "rank": 2, "kind": "PeerLostError", "dist": True,
                 "ranks": [1, 3], "left": False, "missing": [], "t": 12.5, "phase": "first",
                 "msg": "rank 1 died (x=1)"}
    assert parse("[rank0]: some warning") is None


def test_internal_numbers_in_messages_are_found():
    assert internal_numbers("tag 2147483649 from rank 3") == ["2147483649"]
    assert internal_numbers("algorithm#2 where rank 1 called ring") == ["algorithm#"]
    assert internal_numbers("rank 1 called all_reduce(count=4194304)") == []


def test_the_squatter_counts_a_naive_ranks_handshake_and_frames():
    key = secrets.token_hex(10)
    args = {"key": key, "victim": 0, "live": [], "duration": 20, "junk_per_rank": 0}
    sq = subprocess.Popen([sys.executable, "-I", str(SCRIPTS / "squatter.py"),
                           json.dumps(args)], stdout=subprocess.PIPE, text=True,
                          start_new_session=True)
    try:
        assert sq.stdout.readline().strip() == "BOUND"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.settimeout(5)
            c.connect(f"\0minidist-{key}-r0".encode())
            challenge = c.recv(24)
            assert challenge[:4] == b"MDHS"
            c.sendall(b"MDHS" + bytes([1, 2, 0, 0]) + struct.pack("<ii", 1, 0) + bytes(32))
            assert c.recv(8) == b"MDHS\x01\x00\x00\x00"  # "OK"
            header = struct.pack("<2sBBBBBBQQiiIIQQQ", b"MD", 1, 2, 11, 0, 0, 0, 0, 7, 1,
                                 -1, 0, 0, 1, 4, 0)
            c.sendall(header + b"\0\0\x80?" + header + b"\0\0\x80?")
        time.sleep(0.5)
        sq.send_signal(signal.SIGTERM)
        out, _ = sq.communicate(timeout=20)
    finally:
        sq.kill()
        sq.wait()
    summary = json.loads(next(ln for ln in out.splitlines()
                              if ln.startswith("SUMMARY "))[8:])
    assert summary["connections"] == 1 and summary["hellos"] == 1
    assert summary["handshakes"] == 1 and summary["frames"] == 2
