"""minidist.scan (MPI_Scan / MPI_Exscan) in real processes: numpy, minidist.aio and
minidist.torch at N = 2, 5 and 8; and minidist bench scan."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .harness import ROOT, Job, clean_env

SCRIPT = ROOT / "tests" / "processes" / "scripts" / "scan_job.py"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("front", ["numpy", "aio", "torch"])
@pytest.mark.parametrize("n", [2, 5, 8])
def test_scan_gives_mpi_scan_results(front, n):
    if front == "torch":
        pytest.importorskip("torch")
    with Job(n, SCRIPT, front) as job:
        rc = job.wait(140)
    assert rc == 0, job.out[-3000:] + job.err[-3000:]
    oks = [ln for ln in job.out.splitlines() if f"SCAN OK {front}" in ln]
    assert len(oks) == n, job.out[-2000:]


@pytest.mark.timeout(90)
def test_bench_runs_and_checks_scan():
    p = subprocess.run([sys.executable, "-m", "minidist", "bench", "scan", "-n", "3",
                        "--min-bytes", "8", "--max-bytes", "4K", "--iters", "3", "--check"],
                       capture_output=True, text=True, timeout=80, env=clean_env(), cwd=ROOT,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    sizes = [ln.split()[0] for ln in p.stdout.splitlines() if ln.strip() and
             not ln.startswith("#")]
    assert sizes[-1] == "4096", p.stdout
