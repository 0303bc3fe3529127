"""Containers' shared memory: the RL layout under a small, a full or a roomy /dev/shm,
and with ``process_vm_readv`` refused. Registered in ``scenarios.SCENARIOS`` (run by
``tests/chaos`` and ``benchmarks/chaos.py``).

A small /dev/shm is a tmpfs of ``1m`` or ``64m`` (Docker's default) mounted over
/dev/shm in a mount namespace of the job's own (``unshare -m``; root only), ``full`` is
a 64 MiB one that a file fills before the job starts; in these, as in a Docker
container's default seccomp profile, ``process_vm_readv`` is refused too (unless the
trial says otherwise). The job (``scripts/shm_limits.py``)
runs all_reduce and broadcast of 4 B to 16 MiB on every group of the RL layout (world,
agents, env workers, this node's workers) and a 1 MiB send/recv ring over the world,
checking every element. The contract:

* every rank returns every call's right bits (``RESULT kind=none``) and the job exits 0;
* no process is killed by SIGBUS (the launcher would say "killed by SIGBUS", exit 135);
* the job's output holds exactly one warning line when some shared memory could not be
  had (always under ``1m`` and ``full``), none when it all could, never more;
* on a roomy /dev/shm, the fast path is still taken (every multi-rank group has slots);
* with reads refused (``refuse_reads``), every group's ranks agree not to read each
  other and the results stay right (and without, where this machine allows the reads,
  16 MiB all_reduces on more than 8 ranks do read the peers).
"""

from __future__ import annotations

import json
import random
import shlex
import shutil
import subprocess
import sys

from minidist import peer_memory

from . import scenarios
from .scenarios import SCRIPTS, Job, Options, Trial, job_env

SIZES = (4, 4096, 64 << 10, 1 << 20, 16 << 20)
P2P = 1 << 20
SHMS = {"1m": (4, 16), "64m": (16, 64, 128), "full": (4, 16), "roomy": (4, 16)}
WARNING = "minidist: warning:"
LIMIT = 120  # seconds a job may take, plus 3 per rank (a shared 2-core machine is slow)
_ns_allowed: str | None = None


def namespace_refused() -> str:
    """Why a mount namespace with a tmpfs on /dev/shm cannot be made here ('' if it can)."""
    global _ns_allowed
    if _ns_allowed is None:
        if shutil.which("unshare") is None:
            _ns_allowed = "no unshare(1) here"
        else:
            r = subprocess.run(["unshare", "-m", "sh", "-c",
                                "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                               capture_output=True, text=True, timeout=30)
            _ns_allowed = "" if r.returncode == 0 else (
                f"cannot mount a tmpfs on /dev/shm in a mount namespace (root only): "
                f"{r.stderr.strip()[:200]}")
    return _ns_allowed


def _command(shm: str, n: int, p: dict) -> list[str]:
    run = [sys.executable, "-m", "minidist", "run", "-n", str(n), "--grace", "30",
           str(SCRIPTS / "shm_limits.py"), json.dumps(p)]
    if shm == "roomy":
        return run
    size = "64m" if shm == "full" else shm
    fill = " && fallocate -l 64MiB /dev/shm/filler" if shm == "full" else ""
    return ["unshare", "-m", "sh", "-c",
            f"mount -t tmpfs -o size={size} tmpfs /dev/shm{fill} && exec "
            + " ".join(shlex.quote(c) for c in run)]


def shm_limits(rng: random.Random, opts: Options, trial: Trial) -> None:
    """The RL layout under the /dev/shm of ``shm`` (a fixed parameter, else drawn)."""
    shm = trial.params.pop("shm", None) or rng.choice(list(SHMS))
    ns = [n for n in (opts.ns or SHMS[shm]) if n >= 2]
    n = trial.params.pop("n", None) or rng.choice(ns or [4])
    # a container: its seccomp profile refuses process_vm_readv too (Docker's default),
    # so the large all_reduces need the shared memory (or the sockets) as well
    refuse = trial.params.pop("refuse_reads", "all" if shm in ("1m", "64m", "full") else None)
    in_flight = bool(trial.params.pop("async", False))
    # the default sizes of Options are the kill streams'; given ones are taken as they are
    sizes = list(trial.params.pop("sizes", None)
                 or (SIZES if opts.sizes == scenarios.SIZES else opts.sizes))
    trial.params.update(shm=shm, n=n, sizes=sizes, refuse_reads=refuse, **(
        {"async": True} if in_flight else {}))
    if shm != "roomy" and namespace_refused():
        trial.skipped = namespace_refused()
        return
    job = Job(trial.scenario)
    try:
        p = {"sizes": sizes, "p2p": P2P, "refuse_reads": refuse, "async": in_flight}
        launcher = job._start(_command(shm, n, p), job_env(**dict(opts.env)), "launcher")
        try:
            code = launcher.wait(LIMIT + 3 * n)
        except subprocess.TimeoutExpired:
            trial.flag("hang", f"the job did not end within {LIMIT + 3 * n} s")
            return
        job.track()
        check(trial, job, n, shm, refuse, code, sizes)
        job.finish(trial)
    finally:
        trial.output = job.output()
        job.close()


def check(trial: Trial, job: Job, n: int, shm: str, refuse: str | None, code: int,
          sizes: list[int]) -> None:
    """The contract (see the module) on a finished job's output."""
    text = job.output(last=100000)
    if code == 135 or code == -7 or "SIGBUS" in text:
        trial.flag("other", f"a process was killed by SIGBUS (launcher exit code {code})")
    elif code != 0:
        trial.flag("other", f"the job failed (launcher exit code {code})")
    results = {r: job.result(r) for r in range(n)}
    # a control: where this machine lets processes read each other, 16 MiB all_reduces
    # on the world of more than 8 ranks do (so that a refusal is seen to change it)
    reads_expected = (shm == "roomy" and not refuse and n > 8 and max(sizes) > 4 << 20
                      and peer_memory.key() is not None)
    fell_back = False
    for r, res in results.items():
        if res is None:
            trial.flag("other", f"rank {r} reported nothing")
        elif res["kind"] != "none":
            what = "wrong" if res["kind"] == "WrongResult" else "other"
            trial.flag(what, f"rank {r}: {res['kind']}: {res.get('msg')}")
        else:
            fell_back |= bool(res["nofast"] or res["nomid"] or res["noseg"] or res["nop2p"])
            if shm == "roomy" and not refuse and res["fast"] < res["groups"]:
                trial.flag("other", f"rank {r}: only {res['fast']} of its {res['groups']} "
                           "groups took the fast path on a roomy /dev/shm")
            if reads_expected and not res["reads"]:
                trial.flag("other", f"rank {r}: no group read the peers' memory on a roomy "
                           "/dev/shm with reads allowed")
            if refuse and res["reads"]:
                trial.flag("other", f"rank {r}: reads refused, yet {res['reads']} group(s) "
                           "read the peers")
    warnings = [line for line in text.splitlines() if WARNING in line]
    trial.extra.update(warnings=len(warnings), fell_back=fell_back, code=code)
    want = 1 if shm in ("1m", "full") or fell_back else 0
    if len(warnings) != want:
        trial.flag("other", f"{len(warnings)} warning line(s) in the job's output, not "
                   f"{want}: {warnings[:3]}")
    if warnings and not all(s in warnings[0] for s in ("--shm-size=", "MINIDIST_SHM=0",
                                                       "MiB")):
        trial.flag("other", f"the warning does not name the size and the fixes: "
                   f"{warnings[0]}")


SHM_SCENARIOS = {"shm_limits": shm_limits}
