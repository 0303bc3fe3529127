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
