"""Keeping a job alive when ranks die: shrink_group, agree, --restart-failed, wait_ranks
and new_group with a restarted rank (each checked inside the job by the ranks)."""

from __future__ import annotations

import glob
import os
import re

import pytest

from minidist import segments
from minidist.transport import addresses

from .harness import SCRIPTS, Job, clean_env

pytestmark = pytest.mark.timeout(180)


def _job_env(secret: str) -> dict[str, str]:
    return clean_env(MINIDIST_SECRET=secret)


def _leftovers(secret: str) -> list[str]:
    job = addresses.job_key(secret.encode())
    return [p for p in glob.glob(os.path.join(segments.SHM_DIR, f"minidist-{job}-*"))
            if not p.endswith(segments.WARNED)]


def _lines(out: str, word: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\[[^\]]*\]|\S+)", line)) for line in out.splitlines()
            if f"{word} " in line]


@pytest.mark.parametrize("during", [False, True], ids=["after-kill", "death-during-shrink"])
def test_survivors_shrink_to_the_same_group(during):
    n = 6 if during else 5
    secret = f"elastic-shrink-{during}-{os.getpid()}"
    args = ("during",) if during else ()
    with Job(n, SCRIPTS / "elastic_shrink.py", *args, env=_job_env(secret),
             launcher_args=("--grace", "30")) as job:
        job.wait(90)
    got = _lines(job.out, "SHRUNK")
    survivors = n - 2 if during else n - 1
    assert len(got) == survivors, job.out + job.err[-3000:]
    expected = str(list(range(survivors)))
    for line in got:
        assert line["ranks"] == expected, line  # the dead ones left out, in order
        assert line["same"] == "True" and line["sum"] == "True", line
        assert line["default"] == "True", line  # the shrunk world is the default group
        assert line["grank"] == line["rank"], line
    assert len({line["epoch"] for line in got}) == 1
    assert "NO ERROR" not in job.out
    assert not _leftovers(secret)


def test_a_restarted_rank_rejoins_and_talks():
    secret = f"elastic-restart-{os.getpid()}"
    with Job(4, SCRIPTS / "elastic_restart.py", env=_job_env(secret),
             launcher_args=("--restart-failed", "2")) as job:
        rc = job.wait(90)
    assert rc == 0, job.out + job.err[-3000:]
    got = _lines(job.out, "REJOINED")
    assert len(got) == 4, job.out + job.err[-3000:]
    assert all(line["same"] == "True" and line["sum"] == "True" for line in got), got
    assert sorted(line["restarted"] for line in got) == ["0", "0", "0", "1"]
    assert len(_lines(job.out, "BACK")) == 3
    assert "starting it again (1 of 2)" in job.err
    assert not _leftovers(secret)


def test_without_restarts_a_dead_rank_still_stops_the_job():
    with Job(4, SCRIPTS / "elastic_restart.py", launcher_args=("--grace", "2")) as job:
        rc = job.wait(90)
    assert rc == 137, job.out + job.err[-3000:]
    assert "REJOINED" not in job.out
    assert "starting it again" not in job.err


def test_agree_is_the_same_everywhere_when_a_rank_dies_during_it():
    secret = f"elastic-agree-{os.getpid()}"
    with Job(5, SCRIPTS / "elastic_agree.py", "20", env=_job_env(secret),
             launcher_args=("--restart-failed", "100")) as job:
        rc = job.wait(150)
    assert rc == 0, job.out + job.err[-3000:]
    got = _lines(job.out, "AGREED")
    assert len(got) == 5, job.out + job.err[-3000:]
    assert all(line["bad"] == "0" for line in got), job.out
    assert job.err.count("starting it again") == 20
    assert not _leftovers(secret)
