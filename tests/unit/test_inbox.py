"""The shared-memory inbox of point-to-point messages, byte by byte, in one process."""

import os
import secrets
import subprocess

import numpy as np
import pytest

from minidist import inbox, segments, wire
from minidist.inbox import MESSAGE_BYTES, RING_SLOTS, Inbox, Outbox

pytestmark = pytest.mark.skipif(not segments.available(), reason="needs /dev/shm")


def _header(src: int, seq: int, nbytes: int) -> bytes:
    return wire.encode_header(wire.Header(wire.Kind.P2P, 3, 0, 0, 0x77, seq, src, -1, 5,
                                          9, nbytes // 4, nbytes, 0))


@pytest.fixture
def box():
    job = secrets.token_hex(10)
    b = Inbox(job, 2, 3)
    try:
        yield job, b
    finally:
        b.close()
    assert not os.path.exists(os.path.join(segments.SHM_DIR, b.name))


def test_records_arrive_whole_and_in_order_through_a_wrapping_ring(box):
    job, b = box
    out = Outbox.attach(job, 2, 3, 1)
    assert out is not None
    b.set_open(True)
    # start near the int32 wrap of the counters
    b.words[b._heads[1]] = b.words[b._tails[1]] = 0x7FFFFFFF - 2
    for seq in range(40):
        payload = np.arange(seq + 1, dtype=np.int32)
        assert out.put(_header(7, seq, payload.nbytes), memoryview(payload)) == 1
        assert b.waiting(1) and not b.waiting(0) and list(b.nonempty()) == [1]
        raw, got = b.take(1)
        h = wire.decode_header(raw)
        assert (h.src, h.seq, h.nbytes) == (7, seq, payload.nbytes)
        assert got.tobytes() == payload.tobytes()
        assert b.take(1) is None
    out.close()


def test_a_full_ring_or_a_closed_inbox_takes_nothing(box):
    job, b = box
    out = Outbox.attach(job, 2, 3, 0)
    one = np.ones(4, np.uint8)
    assert out.put(_header(1, 0, 4), memoryview(one)) == 0  # not open yet
    b.set_open(True)
    for seq in range(RING_SLOTS):
        assert out.put(_header(1, seq, 4), memoryview(one)) == 1
    assert out.put(_header(1, 9, 4), memoryview(one)) == 0  # full
    assert wire.decode_header(b.take(0)[0]).seq == 0
    assert out.put(_header(1, 4, 4), memoryview(one)) == 1  # a slot is free again
    b.set_open(False)
    assert out.put(_header(1, 5, 4), memoryview(one)) == 0
    assert [wire.decode_header(b.take(0)[0]).seq for _ in range(RING_SLOTS)] == [1, 2, 3, 4]
    out.close()


def test_a_writer_that_finds_the_inbox_closed_after_writing_says_so(box, monkeypatch):
    job, b = box
    out = Outbox.attach(job, 2, 3, 2)
    b.set_open(True)
    # the reader closes between the writer's store of TAIL and its fence
    monkeypatch.setattr(inbox, "fence", lambda: b.words.__setitem__(0, 0))
    assert out.put(_header(1, 0, 0), None) == 2
    monkeypatch.undo()
    assert not b.is_open and list(b.nonempty()) == [2]  # the record is there to drain
    assert out.put(_header(1, 1, 0), None) == 0
    assert wire.decode_header(b.take(2)[0]).seq == 0 and b.take(2) is None
    out.close()


def test_a_sleeping_reader_is_woken_and_the_bell_changes(box):
    job, b = box
    out = Outbox.attach(job, 2, 3, 0)
    b.set_open(True)
    seen = b.bell()
    b.will_sleep()
    assert out.put(_header(1, 0, 0), None) == 1
    assert b.bell() != seen  # the writer saw the flag: the bell moved, a sleep returns
    b.sleep(seen, 5.0)  # returns at once (the word differs), never waits 5 s
    seen = b.bell()
    assert out.put(_header(1, 1, 0), None) == 1
    assert b.bell() == seen  # nobody sleeps: no system call, no change
    b.ring_bell()
    assert b.bell() != seen
    out.close()


def test_only_an_inbox_of_this_user_alone_is_attached(box, tmp_path):
    job, b = box
    size = inbox.inbox_bytes(3)
    # a name that looks right but anyone may open, or of the wrong size, is refused
    fake = os.path.join(segments.SHM_DIR, inbox.inbox_name(job, 5, os.getpid()))  # alive
    fd = os.open(fake, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        os.fchmod(fd, 0o666)
        assert Outbox.attach(job, 5, 3, 0) is None
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, size + 4096)
        assert Outbox.attach(job, 5, 3, 0) is None
        os.ftruncate(fd, size)  # the right size but no magic: not an inbox
        assert Outbox.attach(job, 5, 3, 0) is None
        if os.geteuid() == 0:
            os.fchown(fd, 4321, 4321)  # another user's file
            os.fchmod(fd, 0o600)
            assert Outbox.attach(job, 5, 3, 0) is None
    finally:
        os.close(fd)
        os.unlink(fake)
    assert Outbox.attach(job, 3, 3, 0) is None  # nobody has created it
    assert Outbox.attach(job, 2, 4, 0) is None  # another layout of the node


def test_a_killed_process_inbox_is_never_attached_and_is_swept_by_its_successor():
    job = secrets.token_hex(10)
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid nobody has now
    stale = os.path.join(segments.SHM_DIR, inbox.inbox_name(job, 4, dead.pid))
    old = Inbox(job, 4, 2)
    os.rename(os.path.join(segments.SHM_DIR, old.name), stale)  # as if its creator died
    try:
        assert Outbox.attach(job, 4, 2, 0) is None  # whole, ours alone, but nobody reads it
        new = Inbox(job, 4, 2)  # this rank's next process
        try:
            assert not os.path.exists(stale)
            out = Outbox.attach(job, 4, 2, 1)
            assert out is not None and out.seg is not None
            new.set_open(True)
            assert out.put(_header(1, 0, 0), None) == 1 and new.waiting(1)
            out.close()
        finally:
            new.close()
    finally:
        old.name = os.path.basename(stale)
        old.close()


def test_a_payload_larger_than_a_record_is_never_read_past_its_slot(box):
    job, b = box
    out = Outbox.attach(job, 2, 3, 0)
    b.set_open(True)
    assert out.put(_header(1, 0, MESSAGE_BYTES + 64), None) == 1  # a lying header
    raw, payload = b.take(0)
    assert payload.nbytes == 0
    out.close()
