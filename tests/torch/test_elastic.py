"""torch.distributed.shrink_group through the minidist backend, in a DDP-style loop."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..processes.harness import Job, clean_env

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(180)
SCRIPT = Path(__file__).parent / "scripts" / "elastic_ddp.py"


def test_torch_shrink_group_in_a_ddp_loop():
    with Job(4, SCRIPT, env=clean_env(), launcher_args=("--grace", "60")) as job:
        job.wait(120)
    lines = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in job.out.splitlines()
             if "ELASTIC DDP" in line]
    assert len(lines) == 3, job.out + job.err[-3000:]
    for line in lines:
        assert line["same"] == "True" and line["shrinks"] == "1", line
        assert line["size"] == "3" and line["backend"] == "minidist", line
    # group ranks renumbered as torch's shrink_group does: rank 1 is gone
    assert {line["rank"]: line["newrank"] for line in lines} == {"0": "0", "2": "1", "3": "2"}
