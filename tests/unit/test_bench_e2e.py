"""``minidist bench`` end to end: a tiny minidist job (seconds), the errors it gives
without running anything, process-tree cleanup; gloo and MPI only where installed."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minidist.bench import runner

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minidist", "bench", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=runner.clean_env(), cwd=ROOT, stdin=subprocess.DEVNULL)


def rows(stdout: str) -> list[list[str]]:
    return [ln.split() for ln in stdout.splitlines() if ln.strip() and not ln.startswith("#")]


@pytest.mark.timeout(60)
def test_all_reduce_table():
    started = time.monotonic()
    p = bench("all_reduce", "-n", "2", "--min-bytes", "8", "--max-bytes", "1K", "--iters", "3",
              "--check")
    assert p.returncode == 0, p.stderr
    table = rows(p.stdout)
    assert [r[0] for r in table] == ["8", "16", "32", "64", "128", "256", "512", "1024"]
    assert [r[1] for r in table] == ["2", "4", "8", "16", "32", "64", "128", "256"]
    for r in table:
        assert r[2] == "float32"
        assert float(r[3]) > 0 and float(r[4]) >= 0 and float(r[5]) >= 0
        assert r[6] == "0"  # no wrong element
    assert "n=2" in p.stdout and "# Out of bounds values: 0 OK" in p.stdout
    assert time.monotonic() - started < 20


@pytest.mark.timeout(60)
def test_pingpong_round_trips_are_checked():
    p = bench("pingpong", "-n", "3", "--min-bytes", "8", "--max-bytes", "128K", "-f", "16",
              "--iters", "20", "--check", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [r["size"] for r in doc["rows"]] == [8, 128, 2048, 32768]
    for row in doc["rows"]:
        res = row["results"]["minidist"]
        assert res["time_us"] > 0 and res["wrong"] == 0


@pytest.mark.timeout(60)
def test_json_barrier():
    p = bench("barrier", "-n", "3", "--iters", "5", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["collective"] == "barrier" and doc["n"] == 3
    assert doc["rows"][0]["results"]["minidist"]["time_us"] > 0
    assert doc["machine"]["cpus"] >= 1


@pytest.mark.timeout(120)
def test_rounds_run_every_system_again():
    p = bench("all_reduce", "-n", "2", "-b", "8", "-e", "64", "-f", "8", "--iters", "5",
              "--rounds", "2", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["rounds"] == 2
    for row in doc["rows"]:
        times = row["results"]["minidist"]["rounds_us"]
        assert len(times) == 2 and all(t > 0 for t in times)
        assert row["results"]["minidist"]["time_us"] == pytest.approx(sum(times) / 2)
    assert p.stderr.count("(round 2 of 2)") == 1


@pytest.mark.parametrize("args, message", [
    (["all_reduce", "--rounds", "0"], "--rounds must be at least 1"),
    (["all_reduce", "--min-bytes", "1X"], "not a size"),
    (["all_reduce", "--algorithm", "nope"], "unknown all_reduce algorithm"),
    (["all_reduce", "--vs", "nccl"], "unknown system"),
    (["all_reduce", "--min-bytes", "1M", "--max-bytes", "1K"], "smaller than"),
    (["pingpong", "--algorithm", "ring"], "no algorithm"),
])
def test_bad_arguments(args, message):
    p = bench(*args)
    assert p.returncode == 2 and message in p.stderr


def test_missing_systems_are_explained(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("torch", "mpi4py") else real(name, *a))
    assert "needs torch" in runner.missing("gloo")
    assert "needs mpi4py" in runner.missing("mpi")
    assert runner.missing("minidist") is None


def test_kill_trees_reaches_orphans():
    # a parent in its own session whose child moves to yet another session and outlives it
    code = ("import os, subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
            " start_new_session=True)\n"
            "print(c.pid, flush=True)\n"
            "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    child = int(p.stdout.readline())
    try:
        runner.kill_trees([p.pid], grace=0.2)
        p.wait(timeout=10)
        for _ in range(100):
            try:
                with open(f"/proc/{child}/stat") as f:
                    if f.read().split(")")[-1].split()[0] == "Z":
                        break
            except FileNotFoundError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the grandchild survived")
    finally:
        for pid in (p.pid, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.timeout(120)
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_vs_gloo():
    p = bench("all_reduce", "-n", "2", "--min-bytes", "4", "--max-bytes", "64", "--factor",
              "4", "--iters", "3", "--vs", "gloo", "--check", timeout=110)
    assert p.returncode == 0, p.stderr
    table = rows(p.stdout)
    assert [r[0] for r in table] == ["4", "16", "64"]
    assert all(len(r) == 3 + 4 + 4 + 1 and r[6] == r[10] == "0" for r in table)


@pytest.mark.timeout(120)
@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or not shutil.which("mpirun"),
                    reason="mpi4py or mpirun not installed")
def test_vs_mpi():
    p = bench("broadcast", "-n", "2", "--min-bytes", "1K", "--max-bytes", "1K", "--iters",
              "3", "--vs", "mpi", "--check", timeout=110)
    assert p.returncode == 0, p.stderr
    assert rows(p.stdout)[0][:3] == ["1024", "256", "float32"]
