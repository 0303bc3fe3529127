"""Jobs over 2-4 emulated hosts (network namespaces): one TCP port per host, TCP only
across hosts, and a cut host reported on every survivor."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from minidist import diagnostics

from ..processes.harness import ROOT, SCRIPTS, clean_env
from .netns import Hosts, can_make_hosts

REASON = can_make_hosts()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""),
              pytest.mark.timeout(180)]
PORT = 29650


@pytest.fixture
def hosts(request):
    h = Hosts(request.param)
    try:
        yield h
    finally:
        h.close()


def launch(hosts: Hosts, nproc: int, script, *args: str, env: dict | None = None):
    procs = []
    for i in range(len(hosts.names)):
        cmd = [*hosts.prefix(i), sys.executable, "-m", "minidist", "run",
               "--nnodes", str(len(hosts.names)), "--node-rank", str(i),
               "--master-addr", hosts.addrs[0], "--master-port", str(PORT),
               "-n", str(nproc), str(script), *args]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env or clean_env(),
                                      start_new_session=True))
    return procs


def finish(procs, timeout: float):
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.communicate(timeout=10)
    return outs


def wait_ready(procs, total: int, timeout: float) -> list[str]:
    lines: list[str] = []
    end = time.monotonic() + timeout
    for p in procs:
        os.set_blocking(p.stdout.fileno(), False)
    while sum(line.endswith("READY") for line in lines) < total:
        assert time.monotonic() < end, f"not ready: {lines}"
        got = False
        for p in procs:
            line = p.stdout.readline()
            if line:
                lines.append(line.rstrip("\n"))
                got = True
        if not got:
            time.sleep(0.05)
    for p in procs:
        os.set_blocking(p.stdout.fileno(), True)
    return lines


@pytest.mark.parametrize("hosts", [4], indirect=True)
def test_four_hosts_eight_processes_each(hosts, tmp_path):
    gate = tmp_path / "gate"
    env = clean_env(MINIDIST_TEST_GATE=str(gate))
    procs = launch(hosts, 8, ROOT / "examples" / "rl_groups.py", "3", env=env)
    try:
        lines = wait_ready(procs, 32, 120)
        summary = next(line for line in lines if "groups=3" in line)
        for i, p in enumerate(procs):
            launcher = psutil.Process(p.pid)  # ip netns exec execs the launcher
            tree = [launcher, *launcher.children(recursive=True)]
            ranks = {q.pid for q in tree[1:]}
            assert len(ranks) == 8
            # read from /proc/<pid>/net, which is the host's own namespace
            own_ports, _ = diagnostics.tcp_sockets([launcher.pid])
            rank_ports, conns = diagnostics.tcp_sockets(ranks)
            assert own_ports == {PORT} and rank_ports == set(), (i, own_ports, rank_ports)
            inside = [c for c in conns if c[1].split(":")[0] == c[2].split(":")[0]]
            assert inside == [], (i, inside)  # no TCP between processes of one host
            assert conns, "ranks of different hosts talk over TCP"
    finally:
        gate.touch()
        results = finish(procs, 120)
    for rc, _out, err in results:
        assert rc == 0, err[-3000:]
    assert "N=32 groups=3" in summary


@pytest.mark.parametrize("hosts", [2], indirect=True)
def test_collectives_across_two_hosts(hosts):
    procs = launch(hosts, 4, ROOT / "examples" / "check_collectives.py", "25")
    results = finish(procs, 120)
    for rc, _out, err in results:
        assert rc == 0, err[-3000:]
    assert "all match numpy" in results[0][1]
    procs = launch(hosts, 3, SCRIPTS / "all_collectives.py")
    for rc, _out, err in finish(procs, 120):
        assert rc == 0, err[-3000:]


@pytest.mark.parametrize("hosts", [3], indirect=True)
def test_a_cut_host_is_reported_on_every_survivor(hosts):
    procs = launch(hosts, 3, SCRIPTS / "cut.py", env=clean_env(CUT_HOST_RANKS="6,7,8"))
    try:
        wait_ready(procs, 9, 90)
        hosts.cut(2)
        t_cut = time.monotonic()
        results = []
        for p in procs[:2]:
            out, err = p.communicate(timeout=60)
            results.append((p.returncode, out, err, time.monotonic() - t_cut))
    finally:
        finish(procs, 30)
    for rc, out, _err, _ in results:
        assert rc != 0, out  # the launchers of surviving hosts report the failure
    lost = [line for _rc, out, _err, _ in results for line in out.splitlines() if "LOST" in line]
    assert len(lost) == 6, lost  # every rank of hosts 0 and 1
    for line in lost:
        ranks = line.split("ranks=")[1].split()[0]
        assert any(str(r) in ranks.split(",") for r in (6, 7, 8)), line
        assert float(line.split("after=")[1].split()[0]) < 10, line


def _launcher_env(kind: str, hosts: Hosts, node: int, local: int, per_node: int) -> dict:
    rank, world = node * per_node + local, len(hosts.names) * per_node
    if kind == "torchrun":
        return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(per_node), "MASTER_ADDR": hosts.addrs[0],
                "MASTER_PORT": str(PORT - 1), "TORCHELASTIC_RUN_ID": hosts.id}
    if kind == "slurm":
        return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world),
                "SLURM_LOCALID": str(local), "SLURM_NTASKS_PER_NODE": str(per_node),
                "SLURM_NNODES": str(len(hosts.names)), "SLURM_JOB_ID": "7",
                "MASTER_ADDR": hosts.addrs[0], "MINIDIST_PORT": str(PORT)}
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(world),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(local),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(per_node), "MASTER_ADDR": hosts.addrs[0],
            "MINIDIST_PORT": str(PORT), "OMPI_MCA_ess_base_jobid": hosts.id}


@pytest.mark.parametrize("hosts", [2], indirect=True)
@pytest.mark.parametrize("kind", ["torchrun", "slurm", "mpirun"])
def test_other_launchers_across_hosts(hosts, kind):
    """Each node's local rank 0 hosts that node's agent (rank 0: the rendezvous)."""
    per_node = 3
    procs = []
    for node in range(2):
        for local in range(per_node):
            env = clean_env(**_launcher_env(kind, hosts, node, local, per_node))
            procs.append(subprocess.Popen(
                [*hosts.prefix(node), sys.executable, str(SCRIPTS / "all_collectives.py")],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                start_new_session=True))
    results = finish(procs, 120)
    for rc, _out, err in results:
        assert rc == 0, err[-3000:]
    assert "ALL COLLECTIVES OK" in results[0][1]


@pytest.mark.parametrize("hosts", [2], indirect=True)
def test_the_first_node_waits_for_the_others_to_finish(hosts):
    # the rendezvous lives with the first node's launcher: it must outlast that node's
    # ranks while ranks of other nodes still run
    procs = launch(hosts, 2, SCRIPTS / "first_node_leaves.py")
    results = finish(procs, 60)
    for rc, _out, err in results:
        assert rc == 0, err[-3000:]
    assert results[1][1].count("rounds=") == 2
