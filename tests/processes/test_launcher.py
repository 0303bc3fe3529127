"""``minidist run`` end to end, with the footprint read from the operating system."""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from .harness import ROOT, SCRIPTS, Job, clean_env, tcp_sockets, unix_sockets

pytestmark = pytest.mark.timeout(120)


def test_eight_ranks_random_collectives_one_port_no_tcp_between_ranks(tmp_path):
    gate = tmp_path / "gate"
    env = clean_env(MINIDIST_TEST_GATE=str(gate))
    with Job(8, ROOT / "examples" / "check_collectives.py", "40", env=env) as job:
        job.read_until(lambda ls: sum(line.endswith("READY") for line in ls) == 8, 90)
        procs = job.tree()
        ranks = [p for p in procs if p.pid != job.proc.pid]
        assert len(ranks) == 8
        listening, established = tcp_sockets(procs)
        assert len(listening) == 1, listening  # the node's one port
        assert listening[0][0] == job.proc.pid
        assert established == [], established  # nothing between ranks goes over TCP
        for p in ranks:  # a ring/tree peer set, the agent, and the listener
            assert unix_sockets(p) <= 2 + 2 * 8, unix_sockets(p)
        gate.touch()
        assert job.wait(60) == 0, job.err
    assert "all match numpy" in job.out
    assert all(not psutil.pid_exists(p.pid) or p.status() == psutil.STATUS_ZOMBIE
               for p in ranks)


def test_a_dying_rank_makes_every_other_rank_raise_peer_lost():
    with Job(4, SCRIPTS / "die.py") as job:
        t0 = time.monotonic()
        rc = job.wait(60)
        elapsed = time.monotonic() - t0
    assert rc != 0
    lost = [line for line in job.out.splitlines() if "LOST" in line]
    assert len(lost) == 3, job.out + job.err
    for line in lost:
        ranks = ast.literal_eval(line.split("ranks=")[1].split(" after")[0])
        assert 1 in ranks, line  # names the rank that died (and, maybe, who left after it)
        assert float(line.split("after=")[1].split()[0]) < 10
    assert elapsed < 30
    assert "rank 1 exited with code 1" in job.err


def test_ctrl_c_stops_every_process():
    with Job(3, SCRIPTS / "hang.py") as job:
        lines = job.read_until(lambda ls: sum("PID" in line for line in ls) == 3, 60)
        pids = [int(line.split("PID ")[1]) for line in lines if "PID" in line]
        job.proc.send_signal(signal.SIGINT)
        rc = job.wait(30)
    assert rc == 128 + signal.SIGINT
    time.sleep(0.2)
    assert not [p for p in pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_stranger_bytes_on_the_port_do_not_disturb_the_job(tmp_path):
    gate = tmp_path / "gate"
    env = clean_env(MINIDIST_TEST_GATE=str(gate))
    with Job(3, ROOT / "examples" / "check_collectives.py", "5", env=env) as job:
        job.read_until(lambda ls: sum(line.endswith("READY") for line in ls) == 3, 60)
        (port,) = [c[1].port for c in tcp_sockets(job.tree())[0]]
        for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 100, b"MDHS" * 50):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(junk)
                s.settimeout(15)
                with contextlib.suppress(ConnectionResetError):
                    while s.recv(4096):
                        pass  # the server drops us after reading the fixed-size hello
        gate.touch()
        assert job.wait(60) == 0, job.err


def test_world_of_one_without_launcher():
    r = subprocess.run([sys.executable, str(SCRIPTS / "alone.py")], env=clean_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "ALONE OK" in r.stdout


def test_destroy_then_init_again():
    with Job(3, SCRIPTS / "reinit.py") as job:
        rc = job.wait(60)
    assert rc == 0, job.out + job.err
    assert job.out.count("REINIT OK") == 3


def test_output_is_prefixed_and_exit_code_is_the_failing_ranks(tmp_path):
    code = ("import os, minidist; minidist.init(); print('hello'); "
            "os._exit(7 if minidist.get_rank() == 2 else 0)")
    r = subprocess.run([sys.executable, "-m", "minidist", "run", "-n", "3", "-c-unused"],
                       capture_output=True, text=True, env=clean_env(), timeout=60)
    assert r.returncode != 0  # a missing script is an error, not a hang
    script = tmp_path / "exit7.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, "-m", "minidist", "run", "-n", "3", str(script)],
                       capture_output=True, text=True, env=clean_env(), timeout=60)
    assert r.returncode == 7, r.stderr
    assert sorted(line for line in r.stdout.splitlines()) == [
        "[rank0]: hello", "[rank1]: hello", "[rank2]: hello"]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_every_collective_p2p_and_object_call(n):
    with Job(n, SCRIPTS / "all_collectives.py") as job:
        rc = job.wait(90)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert "ALL COLLECTIVES OK" in job.out


def test_a_forked_rank_imports_nothing_and_starts_no_pool_thread_in_one_of_each_call():
    with Job(3, SCRIPTS / "late_imports.py", str(ROOT / "benchmarks")) as job:
        rc = job.wait(90)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    late = [line for line in job.out.splitlines() if "LATE IMPORTS" in line]
    assert len(late) == 3 and all(line.endswith(": []") for line in late), late
    threads = [line for line in job.out.splitlines() if "THREADS" in line]
    assert len(threads) == 3 and not any("minidist-fast" in line for line in threads), \
        threads


def test_small_blocking_sends_need_no_event_loop():
    with Job(2, SCRIPTS / "send_direct.py") as job:
        rc = job.wait(90)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert "DIRECT SENDS OK" in job.out


def test_shared_memory_is_never_left_behind_when_a_rank_is_killed():
    with Job(4, SCRIPTS / "shm_kill.py") as job:
        rc = job.wait(90)
    assert rc != 0
    jobs = {line.split("JOB ")[1] for line in job.out.splitlines() if "JOB " in line}
    assert len(jobs) == 1, job.out
    (key,) = jobs
    assert not [f for f in os.listdir("/dev/shm") if key in f]


def test_asyncio_api_inside_a_running_loop():
    with Job(3, SCRIPTS / "aio_job.py") as job:
        rc = job.wait(60)
    assert rc == 0, job.err[-3000:]
    assert job.out.count("AIO OK") == 3 and "ticks>0=False" not in job.out


def test_every_public_function_through_minidist_aio():
    with Job(4, SCRIPTS / "aio_every_call.py") as job:
        rc = job.wait(90)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert job.out.count("AIO EVERY CALL OK") == 4


def test_receive_from_any_source_in_arrival_order():
    with Job(16, SCRIPTS / "any_source.py") as job:
        rc = job.wait(90)
    assert rc == 0, job.out[-2000:] + job.err[-3000:]
    assert "ANY SOURCE OK" in job.out


def test_minidist_aio_names_match_minidist():
    import inspect

    import minidist
    import minidist.aio as aio

    for name in minidist.__all__:
        fn = getattr(minidist, name)
        if not inspect.isfunction(fn):
            continue
        assert hasattr(aio, name), f"minidist.aio lacks {name}"
        want = list(inspect.signature(fn).parameters)
        assert list(inspect.signature(getattr(aio, name)).parameters) == want, name


def test_a_taken_port_is_one_clear_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "minidist", "run", "-n", "2", "--master-port",
                            str(port), str(SCRIPTS / "alone.py")], capture_output=True,
                           text=True, env=clean_env(), timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "MINIDIST_PORT" in r.stderr, r.stderr


def test_calibrate_command_saves_a_calibration(tmp_path):
    where = tmp_path / "cal.json"
    r = subprocess.run([sys.executable, "-m", "minidist", "calibrate", "--quick"],
                       capture_output=True, text=True, timeout=90,
                       env=clean_env(MINIDIST_CALIBRATION=str(where)))
    assert r.returncode == 0, r.stderr
    assert where.exists() and "alpha_s" in where.read_text()
    assert "shared_memory" in r.stdout or "ring" in r.stdout


RANK_OUTPUT = """
import os, subprocess, sys, time
import minidist
minidist.init()
r = minidist.get_rank()
for i in range(300):  # every rank at once, in writes of many sizes
    sys.stdout.write(f"r{r} line {i} " + "x" * (i * 37 % 5000) + "\\n")
    if i % 50 == 0:
        sys.stdout.flush()
sys.stdout.flush()
subprocess.run([sys.executable, "-c", f"import time; print('from a child of r{r}', flush=True); "
                "time.sleep(1)"], check=True)
print(f"r{r} err line", file=sys.stderr, flush=True)
gate = os.environ.get("MINIDIST_TEST_GATE")
if gate:
    open(f"{gate}.ready{r}", "w").close()
    while not os.path.exists(gate):
        time.sleep(0.05)
minidist.barrier()
sys.stdout.write(f"r{r} last words without a newline")
minidist.destroy()
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_each_line_of_stdout_is_its_own_ranks_and_the_launcher_holds_two_fds_a_rank(
        tmp_path, method):
    """The ranks' stdout shares one socket: every line keeps its rank (a child process's
    too, while it runs, and a last line without a newline), stderr stays apart, and the
    launcher holds two descriptors per rank."""
    n = 12
    script = tmp_path / "rank_output.py"
    script.write_text(RANK_OUTPUT)
    gate = tmp_path / "gate"
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "minidist", "run", "-n", str(n),
                                 "--start-method", method, str(script)], stdout=out,
                                stderr=err, env=clean_env(MINIDIST_TEST_GATE=str(gate)),
                                start_new_session=True)
    try:
        end = time.monotonic() + 90
        while len(list(tmp_path.glob("gate.ready*"))) < n:
            assert proc.poll() is None and time.monotonic() < end, err_path.read_text()
            time.sleep(0.05)
        kinds = [os.readlink(f"/proc/{proc.pid}/fd/{fd}").split(":")[0]
                 for fd in os.listdir(f"/proc/{proc.pid}/fd")]
        gate.touch()
        rc = proc.wait(60)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    lines, errs = out_path.read_text().splitlines(), err_path.read_text().splitlines()
    assert rc == 0, errs[-20:]
    # per rank a stderr pipe and a rendezvous connection; the rest is the launcher's own
    # (listeners, its event loop's, the stdout socket's two ends)
    assert kinds.count("pipe") + kinds.count("socket") <= 2 * n + 10, kinds
    for r in range(n):
        body = [ln.split(": ", 1)[1] for ln in lines if ln.startswith(f"[rank{r}]: ")]
        want = [f"r{r} line {i} " + "x" * (i * 37 % 5000) for i in range(300)]
        assert [b for b in body if " line " in b] == want, r
        assert f"from a child of r{r}" in body and \
            f"r{r} last words without a newline" in body, body[-3:]
        assert f"[rank{r}]: r{r} err line" in errs
    assert not any("err line" in ln for ln in lines)


def test_verbose_says_how_much_of_dev_shm_the_ranks_held(tmp_path):
    script = tmp_path / "shm_user.py"
    script.write_text(
        "import time\nimport numpy as np\nimport minidist\nminidist.init()\n"
        "r, n = minidist.get_rank(), minidist.get_world_size()\n"
        "x = np.ones(4)\n"
        "for _ in range(3):\n"
        "    minidist.all_reduce(x)\n"
        "    if r:\n        minidist.send(x, 0)\n"
        "    else:\n        [minidist.recv(x, s) for s in range(1, n)]\n"
        "time.sleep(1.0)\nminidist.barrier()\nminidist.destroy()\n")
    r = subprocess.run([sys.executable, "-m", "minidist", "run", "-n", "4", "--verbose",
                        str(script)], capture_output=True, text=True, env=clean_env(),
                       timeout=90)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stderr.splitlines() if "/dev/shm held" in ln)
    held, count = line.split("at most: ")[1].split(" (")
    assert float(held.split()[0]) > 0, line
    assert int(count.split()[0]) >= 2, line  # rank 0's inbox and the group's area
    looks = line.split("; looked ")[1].split(",")[0]  # "N times": the ranks ran > 1 s
    assert looks.endswith(" times") and int(looks.split()[0]) >= 3, line
    quiet = subprocess.run([sys.executable, "-m", "minidist", "run", "-n", "2",
                            str(script)], capture_output=True, text=True, env=clean_env(),
                           timeout=90)
    assert quiet.returncode == 0 and "/dev/shm held" not in quiet.stderr
