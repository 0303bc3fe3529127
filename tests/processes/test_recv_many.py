"""minidist.recv_many: the first k messages to arrive, whole, in each sender's order."""

from __future__ import annotations

import pytest

from .harness import SCRIPTS, Job

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("n", [2, 5])
def test_first_k_takes_every_message_once_in_each_senders_order(n):
    """Through the inbox and through sockets (full rings), blocking, async and from a
    subset, past messages of another tag."""
    with Job(n, SCRIPTS / "many_job.py", "exact") as job:
        rc = job.wait(150)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert "MANY OK" in job.out


@pytest.mark.parametrize("what", ["kill", "exit"])
def test_a_sender_that_dies_or_leaves_is_named(what):
    with Job(4, SCRIPTS / "many_job.py", what) as job:
        job.wait(150)
    lost = [line for line in job.out.splitlines() if "LOST" in line]
    assert len(lost) == 1, job.out[-2000:] + job.err[-2000:]
    assert f"LOST [2] left={what == 'exit'}" in lost[0], lost
    assert float(lost[0].split()[-1]) < 30, lost


def test_a_message_that_does_not_fit_is_named_and_the_others_wait():
    with Job(4, SCRIPTS / "many_job.py", "mismatch") as job:
        rc = job.wait(150)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert "MISMATCH named=True" in job.out and "MANY OK" in job.out
