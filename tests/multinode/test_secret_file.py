"""``minidist run --nnodes 2 --secret-file``: the nodes share a secret read from a file
(no warning, and the secret derived from the options is refused on the port); without
one, the first node warns once that the derived secret is public (and it does let a
stranger in: the reason for the warning)."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from ..processes.harness import ROOT, SCRIPTS, clean_env
from .netns import Hosts, can_make_hosts
from .test_emulated_hosts import PORT, finish, hosts, wait_ready  # noqa: F401 - a fixture

REASON = can_make_hosts()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""),
              pytest.mark.timeout(180)]

# a node agent's side of the handshake with a given secret; prints True if it completes
HANDSHAKE = """
import asyncio, socket, sys
sys.path.insert(0, sys.argv[1])
from minidist import wire
from minidist.transport.sockets import connect_handshake

async def go():
    s = socket.socket()
    s.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(s, (sys.argv[2], int(sys.argv[3])))
        await connect_handshake(s, sys.argv[4].encode(), wire.Role.AGENT, -1, -1, 5.0)
        return True
    except Exception:
        return False
    finally:
        s.close()

print(asyncio.run(go()))
"""


def _launch(h: Hosts, nproc: int, extra: list[str], env: dict) -> list[subprocess.Popen]:
    procs = []
    for i in range(len(h.names)):
        cmd = [*h.prefix(i), sys.executable, "-m", "minidist", "run", "--nnodes",
               str(len(h.names)), "--node-rank", str(i), "--master-addr", h.addrs[0],
               "--master-port", str(PORT), *extra, "-n", str(nproc),
               str(SCRIPTS / "secret_job.py")]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, start_new_session=True))
    return procs


@pytest.mark.parametrize("hosts", [2], indirect=True)
@pytest.mark.parametrize("with_file", [True, False])
def test_secret_file_or_a_warning(hosts, tmp_path, with_file):  # noqa: F811
    gate = tmp_path / "gate"
    env = clean_env(SECRET_TEST_GATE=str(gate), MINIDIST_TIMEOUT="60")
    extra = []
    if with_file:
        f = tmp_path / "secret"
        f.write_text("a-secret-only-the-job-has\n")
        f.chmod(0o600)
        extra = ["--secret-file", str(f)]
    procs = _launch(hosts, 2, extra, env)
    try:
        wait_ready(procs, 1, 90)
        derived = hashlib.sha256(f"minidist:{hosts.addrs[0]}:{PORT}".encode()).hexdigest()
        r = subprocess.run([*hosts.prefix(1), sys.executable, "-c", HANDSHAKE, str(ROOT),
                            hosts.addrs[0], str(PORT), derived], capture_output=True,
                           text=True, timeout=60)
        gate.touch()
    finally:
        outs = finish(procs, 90)
    for rc, _out, err in outs:
        assert rc == 0, err[-3000:]
    assert sum(o.count("SECRET JOB OK") for _, o, _ in outs) == 4
    warnings = sum(e.count("derived from --master-addr") for _, _, e in outs)
    assert r.stdout.strip() == str(not with_file), r.stderr
    assert warnings == (0 if with_file else 1)
