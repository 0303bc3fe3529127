"""minidist.SharedArray across processes: versions, views, waits, mismatches, a killed
publisher, a torn-version stress test; never a /dev/shm name left behind."""

from __future__ import annotations

import os

import pytest

from .harness import ROOT, SCRIPTS, Job

SCRIPT = SCRIPTS / "shared_array_job.py"
pytestmark = pytest.mark.timeout(120)


def job_key(out: str) -> str:
    keys = {line.split("JOB ")[1] for line in out.splitlines() if "JOB " in line}
    assert len(keys) == 1, out
    return keys.pop()


def leftovers(key: str) -> list[str]:
    return [f for f in os.listdir("/dev/shm") if key in f]


def test_versions_views_waits_and_a_mismatch_on_every_rank():
    with Job(3, SCRIPT, "basic") as job:
        rc = job.wait(90)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert job.out.count("SHARED BASIC OK") == 3
    assert not leftovers(job_key(job.out))


def test_a_killed_publisher_is_reported_to_every_waiting_reader():
    with Job(4, SCRIPT, "kill") as job:
        rc = job.wait(90)
    assert rc != 0
    lost = [line for line in job.out.splitlines() if "LOST" in line]
    assert len(lost) == 3, job.out[-3000:] + job.err[-3000:]
    for line in lost:
        assert "ranks=0 " in line and "publisher, rank 0" in line, line
        assert float(line.split("after=")[1].split()[0]) < 10, line
    assert not leftovers(job_key(job.out))


def test_a_killed_reader_does_not_hold_the_publisher_back():
    with Job(3, SCRIPT, "reader_dies") as job:
        job.wait(90)
    done = [line for line in job.out.splitlines() if "PUBLISHED 3" in line]
    assert done and float(done[0].split("after=")[1]) < 10, job.out[-3000:] + job.err[-3000:]
    assert "READER OK" in job.out, job.out[-3000:]
    assert not leftovers(job_key(job.out))


def test_no_torn_version_while_the_publisher_runs_flat_out():
    with Job(4, SCRIPT, "stress", "4", "1") as job:
        rc = job.wait(90)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    published = int(job.out.split("PUBLISHED ")[1].split()[0])
    checks = [line.split("CHECKED ")[1].split() for line in job.out.splitlines()
              if "CHECKED" in line]
    assert len(checks) == 3 and published > 100, job.out
    for checked, _, torn in checks:
        assert int(checked) > 100 and int(torn) == 0, job.out
    assert not leftovers(job_key(job.out))


def test_the_rl_weights_example():
    with Job(4, ROOT / "examples" / "rl_weights.py", "6") as job:
        rc = job.wait(90)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert "published version 7" in job.out and "learner done" in job.out, job.out
