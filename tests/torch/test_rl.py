"""The RL layouts at N = 16: torch.distributed code moved over by its import line alone,
with the footprint read from the operating system, and examples/rl_rollout.py."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil
import pytest

pytest.importorskip("torch")

from minidist import diagnostics  # noqa: E402

from ..processes.harness import ROOT  # noqa: E402
from .jobs import free_port, kill_tree, run_minidist, torch_env  # noqa: E402

N = 16


def moved_over(tmp_path):
    """examples/rl_groups_torch.py with only its import line changed."""
    src = (ROOT / "examples" / "rl_groups_torch.py").read_text().splitlines(keepends=True)
    old = "import torch.distributed as dist\n"
    assert src.count(old) == 1
    out = [("import minidist.torch as dist\n" if line == old else line) for line in src]
    path = tmp_path / "rl_groups_minidist.py"
    path.write_text("".join(out))
    return path


@pytest.mark.parametrize("N", [N, pytest.param(128, marks=[pytest.mark.slow,
                                                             pytest.mark.timeout(1200)])])
@pytest.mark.timeout(300)
def test_torch_rl_layout_under_torchrun_only_import_changed(tmp_path, N):
    """At N = 16 in the suite; at N = 128 with ``python -m pytest -m slow`` (128 torch
    processes need minutes and ~18 GiB on 2 cores: it prints their memory)."""
    script = moved_over(tmp_path)
    gate = tmp_path / "gate"
    port = free_port()  # minidist's own port (MINIDIST_PORT; else torchrun's MASTER_PORT + 1)
    env = torch_env(MINIDIST_TEST_GATE=str(gate), MINIDIST_PORT=str(port))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(N), str(script), "3"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, cwd=tmp_path)
    lines: list[str] = []
    errors: list[str] = []
    readers = [threading.Thread(target=lambda f=f, into=into: into.extend(f), daemon=True)
               for f, into in ((p.stdout, lines), (p.stderr, errors))]
    for t in readers:
        t.start()
    try:
        end = time.monotonic() + 240 + 6 * N
        while sum(line.strip() == "READY" for line in lines) < N:
            assert p.poll() is None, ("torchrun ended early", lines, "".join(errors)[-4000:])
            assert time.monotonic() < end, ("timed out", lines, "".join(errors)[-4000:])
            time.sleep(0.1)
        agent = psutil.Process(p.pid)
        workers = agent.children(recursive=True)
        assert len(workers) == N, workers
        ports, conns = diagnostics.tcp_sockets([w.pid for w in workers])
        # one port of minidist's own among the workers (torchrun's store lives in the
        # agent, and no worker connects to it); no TCP connection at all
        assert ports == {port}, ports
        assert conns == [], conns
        mem = [diagnostics.memory_kib(w.pid) for w in workers]
        print(f"N={N}: worker RSS max {max(m['rss'] for m in mem) / 1024:.0f} MiB, "
              f"PSS total {sum(m['pss'] for m in mem) / 2**20:.1f} GiB, peak RSS max "
              f"{max(m['hwm'] for m in mem) / 1024:.0f} MiB")
        gate.touch()
        p.wait(120)
        for t in readers:
            t.join(10)
        assert p.returncode == 0, "".join(errors)[-4000:]
    finally:
        kill_tree(p)
    summary = next(line for line in lines if "groups=3" in line)
    assert f"N={N} groups=3" in summary and "tcp_connections_between_ranks=0" in summary


@pytest.mark.timeout(240)
def test_rl_rollout_example():
    job = run_minidist(N, ROOT / "examples" / "rl_rollout.py", "--nodes", "4", "--rounds",
                       "20", timeout=200)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-4000:]
    line = next(line for line in job.stdout.splitlines() if "ROLLOUT" in line)
    assert f"ROLLOUT N={N} agents=4 steps={20 * 12}" in line, line
    assert "syncs=16" in line and "policies_identical=True" in line, line
