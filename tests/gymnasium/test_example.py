"""examples/ppo_cartpole.py runs through minidist's vector env (a short run: training
to 475 takes minutes, so the target here is out of reach and the run stops at its
step limit, reporting so)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("torch")

from ..processes.harness import ROOT, clean_env  # noqa: E402


@pytest.mark.timeout(180)
def test_ppo_example_steps_through_minidist():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ppo_cartpole.py"), "--max-steps", "1024",
         "--num-envs", "4", "--num-steps", "32", "--target", "600"],
        capture_output=True, text=True, timeout=150, env=clean_env())
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert len(result) == 1, proc.stdout + proc.stderr
    assert "minidist" in result[0] and proc.returncode == 1, proc.stdout + proc.stderr
