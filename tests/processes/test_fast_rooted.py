"""Scatter, gather and all_gather through the rooted area of the fast segment
(minidist.shm.rooted_area): exact, and every failure named on every rank."""

from __future__ import annotations

import pytest

from minidist import segments
from minidist.shm import fast_slots

from .harness import SCRIPTS, Job, clean_env

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not (fast_slots.available() and segments.available()),
                       reason="the fast path needs Linux on x86-64 and /dev/shm"),
]


@pytest.mark.parametrize("n,seed", [(2, 0), (5, 1)])
def test_rooted_calls_stay_exact_mixed_with_the_slots(n, seed):
    """Random roots, dtypes and sizes up to a piece, runs of one kind back to back and
    all_reduce / barrier calls in between; every value checked bit for bit."""
    with Job(n, SCRIPTS / "rooted_stress.py", str(seed), "400") as job:
        rc = job.wait(200)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert job.out.count("ROOTED STRESS OK") == n


@pytest.mark.parametrize("victim", [0, 2])
def test_a_rank_killed_while_stepping_is_named_within_seconds(victim):
    """The learner (0) or a worker (2) killed: every other rank raises PeerLostError."""
    with Job(4, SCRIPTS / "rooted_fail.py", "kill", str(victim)) as job:
        job.wait(120)
    lost = [line for line in job.out.splitlines() if "LOST" in line]
    assert len(lost) == 3, job.out[-2000:] + job.err[-2000:]
    assert all(f"LOST [{victim}]" in line and float(line.split()[-1]) < 30 for line in lost)


def test_a_worker_that_leaves_while_stepping_is_named_as_gone():
    with Job(4, SCRIPTS / "rooted_fail.py", "exit", "2") as job:
        job.wait(120)
    lost = [line for line in job.out.splitlines() if "LOST" in line]
    assert "EXITED" in job.out, job.out[-2000:] + job.err[-2000:]
    assert len(lost) == 3, job.out[-2000:] + job.err[-2000:]
    assert all("LOST [2] left=True" in line and float(line.split()[-1]) < 30
               for line in lost)


def test_a_scatter_of_another_size_fails_on_every_rank_the_odd_one_before_writing():
    """The receiver that differs raises before its output is written; the root, which
    does not wait for its receivers, and the others raise the same error naming it, at
    once or at their next call: their output is then untouched or holds their block."""
    with Job(4, SCRIPTS / "rooted_fail.py", "mismatch_scatter", "2") as job:
        job.wait(120)
    found = {line.split("]:")[0]: line for line in job.out.splitlines() if "MISMATCH" in line}
    assert len(found) == 4, job.out[-2000:] + job.err[-2000:]
    assert "untouched=True" in found["[rank2"], found
    assert all("named=True" in line for line in found.values()), found
    assert all("untouched=True" in line or "mine=True" in line for line in found.values())


def test_a_gather_of_another_size_fails_the_learner_and_the_sender():
    """The learner and the victim raise CollectiveMismatchError (the learner's output
    unchanged); the other senders did not wait in the gather and hear of it through the
    group's abort at their next call, within seconds."""
    with Job(4, SCRIPTS / "rooted_fail.py", "mismatch", "2") as job:
        job.wait(120)
    found = [line for line in job.out.splitlines() if "MISMATCH" in line]
    aborted = [line for line in job.out.splitlines() if "ABORTED" in line]
    assert len(found) + len(aborted) == 4, job.out[-2000:] + job.err[-2000:]
    assert len(found) >= 2 and all("untouched=True" in line for line in found)
    assert all(float(line.split()[2]) < 30 for line in aborted), aborted


@pytest.mark.timeout(400)
def test_workers_waiting_for_the_learner_sleep():
    """33 workers wait 5 s in a scatter: they sleep on the release word (a spin would
    cost ~5 CPU-seconds each)."""
    with Job(34, SCRIPTS / "rooted_idle.py", env=clean_env(IDLE_SLEEP="5")) as job:
        assert job.wait(360) == 0, job.err[-3000:]
    line = next(line for line in job.out.splitlines() if "WAIT" in line)
    assert float(line.split("waited_min=")[1].split()[0]) >= 4.5, line
    assert float(line.split("cpu_seconds=")[1].split()[0]) < 1.0, line


@pytest.mark.parametrize("n,seed", [(2, 3), (4, 4)])
def test_repeated_calls_planned_once_stay_exact_and_check_their_arrays(n, seed):
    """A scatter or gather repeated with the same arrays runs planned once
    (minidist.shm.repeat); varied calls in between, and arrays it must not take, go the
    general way."""
    with Job(n, SCRIPTS / "repeat_calls.py", str(seed), "400") as job:
        rc = job.wait(200)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert job.out.count("REPEAT OK") == n


def test_the_rl_loop_runs_its_roles_directly_and_stays_exact():
    """9 ranks step 300 times (an all_reduce every 50 steps, a worker stopped for 0.5 s,
    the learner's input array varied): every value exact, and at most 3 % of the
    repeated calls took the general run (a learner that must wait for a worker still
    reading the last call of its parity waits there); after ranks 0 and 1 know of a failed call
    (a group of theirs broke) their repeated calls go the general way, still exact."""
    with Job(9, SCRIPTS / "rooted_lane.py", "300") as job:
        rc = job.wait(200)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    found = [line.split("LANE OK ")[1].split() for line in job.out.splitlines()
             if "LANE OK" in line]
    assert len(found) == 9, job.out[-2000:] + job.err[-3000:]
    for rank, general, _of, calls, after in found:
        assert int(general.split("=")[1]) <= 0.03 * int(calls), found
        diverted = int(after.split("=")[1])
        assert diverted >= 100 if rank in ("0", "1") else diverted <= 3, found
