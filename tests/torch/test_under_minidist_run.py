"""torch code runs unchanged under `minidist run`: its env:// rendezvous uses minidist's
own store, so the job keeps one listening port."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ..processes.harness import Job, clean_env, tcp_sockets

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(180)
SCRIPT = Path(__file__).parent / "scripts" / "ddp_under_run.py"


def test_ddp_with_init_process_group_minidist_under_minidist_run(tmp_path):
    with Job(4, SCRIPT, str(tmp_path), env=clean_env()) as job:
        end = time.monotonic() + 150
        while len(list(tmp_path.glob("ready*"))) < 4:
            assert job.proc.poll() is None, job.wait(10) or job.err[-3000:]
            assert time.monotonic() < end, "the ranks did not get ready"
            time.sleep(0.1)
        listening, established = tcp_sockets(job.tree())
        (tmp_path / "go").touch()
        rc = job.wait(60)
    assert rc == 0, job.err[-3000:]
    assert job.out.count("DDP OK") == 4
    assert len(listening) == 1 and listening[0][0] == job.proc.pid, listening
    assert established == [], established


def test_a_script_that_imports_torch_finds_it_imported_once_by_the_launcher(tmp_path):
    """Forked ranks share the launcher's torch (imported with a rank's OMP_NUM_THREADS);
    a spawned rank imports its own."""
    import subprocess
    import sys

    script = tmp_path / "torch_rank.py"
    script.write_text(
        "import sys\n"
        "before = 'torch' in sys.modules\n"
        "import torch\n"
        "import minidist.torch as dist\n"
        "dist.init_process_group()\n"
        "t = torch.ones(2) * (dist.get_rank() + 1)\n"
        "dist.all_reduce(t)\n"
        "print('RANK', dist.get_rank(), before, torch.get_num_threads(), t.tolist(),\n"
        "      flush=True)\n"
        "dist.destroy_process_group()\n")
    env = clean_env()
    env.pop("OMP_NUM_THREADS", None)
    for method, preloaded in (("fork", True), ("spawn", False)):
        r = subprocess.run([sys.executable, "-m", "minidist", "run", "-n", "2",
                            "--start-method", method, str(script)], env=env,
                           capture_output=True, text=True, timeout=150)
        assert r.returncode == 0, r.stderr[-3000:]
        lines = sorted(x.split(": ", 1)[1] for x in r.stdout.splitlines() if "RANK" in x)
        assert lines == [f"RANK {k} {preloaded} 1 [3.0, 3.0]" for k in (0, 1)], r.stdout
