"""File-descriptor limits: the soft limit is raised to the hard one by the launcher and
every rank; a hard limit too low for the job fails it at once, naming the limit; a
listener out of descriptors refuses a connection at once instead of leaving it waiting."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from minidist import fdlimits

from .harness import ROOT, SCRIPTS, clean_env

pytestmark = pytest.mark.timeout(180)


def _run(n: int, soft: int, hard: int, timeout: float = 150) -> tuple[int, str, str, float]:
    """``minidist run -n N`` of a trivial script under nofile limits soft/hard."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "minidist", "run", "-n", str(n),
                        str(SCRIPTS / "fd_tiny.py")], env=clean_env(MINIDIST_TIMEOUT="60"),
                       capture_output=True, text=True, timeout=timeout, preexec_fn=limit,
                       start_new_session=True)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


def test_soft_limit_below_the_job_is_raised_to_the_hard_one():
    n = 40  # the launcher alone holds more than 64 descriptors for 40 ranks
    assert fdlimits.launcher_needs(n) > 64
    rc, out, err, _ = _run(n, 64, 1024)
    assert rc == 0, err[-3000:]
    assert f"FD OK {n} 1024" in out  # the ranks run with the raised soft limit


def test_hard_limit_too_low_fails_within_5_s_naming_the_limit():
    n = 40
    need = fdlimits.launcher_needs(n)
    rc, out, err, took = _run(n, 64, 100, timeout=30)
    assert rc != 0
    assert took < 5, took
    assert "most 100" in err and f"needs about {need}" in err and "ulimit -n" in err, err
    assert "FD OK" not in out


@pytest.mark.slow
@pytest.mark.parametrize("n, soft, hard", [(300, 256, 1024), (400, 1024, 20000)])
def test_hundreds_of_ranks_under_a_low_soft_limit(n, soft, hard):
    rc, out, err, _ = _run(n, soft, hard, timeout=170)
    assert rc == 0, err[-3000:]
    assert f"FD OK {n} {hard}" in out


@pytest.mark.slow
def test_400_ranks_under_hard_1024_fail_within_5_s():
    rc, _, err, took = _run(400, 1024, 1024, timeout=30)
    assert rc != 0 and took < 5 and "most 1024" in err and "ulimit -n" in err, (took, err)


LISTENER = textwrap.dedent("""
    import asyncio, os, resource, socket, sys
    sys.path.insert(0, sys.argv[1])
    from minidist.transport.acceptor import Acceptor

    class Server(Acceptor):
        def __init__(self):
            self._tasks, self._closed, self.errors = set(), False, []
            self.on_exhausted = self.errors.append
        async def _session(self, sock):
            sock.close()

    async def main():
        s = Server()
        lst = socket.socket(socket.AF_UNIX)
        lst.bind("\\0" + sys.argv[2]); lst.listen(16); lst.setblocking(False)
        task = asyncio.ensure_future(s._accept_loop(lst))
        await asyncio.sleep(0.2)
        held = []
        soft = len(os.listdir("/proc/self/fd")) + 4
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, soft))
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        print("FULL", flush=True)
        for _ in range(100):
            await asyncio.sleep(0.05)
            if s.errors:
                break
        print("ERROR", s.errors[0] if s.errors else None, flush=True)
        s._closed = True
        task.cancel()

    asyncio.run(main())
""")


def test_a_listener_out_of_descriptors_refuses_at_once_and_says_why():
    name = f"minidist-test-fd-{time.monotonic_ns()}"
    p = subprocess.Popen([sys.executable, "-c", LISTENER, str(ROOT), name],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "FULL", p.stderr.read()
        c = socket.socket(socket.AF_UNIX)
        c.settimeout(5)
        c.connect("\0" + name)
        t0 = time.monotonic()
        assert c.recv(16) == b""  # accepted and closed: not left waiting
        assert time.monotonic() - t0 < 2
        c.close()
        line = p.stdout.readline()
        assert line.startswith("ERROR too many open files (EMFILE)"), line
        assert "ulimit -n" in line
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
