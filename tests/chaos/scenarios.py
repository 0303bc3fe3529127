"""The chaos scenarios: one copy, run by ``tests/chaos`` (a few trials) and by
``benchmarks/chaos.py`` (many).

Each scenario is a function ``(rng, opts) -> Trial``: it draws its parameters (ranks,
victim, moment, size, collective) from ``rng``, starts a job whose ranks run a script
from ``scripts/``, does something unkind to it (SIGKILL, SIGSTOP, a departure, a
disagreement, a stranger), reads each rank's ``RESULT`` line, and records every breach
of the contract below in ``Trial.problems``. Whatever happens, every process it started
is killed before it returns, and it checks that none was left running and that no
``/dev/shm/minidist-*`` file of the job remains.

The contract (``docs/reliability.md`` says it for users):

* kill -9 of any rank during a stream of collectives: every survivor raises
  ``PeerLostError`` naming it (``.left`` False) within 10 s;
* a rank that leaves normally while others wait on it: they raise ``PeerLostError``
  with ``.left`` True within 10 s (target 2 s); ranks that do not wait on it see no error;
* SIGSTOP past a short timeout, then SIGCONT: the waiting ranks raise
  ``DistTimeoutError``, every later call on the group raises a ``DistError`` within 1 s,
  and the stopped rank, once continued, raises a ``DistError`` within seconds;
* SIGKILL of the ``minidist run`` launcher: every rank is gone within a few seconds;
* torchrun-like job, kill -9 of rank 0 (the rendezvous host): the others raise
  ``PeerLostError`` within 5 s;
* ranks that disagree (roots, sizes, algorithm): every rank raises a ``DistError``
  within 10 s (in a broadcast or scatter, a rank whose root agrees with it may
  raise on its next call instead), with no
  internal number (``2147483649``, ``algorithm#``) in the message;
* a rank exiting before ``init()``: the others' ``init`` raises a ``DistError`` naming it
  within 10 s;
* a second local user squatting a dead rank's address and sending junk to live ranks:
  0 handshakes completed with it, 0 data frames received by it, the live ranks
  undisturbed, and not one log line per refused connection.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ..processes.harness import clean_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"
MIB16 = 16 << 20
SIZES = (4, MIB16)
OPS = ("all_reduce", "broadcast", "all_gather", "barrier", "scatter", "gather")
TIMEOUT = 60.0  # MINIDIST_TIMEOUT for every scenario but the stall: a hang is obvious
STALL_TIMEOUT = 3.0
MARGIN = 5.0  # how long past a limit the harness still waits before calling it a hang
START = 60.0  # seconds for every rank of a job to print READY
END = 15.0  # seconds for a job to end once told to
INTERNAL_NUMBER = 1 << 31  # minidist's own tags and ids start here
NOISE_LINES = 5  # "at most a few lines" of output about refused connections


@dataclass
class Options:
    """What trials may draw from. ``ns`` and ``sizes`` are filtered per scenario."""

    ns: tuple[int, ...] = ()
    sizes: tuple[int, ...] = SIZES
    ops: tuple[str, ...] = OPS
    wait: float = MARGIN
    env: tuple[tuple[str, str], ...] = ()  # more environment for every job's ranks
    stop: float = 0.0  # stall: the least seconds a rank stays stopped


@dataclass
class Trial:
    """One run of one scenario: its parameters and everything that went wrong."""

    scenario: str
    seed: str
    params: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    hangs: int = 0
    wrong: int = 0
    late: int = 0
    times: list[float] = field(default_factory=list)
    leftover_procs: int = 0
    shm_leftovers: list[str] = field(default_factory=list)
    squatter: dict | None = None
    classes: Counter = field(default_factory=Counter)
    output: str = ""
    skipped: str = ""
    duration: float = 0.0
    extra: dict = field(default_factory=dict)  # other figures of a scenario

    @property
    def ok(self) -> bool:
        return not self.problems

    def flag(self, what: str, text: str) -> None:
        """Record a breach; ``what`` is hang, wrong, late, leftover, shm, squat or other."""
        if what == "hang":
            self.hangs += 1
        elif what == "wrong":
            self.wrong += 1
        elif what == "late":
            self.late += 1
        self.problems.append(f"[{what}] {text}")

    def report(self) -> str:
        lines = [f"scenario {self.scenario}, seed {self.seed!r}, params {self.params}"]
        if self.times:
            lines.append("time to error: " + ", ".join(f"{t:.2f}" for t in self.times))
        if self.squatter is not None:
            lines.append(f"squatter: {self.squatter}")
        if self.extra:
            lines.append(f"also: {self.extra}")
        lines += self.problems
        if self.output:
            lines += ["--- job output (tail) ---", self.output]
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "output"}
        d["classes"] = dict(self.classes)
        d["ok"] = self.ok
        return d


# ----------------------------------------------------------------------------- parsing


def _value(v: str) -> object:
    if v in ("True", "False"):
        return v == "True"
    if v.startswith("[") and v.endswith("]"):
        return [int(x) for x in v[1:-1].split(",") if x]
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def parse(line: str) -> dict | None:
    """A ``RESULT``/``EVENT`` line (after any ``[rankK]: `` prefix) as a dict."""
    line = re.sub(r"^\[rank\d+\]: ", "", line)
    if not line.startswith(("RESULT ", "EVENT ")):
        return None
    head, sep, msg = line.partition(" msg=")
    toks = head.split()
    d: dict = {"tag": toks[0]}
    for tok in toks[1:]:
        k, _, v = tok.partition("=")
        d[k] = _value(v)
    if sep:
        try:
            d["msg"] = json.loads(msg)
        except json.JSONDecodeError:
            d["msg"] = msg
    return d


def internal_numbers(msg: str) -> list[str]:
    """What in an error message is minidist's internals: numbers from 2**31 up (its own
    tags) and ``algorithm#`` indices."""
    bad = [m for m in re.findall(r"\d{10,}", msg) if int(m) >= INTERNAL_NUMBER]
    if "algorithm#" in msg:
        bad.append("algorithm#")
    return bad


# ----------------------------------------------------------------------------- processes


def shm_files() -> set[str]:
    try:
        return {f for f in os.listdir("/dev/shm") if f.startswith("minidist-")}
    except OSError:
        return set()


def job_key_of(pids: list[int]) -> str | None:
    """The job key of the abstract ``@minidist-<key>-...`` sockets these processes hold,
    read from /proc/net/unix as any local user could."""
    inodes: set[int] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(int(link[8:-1]))
    with contextlib.suppress(OSError), open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and int(parts[6]) in inodes:
                m = re.match(r"@minidist-([0-9a-f]+)-(?:agent|r\d+)$", parts[7])
                if m:
                    return m.group(1)
    return None


def free_port_pair() -> socket.socket:
    """A listening socket on port P (torchrun's store) with P + 1 free (minidist's)."""
    for _ in range(100):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with socket.socket() as t:
            try:
                t.bind(("127.0.0.1", port + 1))
            except OSError:
                s.close()
                continue
        s.listen()
        return s
    raise RuntimeError("no free pair of ports")


def job_env(timeout: float = TIMEOUT, **extra: str) -> dict[str, str]:
    return clean_env(MINIDIST_TIMEOUT=str(timeout), OMP_NUM_THREADS="1", **extra)


class Job:
    """The processes of one scenario, their output lines (read by threads, time-stamped)
    and the gates the scripts wait for. ``close()`` kills everything ever seen."""

    def __init__(self, scenario: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"minidist-chaos-{scenario}-"))
        self.popens: list[subprocess.Popen] = []
        self.lines: list[tuple[float, str, str]] = []
        self.cond = threading.Condition()
        self.seen: dict[int, psutil.Process] = {}
        self.shm_before = shm_files()
        self.key: str | None = None
        self._threads: list[threading.Thread] = []

    # starting
    def launch(self, n: int, script: str, p: dict, env: dict, grace: float = 30.0) -> None:
        """``minidist run -n n`` of a script (its ranks' lines carry ``[rankK]: ``)."""
        self._start([sys.executable, "-m", "minidist", "run", "-n", str(n), "--grace",
                     str(grace), str(SCRIPTS / script), json.dumps(p)], env, "launcher")

    def spawn(self, source: str, script: str, p: dict, env: dict) -> subprocess.Popen:
        """One process of a job started by another launcher's environment."""
        return self._start([sys.executable, "-u", str(SCRIPTS / script), json.dumps(p)],
                           env, source)

    def _start(self, cmd: list[str], env: dict, source: str) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, start_new_session=True)
        self.popens.append(proc)
        self.track()
        for stream, tag in ((proc.stdout, source), (proc.stderr, source + "!")):
            t = threading.Thread(target=self._pump, args=(stream, tag), daemon=True)
            t.start()
            self._threads.append(t)
        return proc

    def _pump(self, stream, tag: str) -> None:
        for raw in iter(stream.readline, b""):
            with self.cond:
                self.lines.append((time.monotonic(), tag, raw.decode(errors="replace")
                                   .rstrip("\n")))
                self.cond.notify_all()
        stream.close()

    def track(self) -> None:
        """Remember every process now under the ones this job started."""
        for proc in self.popens:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(proc.pid)
                for p in [root, *root.children(recursive=True)]:
                    self.seen.setdefault(p.pid, p)

    # reading
    def records(self, tag: str = "RESULT", **match: object) -> list[dict]:
        with self.cond:
            lines = list(self.lines)
        out = []
        for _, source, text in lines:
            d = parse(text)
            if d is None or d["tag"] != tag:
                continue
            d["source"] = source
            if all(d.get(k) == v for k, v in match.items()):
                out.append(d)
        return out

    def result(self, rank: int, **match: object) -> dict | None:
        found = self.records("RESULT", rank=rank, **match)
        return found[0] if found else None

    def event(self, what: str, rank: int) -> dict | None:
        found = self.records("EVENT", what=what, rank=rank)
        return found[0] if found else None

    def reported(self, ranks: list[int], **match: object) -> bool:
        return all(self.result(r, **match) is not None for r in ranks)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.1))
        return True

    def ready(self, n: int, timeout: float = START) -> dict[int, int]:
        """{rank: pid} once every rank printed READY (empty if they did not in time)."""
        def done() -> bool:
            return (len(self.records("EVENT", what="READY")) >= n
                    or all(proc.poll() is not None for proc in self.popens))

        ok = self.wait_for(done, timeout)
        ok = ok and len(self.records("EVENT", what="READY")) >= n
        self.track()
        if not ok:
            return {}
        pids = {e["rank"]: e["pid"] for e in self.records("EVENT", what="READY")}
        for pid in pids.values():
            with contextlib.suppress(psutil.Error):
                self.seen.setdefault(pid, psutil.Process(pid))
        self.learn_key(0)
        return pids

    def not_started(self, trial: Trial) -> None:
        ended = [proc.returncode for proc in self.popens if proc.poll() is not None]
        if ended:
            trial.flag("other", f"the job ended (exit codes {ended}) before every rank was "
                       "ready")
        else:
            trial.flag("other", f"not every rank was ready within {START:.0f} s")

    def output(self, last: int = 80) -> str:
        with self.cond:
            lines = list(self.lines)
        return "\n".join(f"{src}> {text}" for _, src, text in lines[-last:])

    # gates
    def gate(self, name: str) -> str:
        return str(self.dir / name)

    def open(self, name: str) -> None:
        Path(self.gate(name)).touch()

    # ending
    def alive(self) -> list[psutil.Process]:
        out = []
        for p in self.seen.values():
            with contextlib.suppress(psutil.Error):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        return out

    def wait_gone(self, timeout: float) -> list[psutil.Process]:
        end = time.monotonic() + timeout
        while True:
            alive = self.alive()
            if not alive or time.monotonic() > end:
                return alive
            time.sleep(0.05)

    def finish(self, trial: Trial, timeout: float = END) -> None:
        """Let the job end by itself within ``timeout``; then record the processes still
        alive and the shared-memory files left behind, and kill everything (at once, and
        recording nothing, when ranks already hung)."""
        if trial.hangs:  # ranks already hung: their processes say nothing more
            self.close()
            return
        end = time.monotonic() + timeout
        for proc in self.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, end - time.monotonic()))
        alive = self.wait_gone(max(0.5, end - time.monotonic()))
        if alive:
            trial.leftover_procs += len(alive)
            trial.flag("leftover", f"{len(alive)} process(es) of the job still running "
                       f"{timeout:.0f} s after it was told to end: "
                       f"{[(p.pid, _cmd(p)) for p in alive]}")
        self.close()
        left = self.shm_leftovers()
        if left:
            trial.shm_leftovers += left
            trial.flag("shm", f"shared memory left in /dev/shm: {left}")

    def learn_key(self, timeout: float = 5.0) -> str | None:
        """The job key, from the sockets of the job's processes (the launcher binds its
        agent address before it starts any rank)."""
        end = time.monotonic() + timeout
        while self.key is None:
            self.track()
            self.key = job_key_of(sorted(self.seen))
            if self.key or time.monotonic() > end:
                break
            time.sleep(0.02)
        return self.key

    def shm_leftovers(self) -> list[str]:
        """New ``/dev/shm/minidist-*`` files of this job (other jobs may run alongside:
        files of this job's key, or, if it is unknown, named after one of its pids)."""
        new = shm_files() - self.shm_before
        if self.key:
            new = {f for f in new if f.startswith(f"minidist-{self.key}-")}
        else:
            pids = {str(pid) for pid in self.seen}
            new = {f for f in new if f.rsplit("-", 1)[-1] in pids}
        return sorted(new)

    def close(self) -> None:
        self.track()
        for p in self.seen.values():
            with contextlib.suppress(psutil.Error, OSError):
                if p.is_running():
                    with contextlib.suppress(OSError):
                        os.killpg(p.pid, signal.SIGKILL)
                    p.kill()
        for proc in self.popens:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        for t in self._threads:
            t.join(timeout=2)
        shutil.rmtree(self.dir, ignore_errors=True)


def _cmd(p: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(p.cmdline())[-80:]
    return "?"


# ----------------------------------------------------------------------------- checks


def check_error(trial: Trial, res: dict | None, *, who: str, t0: float, limit: float,
                kinds: tuple[str, ...] | None = None, named: int | None = None,
                left: bool | None = None, timeout_ok: bool = False,
                record: bool = True) -> float | None:
    """One rank's reported error against the contract: a class in ``kinds`` (any
    DistError when None), ``named`` in ``.ranks``, ``.left``, within ``limit`` of t0.
    A DistTimeoutError not in ``kinds`` is a hang (it waited out the timeout) unless
    ``timeout_ok``. Returns the time to the error (added to ``trial.times`` if ``record``).
    """
    if res is None:
        trial.flag("hang", f"{who}: no report within {limit + MARGIN:.0f} s")
        return None
    kind = res["kind"]
    trial.classes[kind] += 1
    msg = res.get("msg", "")
    if kind == "none":
        trial.flag("wrong", f"{who}: no error at all")
        return None
    dt = res["t"] - t0
    if record:
        trial.times.append(dt)
    if kind == "DistTimeoutError" and not timeout_ok and (kinds is None or kind not in kinds):
        trial.flag("hang", f"{who}: waited out the timeout ({dt:.2f} s): {msg}")
        return dt
    if not (res.get("dist") if kinds is None else kind in kinds):
        want = "a DistError" if kinds is None else "/".join(kinds)
        trial.flag("wrong", f"{who}: raised {kind}, not {want}: {msg}")
    elif named is not None and named not in res.get("ranks", []):
        trial.flag("wrong", f"{who}: {kind}.ranks={res.get('ranks')} does not name rank "
                   f"{named}: {msg}")
    elif left is not None and res.get("left") != left:
        trial.flag("wrong", f"{who}: {kind}.left={res.get('left')}, expected {left}: {msg}")
    if dt > limit:
        trial.flag("late", f"{who}: {kind} {dt:.2f} s after the event (limit {limit:g} s)")
    return dt


def _pick(rng: random.Random, choices, fallback):
    choices = tuple(choices) or tuple(fallback)
    return rng.choice(choices)


def _ns(opts: Options, default: tuple[int, ...], low: int = 2,
        allowed: tuple[int, ...] | None = None) -> tuple[int, ...]:
    ns = tuple(n for n in (opts.ns or default) if n >= low
               and (allowed is None or n in allowed))
    return ns or default


def _stream_params(rng: random.Random, opts: Options, trial_size: int | None) -> dict:
    size = trial_size if trial_size is not None else _pick(rng, opts.sizes, SIZES)
    op = rng.choice((*opts.ops, "mixed"))
    return {"size": size, "op": op, "ops": list(opts.ops) if op == "mixed" else [op],
            "seed": rng.randrange(1 << 31)}


# ----------------------------------------------------------------------------- scenarios


def kill_rank(rng: random.Random, opts: Options, trial: Trial) -> None:
    """kill -9 of a random rank at a random moment of a stream of collectives."""
    n = rng.choice(_ns(opts, (2, 3, 4, 5, 6, 7, 8)))
    s = _stream_params(rng, opts, trial.params.pop("size", None))
    victim, delay = rng.randrange(n), round(rng.uniform(0.0, 1.5), 3)
    trial.params.update(n=n, size=s["size"], op=s["op"], victim=victim, delay=delay)
    job = Job(trial.scenario)
    try:
        job.launch(n, "stream.py", {"ops": s["ops"], "size": s["size"], "seed": s["seed"],
                                    "gate": job.gate("end")}, job_env())
        pids = job.ready(n)
        if not pids:
            job.not_started(trial)
            return
        time.sleep(delay)
        t_kill = time.monotonic()
        os.kill(pids[victim], signal.SIGKILL)
        survivors = [r for r in range(n) if r != victim]
        job.wait_for(lambda: job.reported(survivors, phase="first"), 10 + opts.wait)
        for r in survivors:
            check_error(trial, job.result(r, phase="first"), who=f"rank {r}", t0=t_kill,
                        limit=10, kinds=("PeerLostError",), named=victim, left=False)
        job.open("end")
        job.finish(trial)
    finally:
        trial.output = job.output()
        job.close()


def leave(rng: random.Random, opts: Options, trial: Trial) -> None:
    """A rank returns from its script, or calls destroy(), while others wait on it."""
    n = rng.choice(_ns(opts, (2, 3, 4)))
    size = trial.params.pop("size", None) or _pick(rng, opts.sizes, SIZES)
    how = trial.params.pop("how", None) or rng.choice(("return", "destroy"))
    wait = rng.choice(("recv", "all_reduce", "broadcast", "all_gather", "barrier", "scatter",
                       "gather"))
    leaver = rng.randrange(n)
    others = [r for r in range(n) if r != leaver]
    if wait == "recv":
        waiters = [rng.choice(others)]
    else:
        waiters = sorted(rng.sample(others, rng.randint(1, len(others))))
    bystanders = [r for r in others if r not in waiters]
    delay = round(rng.uniform(0.3, 1.0), 3)
    trial.params.update(n=n, size=size, how=how, wait=wait, leaver=leaver, waiters=waiters,
                        bystanders=bystanders, delay=delay)
    job = Job(trial.scenario)
    try:
        job.launch(n, "leave.py", {"leaver": leaver, "waiters": waiters, "wait": wait,
                                   "how": how, "size": size, "delay": delay,
                                   "gate": job.gate("end")}, job_env())
        if not job.ready(n):
            job.not_started(trial)
            return
        job.wait_for(lambda: job.event("LEAVING", leaver) is not None, delay + 10)
        gone = job.event("LEAVING", leaver)
        if gone is None:
            trial.flag("other", f"rank {leaver} never reached its departure")
            return
        t_leave = gone["t"]
        job.wait_for(lambda: job.reported(waiters + bystanders),
                     max(0.0, t_leave + 10 + opts.wait - time.monotonic()))
        for r in waiters:
            check_error(trial, job.result(r), who=f"waiting rank {r}", t0=t_leave, limit=10,
                        kinds=("PeerLostError",), named=leaver, left=True)
        for r in bystanders:
            res = job.result(r)
            if res is None:
                trial.flag("hang", f"bystander rank {r}: no report")
            elif res["kind"] != "none":
                trial.classes[res["kind"]] += 1
                trial.flag("wrong", f"bystander rank {r} (not waiting on rank {leaver}) "
                           f"raised {res['kind']}: {res.get('msg')}")
        job.open("end")
        job.finish(trial)
    finally:
        trial.output = job.output()
        job.close()


def stall(rng: random.Random, opts: Options, trial: Trial) -> None:
    """SIGSTOP of a rank past a short timeout, then SIGCONT (every call's values depend
    on its number, so a resumed rank that returned another call's data is caught)."""
    n = trial.params.pop("n", None) or rng.choice(_ns(opts, (2, 3, 4)))
    s = _stream_params(rng, opts, trial.params.pop("size", None))
    victim, delay = rng.randrange(n), round(rng.uniform(0.2, 1.0), 3)
    later = 2
    trial.params.update(n=n, size=s["size"], op=s["op"], victim=victim, delay=delay,
                        timeout=STALL_TIMEOUT)
    job = Job(trial.scenario)
    try:
        job.launch(n, "stream.py", {"ops": s["ops"], "size": s["size"], "seed": s["seed"],
                                    "later": later, "later_gate": job.gate("later"),
                                    "gate": job.gate("end")},
                   job_env(STALL_TIMEOUT, **dict(opts.env)))
        pids = job.ready(n)
        if not pids:
            job.not_started(trial)
            return
        time.sleep(delay)
        t_stop = time.monotonic()
        os.kill(pids[victim], signal.SIGSTOP)
        survivors = [r for r in range(n) if r != victim]
        first_limit = STALL_TIMEOUT + 7  # the deadline, a progress query, some slack

        def later_done(ranks: list[int], phase: str) -> bool:
            return all(len(job.records("RESULT", rank=r, phase=phase)) >= later
                       for r in ranks)

        job.wait_for(lambda: job.reported(survivors, phase="first")
                     and later_done(survivors, "later"), first_limit + opts.wait)
        time.sleep(max(0.0, t_stop + opts.stop - time.monotonic()))
        t_cont = time.monotonic()
        os.kill(pids[victim], signal.SIGCONT)
        for r in survivors:
            check_error(trial, job.result(r, phase="first"), who=f"waiting rank {r}",
                        t0=t_stop, limit=first_limit, kinds=("DistTimeoutError",))
        job.wait_for(lambda: job.reported([victim], phase="first"), 5 + opts.wait)
        trial.extra["stopped_rank_after_sigcont"] = check_error(
            trial, job.result(victim, phase="first"), who=f"stopped rank {victim} once "
            "continued", t0=t_cont, limit=5, record=False,
            timeout_ok=True)  # its own deadline passed while it was stopped
        time.sleep(0.5)
        job.open("later")
        job.wait_for(lambda: later_done(survivors, "later2") and later_done([victim], "later")
                     and later_done([victim], "later2"), 2 * later + opts.wait)
        for phase in ("later", "later2"):
            for r in range(n):
                calls = job.records("RESULT", rank=r, phase=phase)
                if len(calls) < later and job.result(r, phase="first") is not None:
                    trial.flag("hang", f"rank {r}: {later - len(calls)} later call(s) "
                               f"({phase}) never returned")
                for c in calls:
                    trial.classes[c["kind"]] += 1
                    trial.extra["later_call_max"] = max(trial.extra.get("later_call_max", 0),
                                                        c["dt"])
                    when = "before" if phase == "later" and r != victim else "after"
                    what = f"rank {r}: later {c['op']} ({when} SIGCONT)"
                    if not c.get("dist"):
                        trial.flag("wrong", f"{what} gave {c['kind']}, not a DistError")
                    elif c["dt"] > 1.0:
                        trial.flag("late", f"{what} took {c['dt']:.2f} s to raise "
                                   f"{c['kind']} (limit 1 s)")
        job.open("end")
        job.finish(trial)
    finally:
        trial.output = job.output()
        with contextlib.suppress(Exception):
            for p in job.alive():
                p.resume()
        job.close()


def launcher_kill(rng: random.Random, opts: Options, trial: Trial) -> None:
    """SIGKILL of ``minidist run`` itself; every rank must be gone within 5 s."""
    n = rng.choice(_ns(opts, (2, 3, 4, 5, 6, 7, 8)))
    s = _stream_params(rng, opts, trial.params.pop("size", None))
    variant = trial.params.pop("variant", None) or rng.choice(("stream", "idle"))
    delay = round(rng.uniform(0.0, 1.0), 3)
    trial.params.update(n=n, size=s["size"], op=s["op"], variant=variant, delay=delay)
    job = Job(trial.scenario)
    try:
        job.launch(n, "stream.py", {"ops": s["ops"], "size": s["size"], "seed": s["seed"],
                                    "idle": variant == "idle"}, job_env(), grace=5.0)
        pids = job.ready(n)
        if not pids:
            job.not_started(trial)
            return
        ranks = {pid: job.seen[pid] for pid in pids.values() if pid in job.seen}
        time.sleep(delay)
        t_kill = time.monotonic()
        job.popens[0].kill()
        limit = 5.0
        end = t_kill + limit + opts.wait
        last = None
        while time.monotonic() < end:
            alive = [p for p in ranks.values() if _running(p)]
            if not alive:
                last = time.monotonic() - t_kill
                break
            time.sleep(0.02)
        if last is None:
            alive = [p.pid for p in ranks.values() if _running(p)]
            trial.leftover_procs += len(alive)
            trial.flag("leftover", f"{len(alive)} of {n} ranks still running "
                       f"{limit + opts.wait:.0f} s after the launcher was killed: {alive}")
        else:
            trial.times.append(last)
            if last > limit:
                trial.flag("late", f"the last rank ended {last:.2f} s after the launcher "
                           f"was killed (limit {limit:g} s)")
        trial.classes.update(r["kind"] for r in job.records("RESULT"))
        job.close()
        left = job.shm_leftovers()
        if left:
            trial.shm_leftovers += left
            trial.flag("shm", f"shared memory left in /dev/shm: {left}")
    finally:
        trial.output = job.output()
        job.close()


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def host_kill(rng: random.Random, opts: Options, trial: Trial) -> None:
    """A torchrun-like job (RANK, WORLD_SIZE, MASTER_ADDR/PORT): kill -9 of rank 0, the
    rendezvous host; the others must raise PeerLostError within 5 s."""
    n = rng.choice(_ns(opts, (2, 3, 4)))
    s = _stream_params(rng, opts, trial.params.pop("size", None))
    delay = round(rng.uniform(0.0, 1.5), 3)
    trial.params.update(n=n, size=s["size"], op=s["op"], victim=0, delay=delay)
    job = Job(trial.scenario)
    store = free_port_pair()  # torchrun's own store holds MASTER_PORT
    port = store.getsockname()[1]
    try:
        p = {"ops": s["ops"], "size": s["size"], "seed": s["seed"], "gate": job.gate("end")}
        for r in range(n):
            job.spawn(f"rank{r}", "stream.py", p, job_env(
                RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                TORCHELASTIC_RUN_ID=f"chaos{port}"))
        if not job.ready(n):
            job.not_started(trial)
            return
        time.sleep(delay)
        t_kill = time.monotonic()
        job.popens[0].kill()
        survivors = list(range(1, n))
        job.wait_for(lambda: job.reported(survivors, phase="first"), 5 + opts.wait)
        for r in survivors:
            check_error(trial, job.result(r, phase="first"), who=f"rank {r}", t0=t_kill,
                        limit=5, kinds=("PeerLostError",), named=0, left=False)
        job.open("end")
        job.finish(trial)
    finally:
        store.close()
        trial.output = job.output()
        job.close()


def _mismatch(rng: random.Random, opts: Options, trial: Trial, case: str) -> None:
    n_default = (2, 4) if case == "root" else (2, 3, 4)
    n = rng.choice(_ns(opts, n_default))
    p: dict = {"case": case}
    if case == "root":
        op = trial.params.pop("op", None) or rng.choice(("broadcast", "scatter", "reduce",
                                                         "gather"))
        # "self": every rank thinks it is the root; "split": rank 0 thinks the root is 0,
        # the others think it is 1 (the same as "self" for n = 2). In a broadcast/scatter,
        # a rank whose root (in its view) agrees that it is the root completes
        # consistently and may raise on its next call instead; every other rank must
        # raise in the call itself. In reduce and gather
        # the "split" pattern leaves ranks that only send (leaves of the other tree),
        # which cannot know in the call, so they run the "self" pattern only.
        pattern = trial.params.pop("pattern", None) or (
            "self" if op in ("reduce", "gather") else rng.choice(("self", "split")))
        if pattern == "split" and n < 3:
            n = max(_ns(opts, (4,), low=3))
        roots = list(range(n)) if pattern == "self" else [0] + [1] * (n - 1)
        size = _pick(rng, opts.sizes, SIZES)
        p.update(op=op, roots=roots, count=max(1, size // 4))
        trial.params.update(n=n, op=op, pattern=pattern, roots=roots, size=size)
    elif case == "size":
        odd = rng.randrange(n)
        p.update(odd=odd, small=10, count=4 << 20)
        trial.params.update(n=n, odd=odd, small=10, count=4 << 20)
    else:
        odd = rng.randrange(n)
        p.update(odd=odd, count=1 << 20)
        trial.params.update(n=n, odd=odd, count=1 << 20,
                            algorithms=["shared_memory" if r == odd else "ring"
                                        for r in range(n)])
    job = Job(trial.scenario)
    try:
        job.launch(n, "mismatch.py", {**p, "gate": job.gate("end")}, job_env())
        if not job.ready(n):
            job.not_started(trial)
            return
        job.wait_for(lambda: len(job.records("EVENT", what="ENTER")) >= n
                     or job.reported(list(range(n))), 10)
        # every rank has entered the call by the last ENTER (a rank that failed in the
        # barrier before it never prints one)
        t0 = max((e["t"] for e in job.records("EVENT", what="ENTER")
                  + job.records("EVENT", what="READY")), default=time.monotonic())
        job.wait_for(lambda: job.reported(list(range(n))),
                     max(0.0, t0 + 10 + opts.wait - time.monotonic()))
        for r in range(n):
            res = job.result(r)
            check_error(trial, res, who=f"rank {r}", t0=t0, limit=10)
            if res is None or res["kind"] == "none":
                continue
            # a broadcast/scatter completes without error on every rank whose root (in
            # its view) agrees that it is the root: it and that root's receivers got
            # consistent data; they learn of the disagreement at their next call
            mine = p["roots"][r] if case == "root" else -1
            may_wait = case == "root" and p["op"] in ("broadcast", "scatter") \
                and p["roots"][mine] == mine
            if res.get("call") == "next" and not may_wait:
                trial.flag("wrong", f"rank {r} (root {p['roots'][r]} in its view): the "
                           f"mismatched {trial.params.get('op', 'call')} returned; only its "
                           f"next call raised {res['kind']} (only a rank whose root agrees "
                           f"with it, in a broadcast/scatter, may): {res.get('msg')}")
            bad = internal_numbers(res.get("msg", ""))
            if bad:
                trial.flag("wrong", f"rank {r}: the message shows internals {bad}: "
                           f"{res.get('msg')}")
        job.open("end")
        job.finish(trial)
    finally:
        trial.output = job.output()
        job.close()


def mismatch_root(rng: random.Random, opts: Options, trial: Trial) -> None:
    """broadcast/scatter/reduce/gather with a different root on some ranks."""
    _mismatch(rng, opts, trial, "root")


def mismatch_size(rng: random.Random, opts: Options, trial: Trial) -> None:
    """all_reduce of 10 elements on one rank and 4 M on the others."""
    _mismatch(rng, opts, trial, "size")


def mismatch_algorithm(rng: random.Random, opts: Options, trial: Trial) -> None:
    """all_reduce with algorithm="shared_memory" on one rank and "ring" on the others."""
    _mismatch(rng, opts, trial, "algorithm")


def init_death(rng: random.Random, opts: Options, trial: Trial) -> None:
    """A rank exits with code 1 before init(); the others' init must fail, naming it."""
    n = rng.choice(_ns(opts, (2, 3, 4)))
    victim, delay = rng.randrange(n), round(rng.uniform(0.0, 0.5), 3)
    trial.params.update(n=n, victim=victim, delay=delay)
    job = Job(trial.scenario)
    try:
        job.launch(n, "init_death.py", {"victim": victim, "delay": delay,
                                        "gate": job.gate("end")}, job_env())
        job.learn_key()
        if not job.wait_for(lambda: job.event("EXITING", victim) is not None, 30):
            trial.flag("other", f"rank {victim} never got to exit")
            return
        t_exit = job.event("EXITING", victim)["t"]
        others = [r for r in range(n) if r != victim]
        job.wait_for(lambda: job.reported(others),
                     max(0.0, t_exit + 10 + opts.wait - time.monotonic()))
        for r in others:
            res = job.result(r)
            entered = job.event("INIT", r)
            t0 = max(t_exit, entered["t"]) if entered else t_exit
            check_error(trial, res, who=f"rank {r}", t0=t0, limit=10)
            if res and res.get("dist") and victim not in res.get("ranks", []) \
                    and not re.search(rf"\brank {victim}\b", res.get("msg", "")):
                trial.flag("wrong", f"rank {r}: {res['kind']} does not name rank {victim}: "
                           f"{res.get('msg')}")
        job.open("end")
        job.finish(trial)
    finally:
        trial.output = job.output()
        job.close()


@contextlib.contextmanager
def throwaway_user():
    """A new local user (deleted afterwards), or None where one cannot be created."""
    name = "mdchaos" + secrets.token_hex(4)
    try:
        r = subprocess.run(["useradd", "--no-create-home", "--no-user-group", "--shell",
                            "/usr/sbin/nologin", name], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.SubprocessError):
        yield None
        return
    if r.returncode != 0:
        yield None
        return
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=30)


def _python_for_anyone() -> str:
    """An interpreter another user can run (the virtualenv may live under /root)."""
    for exe in (sys.executable, "/usr/bin/python3"):
        path = os.path.realpath(exe)
        st = os.stat(path)
        ok = all(os.stat(d).st_mode & 0o001 for d in _parents(path))
        if ok and st.st_mode & 0o001:
            return exe
    return "/usr/bin/python3"


def _parents(path: str) -> list[str]:
    out, p = [], os.path.dirname(path)
    while p and p != "/":
        out.append(p)
        p = os.path.dirname(p)
    return out


def squat(rng: random.Random, opts: Options, trial: Trial) -> None:
    """A second local user squats a killed rank's address and sends junk to live ranks."""
    if os.geteuid() != 0:
        trial.skipped = "creating a second local user needs root"
        return
    n = rng.choice(_ns(opts, (3, 4), low=3))
    victim = rng.randrange(n)
    iters = 20
    trial.params.update(n=n, victim=victim, iters=iters)
    with throwaway_user() as user:
        if user is None:
            trial.skipped = "useradd failed: no second local user"
            return
        job = Job(trial.scenario)
        squatter = None
        try:
            job.launch(n, "squat.py", {"victim": victim, "count": 1 << 20, "iters": iters,
                                       "pause": 0.1, "gate": job.gate("go"),
                                       "gate2": job.gate("end")}, job_env(), grace=60.0)
            pids = job.ready(n)
            if not pids:
                job.not_started(trial)
                return
            if job.key is None:
                trial.flag("other", "no @minidist-<key> socket in /proc/net/unix")
                return
            os.kill(pids[victim], signal.SIGKILL)
            live = [r for r in range(n) if r != victim]
            src = (SCRIPTS / "squatter.py").read_text()
            args = {"key": job.key, "victim": victim, "live": live, "duration": 40,
                    "junk_per_rank": 20, "junk_pause": 0.03}
            squatter = subprocess.Popen(
                [_python_for_anyone(), "-I", "-c", src, json.dumps(args)],
                user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd="/",
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, env={"PATH": "/usr/bin:/bin"})
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.extend(
                ln.decode(errors="replace").rstrip() for ln in squatter.stdout), daemon=True)
            reader.start()
            end = time.monotonic() + 15
            while "BOUND" not in lines and time.monotonic() < end and squatter.poll() is None:
                time.sleep(0.02)
            if "BOUND" not in lines:
                trial.flag("other", f"the squatter could not bind rank {victim}'s address: "
                           f"{lines} {squatter.stderr.read().decode() if squatter.poll() else ''}")
                return
            job.open("go")
            job.wait_for(lambda: len(job.records("EVENT", what="DONE")) >= len(live), 40)
            end = time.monotonic() + 10
            while "JUNKDONE" not in lines and time.monotonic() < end \
                    and squatter.poll() is None:
                time.sleep(0.05)
            time.sleep(0.5)
            squatter.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                squatter.wait(20)
            reader.join(timeout=5)
            summary = next((json.loads(ln[8:]) for ln in lines if ln.startswith("SUMMARY ")),
                           None)
            trial.squatter = summary
            if summary is None:
                trial.flag("other", f"the squatter gave no summary: {lines}")
            else:
                if summary["handshakes"]:
                    trial.flag("squat", f"the squatter completed {summary['handshakes']} "
                               "handshake(s): a rank went on talking after its fake ack")
                if summary["junk_connected"] < 10:
                    trial.flag("other", "the squatter could not reach the live ranks "
                               f"({summary['junk_connected']} junk connections)")
                if summary["frames"]:
                    trial.flag("squat", f"the squatter received {summary['frames']} data "
                               "frame(s) meant for the dead rank")
            for r in live:
                res = job.result(r, phase="live")
                for phase in ("to_victim_send", "to_victim_recv", "to_victim_all_reduce"):
                    t = job.result(r, phase=phase)
                    if t is not None:
                        trial.classes[f"{phase}:{t['kind']}"] += 1
                if res is None:
                    trial.flag("hang", f"live rank {r}: its collectives never finished")
                elif res["kind"] != "none" or res.get("iters") != iters:
                    trial.flag("wrong", f"live rank {r} disturbed after {res.get('iters')} of "
                               f"{iters} rounds: {res['kind']}: {res.get('msg')}")
            noise = [text for _, src, text in job.lines if parse(text) is None
                     and not text.startswith("minidist run:")]
            # a line per rank now and then is fine; a line per refused connection is not
            most = max(NOISE_LINES, len(live))
            trial.extra["noise_lines"] = len(noise)
            if len(noise) > most:
                trial.flag("squat", f"{len(noise)} lines of output while strangers knocked "
                           f"(at most {most}): {noise[:8]}")
            job.open("end")
            job.finish(trial)
        finally:
            trial.output = job.output()
            if squatter is not None and squatter.poll() is None:
                squatter.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    squatter.wait(10)
            job.close()


SCENARIOS: dict[str, Callable[[random.Random, Options, Trial], None]] = {
    "kill": kill_rank,
    "leave": leave,
    "stall": stall,
    "launcher_kill": launcher_kill,
    "host_kill": host_kill,
    "mismatch_root": mismatch_root,
    "mismatch_size": mismatch_size,
    "mismatch_algorithm": mismatch_algorithm,
    "init_death": init_death,
    "squat": squat,
}


def run(scenario: str, seed: object, trial: int, opts: Options | None = None,
        **fixed: object) -> Trial:
    """Trial number ``trial`` of a scenario; its random choices come from
    ``Random(f"{seed}/{scenario}/{trial}")``, so any trial can be run again alone.
    ``fixed`` pins some parameters (``size``, ``how``, ``variant``, ``op``)."""
    t = Trial(scenario, f"{seed}/{scenario}/{trial}", dict(fixed))
    rng = random.Random(t.seed)
    start = time.monotonic()
    SCENARIOS[scenario](rng, opts or Options(), t)
    t.duration = time.monotonic() - start
    return t


# containers' shared memory (they use Job and Trial from here)
from .shm_scenarios import SHM_SCENARIOS  # noqa: E402

SCENARIOS.update(SHM_SCENARIOS)

from .elastic_scenarios import ELASTIC_SCENARIOS  # noqa: E402

SCENARIOS.update(ELASTIC_SCENARIOS)

from .env_scenarios import ENV_SCENARIOS  # noqa: E402 - forked children, nofile limits

SCENARIOS.update(ENV_SCENARIOS)
