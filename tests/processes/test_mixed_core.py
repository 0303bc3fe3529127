"""One protocol, two executors: a job whose ranks run the compiled core
(minidist.shm._core) and the pure-Python one side by side passes every collective,
point-to-point and object kind, the rooted calls, the repeated RL calls, the fast slots
and the inboxes, bit for bit."""

from __future__ import annotations

import pytest

from minidist import segments
from minidist.shm import core, fast_slots

from .harness import SCRIPTS, Job

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(core.compiled is None, reason="the compiled core is not built here"),
    pytest.mark.skipif(not (fast_slots.available() and segments.available()),
                       reason="the shared-memory paths need Linux on x86-64 and /dev/shm"),
]

CASES = [
    (3, "all_collectives.py", (), "ALL COLLECTIVES OK", 1),
    (4, "rooted_stress.py", ("5", "300"), "ROOTED STRESS OK", 4),
    (4, "repeat_calls.py", ("6", "300"), "REPEAT OK", 4),
    (3, "fast_p2p_stress.py", ("2",), "FAST P2P OK", 1),
    (5, "fast_stress.py", (), "FAST STRESS OK", 5),
]


@pytest.mark.parametrize("n,script,args,ok,count", CASES, ids=[c[1] for c in CASES])
def test_a_job_of_compiled_and_pure_ranks_stays_exact(n, script, args, ok, count):
    with Job(n, SCRIPTS / "mixed_core.py", "alternate", str(SCRIPTS / script), *args,
             launcher_args=("--start-method", "spawn")) as job:
        rc = job.wait(200)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    cores = sorted(line.split("CORE ")[1] for line in job.out.splitlines() if "CORE " in line)
    assert cores == sorted(f"rank{r} {'pure' if r % 2 else 'compiled'}" for r in range(n))
    assert job.out.count(ok) >= count, job.out[-2000:]
