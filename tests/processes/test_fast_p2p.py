"""Point-to-point messages through the shared-memory inboxes (minidist.shm.p2p)."""

from __future__ import annotations

import glob
import os

import pytest

from minidist import segments
from minidist.shm import fast_slots

from .harness import SCRIPTS, Job

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not (fast_slots.available() and segments.available()),
                       reason="the fast path needs Linux on x86-64 and /dev/shm"),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_messages_are_exact_whichever_way_they_go(seed):
    """Ping-pong across the size limit, tags received out of order (the ring fills and
    the rest goes through the socket), every kind of receive on one tag, two senders,
    objects, a message that does not fit, a strided buffer."""
    with Job(3, SCRIPTS / "fast_p2p_stress.py", str(seed)) as job:
        rc = job.wait(100)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert "FAST P2P OK" in job.out


def test_sends_like_the_last_one_stay_exact_on_every_group_tag_and_way():
    """Sends planned once (minidist.shm.p2p's send_again) beside planned ones: another
    group with the same receiver and tag, other dtypes and shapes, strided arrays,
    objects, receives in another order, and an inbox closed by a receive on the loop."""
    with Job(3, SCRIPTS / "repeat_sends.py") as job:
        rc = job.wait(100)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert "REPEAT SENDS OK" in job.out


def test_receives_like_the_last_one_stay_exact_and_leave_every_other_case_alone():
    """Receives planned once (minidist.shm.takes) in an RL loop on a crowded node, and
    beside them another group's message first, a message of another dtype or shape,
    a timeout, an inbox closed by a receive on the loop, receives from any rank."""
    with Job(9, SCRIPTS / "repeat_recvs.py", "loop") as job:
        rc = job.wait(100)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert "REPEAT RECVS OK" in job.out


@pytest.mark.parametrize("what", ["kill", "leave"])
def test_a_sender_killed_or_leaving_fails_every_remembered_receive_within_seconds(what):
    with Job(9, SCRIPTS / "repeat_recvs.py", what) as job:
        job.wait(90)
    lost = [line for line in job.out.splitlines() if "LOST" in line]
    assert len(lost) == 8, job.out[-2000:] + job.err[-2000:]
    want = f"LOST [0] left={what == 'leave'} "
    assert all(want in line and float(line.split()[-1]) < 10 for line in lost), \
        "\n".join(lost)


def test_remembered_receives_stay_exact_while_their_sender_is_stopped():
    with Job(9, SCRIPTS / "repeat_recvs.py", "stop") as job:
        rc = job.wait(100)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert "STOPPED OK" in job.out


def test_a_killed_sender_fails_the_waiting_receive_within_seconds():
    with Job(2, SCRIPTS / "fast_p2p_fail.py", "kill") as job:
        job.wait(90)
    lost = [line for line in job.out.splitlines() if "LOST" in line]
    assert len(lost) == 1, job.out[-2000:] + job.err[-2000:]
    assert "LOST [1]" in lost[0] and float(lost[0].split()[-1]) < 30


def test_messages_sent_before_leaving_are_received_then_the_receive_fails():
    with Job(2, SCRIPTS / "fast_p2p_fail.py", "leave") as job:
        job.wait(90)
    left = [line for line in job.out.splitlines() if "LEFT" in line]
    assert len(left) == 1, job.out[-2000:] + job.err[-2000:]
    assert "LEFT [1] True" in left[0] and float(left[0].split()[-1]) < 30


@pytest.mark.parametrize("what", ["leave_large", "kill_large", "stopped_large"])
def test_large_messages_outlive_their_sender_or_fail_their_receive(what):
    """Messages waiting in the stash of a sender that leaves are taken by the receiver's
    loop first; those of a killed sender are read from its stash; one nobody could take
    in time fails its receive. Then the next receive fails: nothing waits for ever."""
    with Job(2, SCRIPTS / "fast_p2p_fail.py", what) as job:
        job.wait(90)
    lost = [line for line in job.out.splitlines() if "LOST LARGE" in line]
    assert len(lost) == 1, job.out[-2000:] + job.err[-2000:]
    seconds = float(lost[0].split("LOST LARGE [1] ")[1].split()[0])
    assert seconds < 30, lost
    if what == "stopped_large":
        assert "left before its 1048576-byte message was taken" in lost[0]


def test_a_receive_times_out_and_gives_its_number_back():
    with Job(2, SCRIPTS / "fast_p2p_fail.py", "silent") as job:
        rc = job.wait(90)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    timeout = [line for line in job.out.splitlines() if "TIMEOUT" in line]
    assert len(timeout) == 1, job.out
    assert 1.9 <= float(timeout[0].split("TIMEOUT")[1].split()[0]) < 10, job.out
    assert "no matching send" in timeout[0]
    assert "LATER 7" in job.out


def test_no_inbox_is_left_after_a_job():
    before = set(glob.glob(os.path.join(segments.SHM_DIR, "minidist-*")))
    with Job(3, SCRIPTS / "fast_p2p_stress.py", "5") as job:
        rc = job.wait(100)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert set(glob.glob(os.path.join(segments.SHM_DIR, "minidist-*"))) <= before
    assert "removed shared memory" not in job.err  # each rank removed its own inbox


def test_a_sender_finds_an_inbox_made_after_its_first_send():
    """Rank 0 makes its inbox at its first blocking receive, after rank 1's first send
    (taken on the loop); rank 1's sends 10 ms later go through the ring (a sender looks
    for a missing inbox again after 1 ms, then 2, 4, ... up to 50 ms; after a fixed 50
    ms none of them did), and every value arrives."""
    with Job(2, SCRIPTS / "inbox_late.py") as job:
        rc = job.wait(60)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    ring = int(job.out.split("INBOX LATE OK ")[1].split()[0])
    assert ring >= 19, job.out[-2000:]
