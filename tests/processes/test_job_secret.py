"""A torchrun-style job on one node without MINIDIST_SECRET uses a secret nobody else can
compute (minidist.job_secret): a second local user who derives the old secret from
MASTER_ADDR / MASTER_PORT / TORCHELASTIC_RUN_ID completes no handshake on the job's TCP
port, cannot read the secret's file, and the job goes on unaffected. The same attack on
a job whose secret is the derived one completes the handshake (the attack works)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import psutil
import pytest

from minidist import env as md_env
from minidist import wire

from ..chaos.scenarios import _python_for_anyone, throwaway_user
from .harness import SCRIPTS, clean_env

pytestmark = pytest.mark.timeout(180)

# run as the other user, standard library only: it reads what it can of the secret
# directory, then for each role opens the TCP port and relays the handshake through its
# stdin/stdout (the test computes the hello from the derived secret, as that user could)
ATTACKER = r"""
import json, os, socket, sys
P = json.loads(sys.argv[1])
readable = []
for path in P["files"]:
    names = []
    try:
        names = os.listdir(path)  # a directory: every file in it
    except OSError:
        pass
    for name in [path, *(os.path.join(path, n) for n in names)]:
        try:
            with open(name, "rb") as f:
                readable.append(name + ": " + f.read(64).hex())
        except OSError:
            pass
print(json.dumps({"readable": readable}), flush=True)
for role in P["roles"]:
    s = socket.create_connection(("127.0.0.1", P["port"]), timeout=10)
    try:
        challenge = b""
        while len(challenge) < P["challenge"]:
            b = s.recv(P["challenge"] - len(challenge))
            if not b:
                break
            challenge += b
        print(json.dumps({"challenge": challenge.hex()}), flush=True)
        hello = bytes.fromhex(json.loads(sys.stdin.readline())["hello"])
        s.sendall(hello)
        ack = b""
        while len(ack) < P["ack"]:
            b = s.recv(P["ack"] - len(ack))
            if not b:
                break
            ack += b
        print(json.dumps({"ack": ack.hex()}), flush=True)
    except OSError as e:
        print(json.dumps({"ack": "", "error": str(e)}), flush=True)
    finally:
        s.close()
"""

ROLES = [wire.Role.AGENT, wire.Role.PEER, wire.Role.PROCESS]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _attack(user, port: int, secret: bytes, files: list[str]) -> tuple[int, list[str]]:
    """(handshakes completed on ``port`` with ``secret``, what of ``files`` (and of the
    directories among them) ``user`` could read)."""
    args = {"port": port, "roles": [int(r) for r in ROLES], "files": files,
            "challenge": wire.CHALLENGE_SIZE, "ack": wire.ACK_SIZE}
    p = subprocess.Popen([_python_for_anyone(), "-I", "-c", ATTACKER, json.dumps(args)],
                         user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd="/",
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"})
    completed = 0
    try:
        readable = json.loads(p.stdout.readline())["readable"]
        for role in ROLES:
            line = p.stdout.readline()
            assert line, p.stderr.read()
            _, nonce = wire.decode_challenge(bytes.fromhex(json.loads(line)["challenge"]))
            answer = os.urandom(16)
            hello = wire.encode_hello(secret, nonce, role, -1, -1, answer)
            p.stdin.write(json.dumps({"hello": hello.hex()}) + "\n")
            p.stdin.flush()
            ack = bytes.fromhex(json.loads(p.stdout.readline())["ack"])
            if len(ack) == wire.ACK_SIZE:
                try:
                    ok = wire.decode_ack(ack, secret, nonce, answer) == wire.AckStatus.OK
                except Exception:  # noqa: BLE001 - an ack that does not verify
                    ok = False
                completed += ok
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return completed, readable


def _job(ranks: range, n: int, master_port: int, gate: str,
         **extra: str) -> list[subprocess.Popen]:
    procs = []
    for r in ranks:
        procs.append(subprocess.Popen(
            [sys.executable, str(SCRIPTS / "secret_job.py")], text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            env=clean_env(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                          LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(master_port), TORCHELASTIC_RUN_ID="none",
                          SECRET_TEST_GATE=gate, **extra)))
    return procs


def _listening(port: int) -> bool:
    return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in psutil.net_connections("tcp"))


def _wait_ready(p: subprocess.Popen) -> None:
    line = p.stdout.readline()
    assert line.strip() == "READY", line + p.stderr.read()


def _finish(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=90)
            out.append((p.returncode, o, e))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def _derived(master_port: int, n: int) -> md_env.LaunchConfig:
    """Rank 0's configuration as anyone can compute it from the job's public variables
    (``secret``: the derived secret)."""
    cfg = md_env.detect({"RANK": "0", "WORLD_SIZE": str(n), "LOCAL_RANK": "0",
                         "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
                         "MASTER_PORT": str(master_port), "TORCHELASTIC_RUN_ID": "none"})
    assert cfg.share_secret  # one node, no MINIDIST_SECRET: handed out through a file
    return cfg


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a second local user needs root")
def test_a_second_user_with_the_derived_secret_gets_nothing(tmp_path):
    from minidist import job_secret

    n = 3
    with throwaway_user() as user:
        if user is None:
            pytest.skip("useradd failed: no second local user")
        for protected in (True, False):
            master_port = _free_port()
            gate = str(tmp_path / f"gate-{protected}")
            # the control: a secret the attacker knows is a secret it completes
            # handshakes with (so a 0 below means refused, not a broken attack)
            known = b"known-to-the-attacker"
            cfg = _derived(master_port, n)
            secret = cfg.secret if protected else known
            extra = {} if protected else {"MINIDIST_SECRET": known.decode()}
            secret_file = job_secret.file_for(cfg, 1)
            # rank 0 first: it writes the secret's file and waits for the others
            procs = _job(range(1), n, master_port, gate, **extra)
            try:
                end = time.monotonic() + 60
                while not _listening(master_port + 1) or (
                        protected and not os.path.exists(secret_file)):
                    assert time.monotonic() < end and procs[0].poll() is None, \
                        procs[0].stderr.read() if procs[0].poll() is not None else "slow"
                    time.sleep(0.02)
                if protected:
                    st = os.stat(secret_file)
                    assert st.st_mode & 0o777 == 0o600
                    assert os.stat(os.path.dirname(secret_file)).st_mode & 0o777 == 0o700
                t0 = time.monotonic()
                completed, readable = _attack(user, master_port + 1, secret,
                                              [secret_file, os.path.dirname(secret_file)])
                took = time.monotonic() - t0
                procs += _job(range(1, n), n, master_port, gate, **extra)
                _wait_ready(procs[0])
                open(gate, "w").close()
            finally:
                results = _finish(procs)
            for rc, _out, err in results:
                assert rc == 0, err[-3000:]
            assert sum("SECRET JOB OK" in o for _, o, _ in results) == n
            assert readable == []
            if protected:
                assert completed == 0, f"{completed} handshake(s) with the derived secret"
            else:
                assert completed >= 1, completed
            assert took < 60
    assert not os.path.exists(secret_file)  # removed once every rank had joined
