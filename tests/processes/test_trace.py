"""MINIDIST_TRACE=DIR: every rank records its collectives step by step, and
``minidist run`` merges the ranks' files into one Chrome trace per job."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from minidist import algorithms, tracing
from minidist.algorithms import Recv, Send

from .harness import Job, clean_env

pytestmark = pytest.mark.timeout(180)

N = 4
COUNT = 1 << 16  # float32: 256 KiB, far above the fast path's size

SCRIPT = f"""
import numpy as np, minidist
from minidist import api
minidist.init(timeout=60)
print("TRACER", api.door()._session.engine.tracer is not None, flush=True)
x = np.full({COUNT}, minidist.get_rank() + 1, np.float32)
minidist.all_reduce(x, algorithm="ring")
assert (x == {sum(range(1, N + 1))}).all()
minidist.broadcast(x, src=2, algorithm="binomial")  # (else the fast path)
small = np.ones(4, np.float32)
minidist.all_reduce(small)  # the fast path: one slice
assert (small == {N}).all()
minidist.destroy()
"""


def _run_job(tmp_path, **env: str) -> Job:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    job = Job(N, script, env=clean_env(**env))
    try:
        assert job.wait(120) == 0, job.err
    finally:
        job.kill()
    return job


def _messages(collective: str, algorithm: str, rank: int, root: int = 0) -> tuple[int, int]:
    """(sends, receives) in ``rank``'s schedule of one call, as the planner builds it."""
    sched = algorithms.make_schedule(collective, algorithm, rank, N, COUNT, root,
                                     nodes=(0,) * N, itemsize=4)
    comms = [c for step in sched.steps for c in step.comms]
    return (sum(isinstance(c, Send) for c in comms), sum(isinstance(c, Recv) for c in comms))


def test_a_traced_job_gives_one_merged_chrome_trace(tmp_path):
    trace_dir = tmp_path / "trace"
    job = _run_job(tmp_path, MINIDIST_TRACE=str(trace_dir))
    assert job.out.count("TRACER True") == N, job.out
    files = tracing.rank_files(str(trace_dir))
    assert len(files) == 1
    (name, ranks), = files.items()
    assert sorted(ranks) == list(range(N))
    merged = trace_dir / f"{name}.json"
    assert merged.exists(), job.err
    assert f"trace of the job: {merged}" in job.err or str(merged.name) in job.err
    events = json.loads(merged.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == set(range(N))
    assert all(e["ts"] >= 0 for e in events if e["ph"] != "M")

    calls = [e for e in events if e.get("cat") == "collective"]
    by_rank = Counter(e["pid"] for e in calls)
    assert by_rank == {r: 3 for r in range(N)}, calls
    for rank in range(N):
        mine = sorted((e for e in calls if e["pid"] == rank), key=lambda e: e["args"]["call"])
        assert [(e["args"]["collective"], e["args"]["path"]) for e in mine] == [
            ("all_reduce", "sockets"), ("broadcast", mine[1]["args"]["path"]),
            ("all_reduce", "fast path")]
        assert mine[0]["args"]["algorithm"] == "ring" and mine[0]["name"] == "all_reduce (ring)"
        assert mine[0]["args"]["bytes"] == COUNT * 4 and mine[0]["dur"] > 0
        assert mine[2]["args"]["algorithm"] == "shared_slots"
        # per call: as many send slices and arrivals as the schedule has messages
        for call in mine[:2]:
            a = call["args"]
            want = _messages(a["collective"], a["algorithm"], rank, a.get("root", 0))
            sends = [e for e in events if e["pid"] == rank and e.get("cat") == "send"
                     and e["args"]["call"] == a["call"]]
            recvs = [e for e in events if e["pid"] == rank and e.get("cat") == "recv"
                     and e["args"]["call"] == a["call"]]
            assert (len(sends), len(recvs)) == want, (a, want)
            steps = {e["args"]["step"] for e in sends + recvs}
            assert steps <= set(range(a["steps"]))
            for e in sends + recvs:  # inside the call's slice
                assert call["ts"] - 1 <= e["ts"] <= call["ts"] + call["dur"] + 1
    # a ring all_reduce reduces on every rank, and every send has its arrow's two ends
    assert all(any(e.get("cat") == "reduce" and e["pid"] == r for e in events)
               for r in range(N))
    flows = Counter(e["ph"] for e in events if e.get("cat") == "message")
    assert flows["s"] == flows["f"] > 0
    starts = {e["id"] for e in events if e["ph"] == "s"}
    assert {e["id"] for e in events if e["ph"] == "f"} == starts


def test_trace_merge_by_hand(tmp_path):
    trace_dir = tmp_path / "trace"
    _run_job(tmp_path, MINIDIST_TRACE=str(trace_dir))
    (name, _), = tracing.rank_files(str(trace_dir)).items()
    (trace_dir / f"{name}.json").unlink()
    out = tmp_path / "merged.json"
    r = subprocess.run([sys.executable, "-m", "minidist", "trace", "merge", str(trace_dir),
                        "--out", str(out)], capture_output=True, text=True, timeout=60,
                       env=clean_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    doc = json.loads(out.read_text())
    assert doc["otherData"]["ranks"] == list(range(N))
    assert {e["pid"] for e in doc["traceEvents"]} == set(range(N))
    r = subprocess.run([sys.executable, "-m", "minidist", "trace", "merge",
                        str(tmp_path / "nothing")], capture_output=True, text=True,
                       timeout=60, env=clean_env())
    assert r.returncode == 1 and "minidist trace merge:" in r.stderr


def test_no_trace_without_the_variable(tmp_path):
    env = clean_env()
    env.pop("MINIDIST_TRACE", None)
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    job = Job(N, script, env=env)
    try:
        assert job.wait(120) == 0, job.err
    finally:
        job.kill()
    assert job.out.count("TRACER False") == N, job.out
    assert "trace" not in job.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py"]
