"""SharedArray over two emulated hosts: every version crosses the network once per
host, however many ranks the host has."""

from __future__ import annotations

import subprocess

import pytest

from ..processes.harness import SCRIPTS, clean_env
from .netns import Hosts, can_make_hosts
from .test_emulated_hosts import finish, launch, wait_ready

REASON = can_make_hosts()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""),
              pytest.mark.timeout(240)]


@pytest.fixture
def hosts(request):
    h = Hosts(request.param)
    try:
        yield h
    finally:
        h.close()


def received(hosts: Hosts, i: int) -> int:
    """Bytes host ``i``'s link has received so far."""
    out = subprocess.run([*hosts.prefix(i), "cat", "/proc/net/dev"], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == f"mda{hosts.id}{i}":
            return int(rest.split()[0])
    raise AssertionError(out)


@pytest.mark.parametrize("hosts", [2], indirect=True)
def test_each_version_crosses_the_network_once_per_host(hosts, tmp_path):
    per_host, versions, mib = 16, 4, 4
    gate = tmp_path / "gate"
    # the first version comes after more than the job's timeout (3 s)
    env = clean_env(MINIDIST_TEST_GATE=str(gate), JOB_TIMEOUT="3", FIRST_AFTER="4")
    procs = launch(hosts, per_host, SCRIPTS / "shared_array_job.py", "hosts",
                   str(versions), str(mib), env=env)
    try:
        wait_ready(procs, 2 * per_host, 150)
        before = received(hosts, 1)
    finally:
        gate.touch()
        results = finish(procs, 150)
    for rc, _out, err in results:
        assert rc == 0, err[-3000:]
    assert sum(out.count("HOSTS OK") for _rc, out, _err in results) == 2 * per_host
    got = received(hosts, 1) - before
    payload = versions * mib * 2**20
    # once per host: the payload and some headers and control messages, where a copy
    # per rank would be 16 times the payload
    assert payload <= got < 1.5 * payload, (got, payload)


@pytest.mark.parametrize("hosts", [2], indirect=True)
def test_a_lost_node_leader_stops_only_its_node(hosts):
    procs = launch(hosts, 3, SCRIPTS / "shared_array_job.py", "leader_dies")
    results = finish(procs, 120)
    out = "".join(o for _rc, o, _e in results)
    errs = "".join(e[-2000:] for _rc, _o, e in results)
    assert "PUBLISHED 4" in out, out + errs  # the learner published on
    assert out.count("HOST0 OK") == 2, out + errs
    lost = [line for line in out.splitlines() if "LEADER LOST" in line]
    assert len(lost) == 2 and all("ranks=3 " in line for line in lost), out + errs
