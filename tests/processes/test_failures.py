"""Lifetimes and exit codes under ``minidist run`` when ranks die, also before init."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from minidist import peer_memory, segments

from .harness import SCRIPTS, Job, clean_env

pytestmark = pytest.mark.timeout(120)


def test_killing_the_launcher_kills_every_rank():
    with Job(4, SCRIPTS / "busy.py") as job:
        job.read_until(lambda lines: sum("READY" in line for line in lines) == 4, 60)
        ranks = [p for p in job.tree() if p.pid != job.proc.pid]
        assert len(ranks) >= 4
        try:
            os.kill(job.proc.pid, signal.SIGKILL)
            gone, alive = psutil.wait_procs(ranks, timeout=10)
            assert alive == [], f"orphans: {alive}"
        finally:
            # killed in the middle of setting up their first fast call, the ranks may
            # leave a segment's name; with the launcher killed too, nobody removes it
            # (the next launcher sweeps names of dead creators once 10 minutes old)
            for p in ranks:
                for path in glob.glob(os.path.join(segments.SHM_DIR, f"minidist-*-{p.pid}")):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)


@pytest.mark.parametrize("trial", range(3))
def test_the_job_exit_code_is_the_killed_ranks_not_a_survivors(trial):
    with Job(4, SCRIPTS / "survivors_exit_3.py") as job:
        rc = job.wait(60)
    assert rc == 128 + signal.SIGKILL, job.err[-2000:]


def test_a_rank_that_dies_before_init_is_named_at_once(tmp_path):
    script = tmp_path / "early.py"
    script.write_text(
        "import os, sys, time, minidist\n"
        "if os.environ['RANK'] == '2':\n"
        "    sys.exit(1)\n"
        "t0 = time.monotonic()\n"
        "try:\n"
        "    minidist.init(timeout=60)\n"
        "except minidist.PeerLostError as e:\n"
        "    print(f'LOST {list(e.ranks)} {time.monotonic() - t0:.1f}', flush=True)\n")
    t0 = time.monotonic()
    with Job(4, script) as job:
        job.wait(60)
    assert time.monotonic() - t0 < 30
    lost = [line for line in job.out.splitlines() if "LOST" in line]
    assert len(lost) == 3, job.out + job.err
    assert all("LOST [2]" in line for line in lost), lost


def test_shared_memory_calls_back_to_back_stay_exact():
    """Five ranks on two cores: the fast ones start the next call while the slow ones
    still copy out of the segment (this once overwrote the tail of a broadcast)."""
    with Job(5, SCRIPTS / "shm_back_to_back.py") as job:
        rc = job.wait(100)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert job.out.count("SHM BACK TO BACK OK") == 5


def _every_rank_passes(n: int, script: str, ok: str, *args: str) -> None:
    """Run a stress script on ``n`` ranks: it must exit 0, every rank printing ``ok``."""
    with Job(n, SCRIPTS / script, *args) as job:
        rc = job.wait(110)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert job.out.count(ok) == n


@pytest.mark.parametrize("n,central_above", [(2, None), (5, None), (5, 1)])
def test_small_calls_through_shared_slots_stay_exact_under_contention(n, central_above):
    args = [] if central_above is None else [str(central_above)]
    _every_rank_passes(n, "fast_stress.py", "FAST STRESS OK", *args)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_mid_size_all_reduces_through_shared_memory_stay_exact(n):
    _every_rank_passes(n, "fast_mid_stress.py", "MID STRESS OK")


@pytest.mark.parametrize("n", [2, 3, 5])
def test_broadcasts_through_shared_memory_stay_exact(n):
    _every_rank_passes(n, "fast_bcast_stress.py", "BCAST STRESS OK")


@pytest.mark.parametrize("n,reads", [(2, "on"), (3, "on"), (5, "on"), (3, "off")])
def test_large_all_reduces_that_read_the_peers_stay_exact(n, reads):
    """Above DIRECT_MIN each rank reduces its share straight from the others' vectors;
    one rank with MINIDIST_SINGLE_COPY=0 ("off") makes every rank keep to the shared
    segments, and the results are the same."""
    if reads == "on" and peer_memory.key() is None:
        pytest.skip("processes cannot read each other's memory here (process_vm_readv)")
    _every_rank_passes(n, "fast_reads_stress.py", "READS STRESS OK", reads)


@pytest.mark.parametrize("n", [2, 5])
def test_ranks_waiting_in_small_calls_sleep(n):
    """Waiters spin (n=2 fits the two cores) or yield (n=5) only briefly, then sleep:
    100 barriers that each wait 20 ms for rank 0 cost the others little CPU."""
    with Job(n, SCRIPTS / "idle_wait.py", env=clean_env(IDLE_SLEEP="2", IDLE_ROUNDS="100")
             ) as job:
        assert job.wait(60) == 0, job.err[-3000:]
    line = next(line for line in job.out.splitlines() if "WAIT" in line)
    cpu = float(line.split("cpu_seconds=")[1].split()[0])
    assert float(line.split("waited_min=")[1].split()[0]) >= 1.8, line
    assert cpu < 0.15 * (n - 1), line  # each waited 2 s: busy waiting would cost ~2 s each


@pytest.mark.parametrize("victim,central_above,count,call",
                         [(0, 1, 4, ""), (2, 1, 4, ""), (1, 64, 4, ""),
                          (2, 64, 300_000, ""), (3, 64, 4_200_000, ""),
                          (0, 64, 3_000_000, "broadcast"), (2, 64, 3_000_000, "broadcast")])
def test_a_rank_killed_in_small_calls_is_reported_within_seconds(victim, central_above,
                                                                count, call):
    """Through the shared slots, waiting on each peer or gathered at group rank 0 (whose
    death leaves the others waiting on its release) alike, through the mid area (1.2 MB:
    two chunks, three barriers), in calls that read the peers' vectors (16.8 MB), and in
    broadcasts through the mid area (12 MB: three steps), of the root or another rank."""
    with Job(4, SCRIPTS / "fast_kill.py", str(victim), str(central_above), str(count),
             call) as job:
        job.wait(90)
    lost = [line for line in job.out.splitlines() if "LOST" in line]
    assert len(lost) == 3, job.out[-2000:] + job.err[-2000:]
    assert all(f"LOST [{victim}]" in line and float(line.split()[-1]) < 30 for line in lost)


@pytest.mark.parametrize("central_above,counts", [
    (1, ()), (64, ()),
    (64, ("300000", "200000")),  # both through the mid area, different chunk counts
    (64, ("100000", "3")),  # the mid area against a slot
    (1, ("3", "100000")),  # a slot of a gathering group against the mid area
    (64, ("20000", "19999")),  # both reduced whole by every rank (one barrier)
    (64, ("20000", "100000")),  # reduced whole against chunks
    (64, ("3", "20000")),  # a slot against reduced whole
    (64, ("4200000", "4199999")),  # both read the peers' vectors, different counts
    (64, ("4200000", "300000")),  # reads against the mid area
    (64, ("3", "4200000")),  # a slot against reads
    (64, ("300000", "200000", "broadcast")),  # broadcasts of different sizes
    (64, ("3000000", "3000000", "broadcast_root")),  # ... from different roots
    (64, ("3", "300000", "broadcast")),  # a slot against the mid area
])
def test_small_calls_that_disagree_fail_on_every_rank(central_above, counts):
    with Job(4, SCRIPTS / "fast_mismatch.py", str(central_above), *counts) as job:
        job.wait(60)
    found = [line for line in job.out.splitlines() if "MISMATCH" in line]
    assert len(found) == 4, job.out[-2000:] + job.err[-2000:]
    assert all("untouched=True" in line for line in found)


def test_orphaned_segment_names_are_swept_and_live_ones_kept():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    names = {"dead": segments.segment_name("0" * 20, 5, int(dead)),
             "alive": segments.segment_name("0" * 20, 6, os.getpid())}
    for name in names.values():
        segments.create(name, 4096).close()
    try:
        removed = segments.sweep_orphans("0" * 20)
        assert removed == [names["dead"]]
        assert os.path.exists(os.path.join(segments.SHM_DIR, names["alive"]))
    finally:
        for name in names.values():
            segments.unlink(name)

