"""On a machine with a GPU: the CUDA paths for real (skipped elsewhere). They run the
prepared check's correctness steps: a world of one on NCCL, ranks sharing GPU 0 through
CUDA IPC, a killed rank; with 2+ GPUs, NCCL across ranks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ..processes.harness import ROOT
from .conftest import has_cuda

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU")]


def check(tmp_path, only, budget=300):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--only",
                        only, "--budget", str(budget), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=budget + 60, cwd=ROOT)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    return r, {(s["step"], s["ranks"]): s for s in report["steps"]}


def test_nccl_world_of_one_and_ipc(tmp_path):
    r, steps = check(tmp_path, "env,nccl1,ipc,kill-ipc")
    assert r.returncode == 0, r.stdout[-4000:]
    assert steps[("nccl1", 1)]["status"] == "PASS"
    for n in (2, 4, 8):
        assert steps[("ipc", n)]["status"] == "PASS"
    assert steps[("kill-ipc", 3)]["status"] == "PASS"


def test_nccl_across_gpus(tmp_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2+ GPUs")
    r, steps = check(tmp_path, "nccl,kill-nccl")
    assert r.returncode == 0, r.stdout[-4000:]
