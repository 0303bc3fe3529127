"""The shared-memory inbox of point-to-point messages, byte by byte, in one process."""

import os
import secrets
import subprocess

import numpy as np
import pytest

from minidist import segments, wire
from minidist.shm import inbox
from minidist.shm.inbox import MESSAGE_BYTES, RING_SLOTS, Inbox, Outbox, Stash

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
    if out.core is not None:  # the pure core's put: its fence is where the race is staged
        out.core.release()
        out.core = None
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
    assert payload is None  # read as a stash's record: no stash of pid 0, nothing read
    out.close()


@pytest.fixture
def stashed(box):
    """An inbox (rank 2 of 3), rank 1's outbox to it, and rank 1's stash of 1 MiB."""
    job, b = box
    out = Outbox.attach(job, 2, 3, 1)
    stash = Stash(job, 1, size=1 << 20)
    b.set_open(True)
    try:
        yield b, out, stash
    finally:
        out.close()
        stash.close()
    assert not os.path.exists(os.path.join(segments.SHM_DIR, stash.name))


def _send_large(out, stash, seq: int, payload: np.ndarray, dst: int = 2) -> int:
    desc = stash.put(payload.view(np.uint8), dst)
    if desc is None:
        return 0
    return out.put(_header(1, seq, payload.nbytes), memoryview(desc))


def test_a_large_message_waits_in_the_stash_and_its_block_is_freed_once_taken(stashed):
    b, out, stash = stashed
    for seq, nbytes in enumerate([MESSAGE_BYTES + 1, 100_000, 500_000, 1_000_000]):
        payload = np.random.default_rng(seq).integers(0, 255, nbytes, dtype=np.uint8)
        assert _send_large(out, stash, seq, payload) == 1
        assert stash.outstanding() == [2]
        into = np.zeros(nbytes, np.uint8) if seq % 2 else None
        raw, got = b.take(1, into)
        assert wire.decode_header(raw).nbytes == nbytes
        assert got.tobytes() == payload.tobytes()
        if into is not None:
            assert got is into  # copied straight into the receive's buffer
        else:
            assert not np.shares_memory(got, stash.mem)
        assert stash.outstanding() == []  # the receiver stored DONE after its copy
        assert stash.blocks == type(stash.blocks)()


def test_stash_blocks_wrap_around_and_a_full_stash_takes_nothing(stashed):
    b, out, stash = stashed
    nbytes = 300_000  # three fit in 1 MiB, a fourth does not
    data = [np.full(nbytes, k, np.uint8) for k in range(8)]
    assert [_send_large(out, stash, k, data[k]) for k in range(4)] == [1, 1, 1, 0]
    assert len(stash.blocks) == 3  # the fourth changed nothing
    assert stash.outstanding() == [2, 2, 2]
    for k in range(3, 8):  # take the oldest, put the next: the blocks go around
        raw, got = b.take(1)
        assert (got == k - 3).all() and wire.decode_header(raw).seq == k - 3
        assert _send_large(out, stash, k, data[k]) == 1
    firsts = [at for at, _, _ in stash.blocks]
    assert firsts != sorted(firsts)  # wrapped: a block after the end starts at the front
    for k in range(5, 8):
        assert (b.take(1)[1] == k).all()
    assert stash.outstanding() == []
    assert stash.put(data[0], 2) is not None  # all free: from the front again
    assert stash.blocks[0][0] == inbox.HEADER
    stash.unput()
    assert not stash.blocks


def test_a_stash_gone_before_it_was_mapped_loses_the_message_not_the_receiver(stashed):
    b, out, stash = stashed
    first, second = np.full(100_000, 1, np.uint8), np.full(100_000, 2, np.uint8)
    assert _send_large(out, stash, 0, first) == 1
    assert (b.take(1)[1] == 1).all()  # mapped now: stays readable after the unlink
    assert _send_large(out, stash, 1, second) == 1
    segments.unlink(stash.name)
    assert (b.take(1)[1] == 2).all()
    b._stashes.clear()  # as if never mapped: the name is gone, so is the message
    assert _send_large(out, stash, 2, first) == 1
    raw, got = b.take(1)
    assert got is None and wire.decode_header(raw).seq == 2
    assert b.take(1) is None


def test_a_descriptor_outside_the_stash_is_refused_without_reading(stashed):
    b, out, stash = stashed
    for offset, nbytes in [(1 << 20, 100_000), (inbox.HEADER + 8, 100_000),
                           (inbox.HEADER, (1 << 20) - 100)]:
        desc = inbox._DESC.pack(os.getpid(), offset, nbytes)
        assert out.put(_header(1, 0, nbytes), memoryview(desc)) == 1
        raw, got = b.take(1)
        assert got.nbytes == 0  # the receive's size check refuses it


def test_only_a_stash_of_this_user_alone_is_mapped(stashed):
    b, out, stash = stashed
    assert _send_large(out, stash, 0, np.ones(100_000, np.uint8)) == 1
    path = os.path.join(segments.SHM_DIR, stash.name)
    os.chmod(path, 0o644)
    assert b.take(1)[1] is None  # readable by others: not ours alone, never mapped
    os.chmod(path, 0o600)
    assert _send_large(out, stash, 1, np.ones(100_000, np.uint8)) == 1
    if os.geteuid() == 0:
        os.chown(path, 4321, 4321)
        assert b.take(1)[1] is None
        os.chown(path, 0, 0)
    else:
        b.take(1)


def test_a_default_stash_holds_a_message_of_16_mib_and_no_more():
    stash = Stash(secrets.token_hex(10), 1)
    try:
        assert stash.put(np.zeros((16 << 20) + 1, np.uint8), 2) is None
        assert stash.put(np.zeros(16 << 20, np.uint8), 2) is not None
    finally:
        stash.close()


def test_a_stash_takes_no_block_that_dev_shm_has_no_room_for(monkeypatch, capsys):
    """Its pages are reserved as blocks first need them: a block past what /dev/shm
    can give is refused (the message goes over the socket) instead of a page fault that
    would kill the process (SIGBUS), and the job hears of it once."""
    real = os.statvfs(segments.SHM_DIR)
    free = [64 << 20]

    class Shm:
        f_frsize = real.f_frsize
        f_blocks = (64 << 20) // real.f_frsize

        @property
        def f_bavail(self) -> int:
            return free[0] // real.f_frsize

    job = secrets.token_hex(10)
    monkeypatch.setattr(segments.os, "statvfs", lambda path: Shm())
    stash = Stash(job, 1)
    try:
        assert stash.reserved == inbox.STASH_STEP
        assert stash.put(np.ones(100 << 10, np.uint8), 2) is not None  # in the first step
        free[0] = 5 << 20  # others took the room
        assert stash.put(np.ones(4 << 20, np.uint8), 2) is None
        assert stash.reserved == inbox.STASH_STEP  # nothing more was taken
        assert "too small" in capsys.readouterr().err
        free[0] = 60 << 20
        assert stash.put(np.ones(4 << 20, np.uint8), 2) is not None
        assert stash.reserved >= 5 << 20
    finally:
        stash.close()
        segments.unlink(f"minidist-{job}{segments.WARNED}")
    assert not os.path.exists(os.path.join(segments.SHM_DIR, inbox.stash_name(job, 1,
                                                                               os.getpid())))


def _blocks(path: str) -> int:
    """Bytes of /dev/shm the file holds (its reserved pages)."""
    return os.stat(path).st_blocks * 512


@pytest.mark.parametrize("compiled", [True, False])
def test_an_inbox_holds_pages_for_what_is_sent_not_for_the_node(compiled):
    """A reader of 1024 rings reserves its header and 64 bytes a ring; a sender reserves
    its ring's records only as far as its messages reach, and a longer message grows
    them (on either core), arriving whole."""
    if compiled and inbox.core.compiled is None:
        pytest.skip("the compiled core is not built")
    job, rings = secrets.token_hex(10), 1024
    b = Inbox(job, 1, rings)
    path = os.path.join(segments.SHM_DIR, b.name)
    try:
        page = inbox.PAGE
        base = _blocks(path)
        assert base <= -(-(inbox.HEADER + rings * inbox.CTRL) // page) * page
        assert os.stat(path).st_size == inbox.inbox_bytes(rings)  # the rest is a hole
        out = Outbox.attach(job, 1, rings, 700)
        assert out is not None
        if not compiled:
            out.core = None
        attached = _blocks(path)
        assert attached - base <= RING_SLOTS * 2 * page  # a page of each record, at most
        b.set_open(True)
        small = np.arange(10, dtype=np.int32)
        assert out.put(_header(5, 0, small.nbytes), memoryview(small)) == 1
        assert _blocks(path) == attached
        assert b.take(700)[1].tobytes() == small.tobytes()
        large = np.arange(30_000 // 4, dtype=np.int32)  # 30 kB: more than a page
        for seq in range(1, 1 + RING_SLOTS):
            assert out.put(_header(5, seq, large.nbytes), memoryview(large)) == 1
            raw, got = b.take(700)
            assert wire.decode_header(raw).seq == seq and got.tobytes() == large.tobytes()
        grown = _blocks(path) - base
        assert RING_SLOTS * (inbox.HEADER + large.nbytes) <= grown <= RING_SLOTS * (
            inbox.HEADER + large.nbytes + 3 * page) * 2
        out.close()
    finally:
        b.close()
