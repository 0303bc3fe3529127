"""A process forked from a rank never speaks for it (minidist.forkguard).

Each case: one rank after another starts a child that ends its own way; after each,
every rank runs later all_reduces (three sizes) and checks every result. Before the
fork guard, a child ending with sys.exit ran the rank's exit hooks (its goodbye) and
the parent's next all_reduce hung.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from .harness import SCRIPTS, Job, clean_env

pytestmark = pytest.mark.timeout(150)

MODES = ["sys_exit", "os_exit", "exception", "call", "sockets", "init", "mp_fork",
         "mp_forkserver", "subprocess",
         pytest.param("dataloader", marks=pytest.mark.skipif(
             importlib.util.find_spec("torch") is None, reason="needs torch"))]


def _results(out: str) -> dict[int, dict]:
    res = {}
    for line in out.splitlines():
        _, _, rest = line.partition("RESULT ")
        if rest:
            r = json.loads(rest)
            res[r["rank"]] = r
    return res


@pytest.mark.parametrize("mode", MODES)
def test_forked_child_leaves_the_job_working(mode):
    n, trials = 3, 3
    env = clean_env(MINIDIST_TIMEOUT="20")
    with Job(n, SCRIPTS / "forked_children.py", mode, str(trials), "50", env=env) as job:
        rc = job.wait(120)
    assert rc == 0, job.out[-3000:] + job.err[-3000:]
    res = _results(job.out)
    assert sorted(res) == list(range(n)), job.out
    for r in res.values():
        assert r["bad_children"] == 0, (mode, r, job.err[-3000:])
        assert r["wrong"] == 0, (mode, r)


def test_forked_child_with_the_standard_event_loop():
    env = clean_env(MINIDIST_TIMEOUT="20", MINIDIST_UVLOOP="0")
    with Job(2, SCRIPTS / "forked_children.py", "sys_exit", "4", "20", env=env) as job:
        rc = job.wait(120)
    assert rc == 0, job.err[-3000:]
    assert all(r["bad_children"] == 0 and r["wrong"] == 0
               for r in _results(job.out).values())
