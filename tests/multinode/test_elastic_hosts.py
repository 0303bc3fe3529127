"""Two emulated hosts, one of them killed as a whole (its launcher and ranks): the other
host's ranks raise PeerLostError, shrink the world to themselves, and go on (the
benchmark's host mode, benchmarks/elastic.py --hosts 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..processes.harness import clean_env
from .netns import can_make_hosts

REASON = can_make_hosts()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""),
              pytest.mark.timeout(240)]
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "elastic.py"


def test_the_other_host_shrinks_and_goes_on(tmp_path):
    out = tmp_path / "hosts.json"
    p = subprocess.run([sys.executable, str(BENCH), "--workers", "5", "--hosts", "2",
                        "--json", str(out)], capture_output=True, text=True,
                       env=clean_env(), timeout=200)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    r = json.loads(out.read_text())["hosts"]
    assert r["ranks"] == 6
    assert r["survivors"] == [0, 1, 2]  # the first host's ranks, in order
    assert r["host_error_ms"] < 10000 and r["host_shrink_ms_max"] < 10000, r
