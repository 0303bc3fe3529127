"""benchmarks/gpu_check.py: its plan (``--dry-run``, no GPU needed) and its report."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from ..processes.harness import ROOT
from .conftest import has_cuda

pytestmark = pytest.mark.timeout(120)

SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_prints_the_plan_and_exits_0():
    r = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    for step in ("env", "nccl1", "ipc", "kill-ipc", "ddp", "bench-ipc", "bench-nccl1",
                 "bench-host", "bench-torch-nccl"):
        assert f"  {step} " in r.stdout, step
    assert "1 MiB, 4 MiB, 16 MiB, 64 MiB, 256 MiB, 1 GiB" in r.stdout
    assert "budget 450 s" in r.stdout


def test_the_plan_fits_and_every_step_has_a_worker():
    g = load()
    assert g.BENCH_SIZES[0] == 1 << 20 and g.BENCH_SIZES[-1] == 1 << 30
    one = g.steps(None, 1)
    assert {s[0] for s in one if s[3]} == {"nccl", "kill-nccl"}  # need 2+ GPUs
    assert [s[1] for s in one if s[0] == "ipc"] == [2, 4, 8]
    assert g.steps({"ipc"}, 1) == [s for s in one if s[0] == "ipc"]
    assert [s[0] for s in g.steps({"bench"}, 4)] == [
        "bench-ipc", "bench-ipc1p", "bench-nccl1", "bench-torch-nccl", "bench-ipc",
        "bench-ipc", "bench-host"]
    assert [s[1] for s in g.steps({"bench-ipc"}, 1)] == [4, 2, 8]
    assert all(s[1] == 4 for s in g.steps({"bench-torch-nccl", "nccl"}, 4))
    assert {name for name, _, _ in g.PLAN} <= set(g.WORKERS)
    assert all(callable(f) for f in g.WORKERS.values())


def test_the_report_table():
    g = load()
    md = g.table([
        {"step": "ipc", "ranks": 2, "status": "PASS", "seconds": 3.2, "detail": "12 checks"},
        {"step": "bench-host", "ranks": 2, "status": "PASS", "seconds": 9,
         "rows": [{"bytes": 1 << 20, "time_us": 812.5, "algbw": 1.29, "busbw": 1.29}]},
    ])
    assert "| ipc | 2 | PASS | 3.2 | 12 checks |" in md
    assert "| host | 2 | 1 MiB | 812.5 | 1.29 | 1.29 |" in md


@pytest.mark.skipif(has_cuda(), reason="this machine has a GPU")
def test_without_a_gpu_the_check_refuses_to_run(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "no CUDA device" in r.stderr
