"""Taking a restarted rank back while another member dies and is started again: the
group made on one rank and sent to the others is the same group everywhere (a
``new_group`` call on the newcomer would take the member's new process; see
``scripts/elastic_rejoin_race.py`` and docs/elastic.md)."""

from __future__ import annotations

import os
import re

import pytest

from .harness import SCRIPTS, Job, clean_env
from .test_elastic import _leftovers

pytestmark = pytest.mark.timeout(120)


def _lines(out: str, word: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\[[^\]]*\]|\S+)", line)) for line in out.splitlines()
            if f"{word} " in line]


def test_a_sent_group_survives_a_member_restarting_while_it_is_made():
    secret = f"elastic-rejoin-race-{os.getpid()}"
    with Job(4, SCRIPTS / "elastic_rejoin_race.py", "group",
             env=clean_env(MINIDIST_SECRET=secret),
             launcher_args=("--restart-failed", "3")) as job:
        rc = job.wait(90)
    assert rc == 0, job.out + job.err[-3000:]
    agreed = {line["rank"]: line for line in _lines(job.out, "AGREED")}
    assert sorted(agreed) == ["0", "1", "3"], job.out + job.err[-3000:]
    # the race happened: the newcomer's own new_group would have been another group
    assert agreed["3"]["own_same"] == "False", agreed
    for line in agreed.values():
        assert line["ok"] == "True", line
        assert float(line["took"]) < 10, line  # not the job's timeout (30 s): no hang
        assert line["shrunk"] == "[0, 1, 3]", line  # rank 2's old process left out
        assert line["sum"] == "3", line
    rejoined = _lines(job.out, "REJOINED")
    assert len(rejoined) == 4, job.out + job.err[-3000:]
    assert all(line["same"] == "True" and line["sum"] == "True" for line in rejoined), rejoined
    assert job.err.count("starting it again") == 2, job.err[-3000:]
    assert not _leftovers(secret)
