"""Forked children and file-descriptor limits: the environments jobs run in. Registered
in ``scenarios.SCENARIOS`` (run by ``tests/chaos`` and ``benchmarks/chaos.py``).

* ``fork_sys_exit``, ``fork_os_exit``, ``fork_exception``, ``fork_other``: one rank
  after another forks a child that ends that way (``fork_other`` cycles through a
  multiprocessing fork and forkserver child, ``subprocess``, a torch DataLoader with two
  workers, a child whose minidist call must raise, and a child that forms a job of its
  own); after each child, every rank runs 50 all_reduces (1, 1000 and 100 000 floats)
  and checks every result. The contract: every child behaves as expected, 0 wrong
  results, the job exits 0 within its limit, nothing is left behind.
* ``nofile``: ``minidist run`` of a trivial job (init, all_reduce, barrier) under a
  nofile limit: soft 256 / hard 1024 with 300 ranks and soft 1024 / hard 20000 with 400
  must run (the soft limit is raised); hard 1024 with 400 ranks must fail within 5 s
  naming the limit and ``ulimit -n``.
"""

from __future__ import annotations

import importlib.util
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

from .scenarios import Job, Options, Trial, job_env

SCRIPTS = Path(__file__).resolve().parents[1] / "processes" / "scripts"
FORK_LIMIT = 150.0  # seconds a fork job may take on a shared 2-core machine
OTHER = ["mp_fork", "mp_forkserver", "subprocess", "call", "init",
         *(["dataloader"] if importlib.util.find_spec("torch") else [])]
# (ranks, soft, hard, must run)
NOFILE_CASES = [(300, 256, 1024, True), (400, 1024, 20000, True), (400, 1024, 1024, False)]


def _fork(mode: str | None):
    def scenario(rng: random.Random, opts: Options, trial: Trial) -> None:
        how = mode or OTHER[int(trial.seed.rsplit("/", 1)[-1]) % len(OTHER)]
        n = rng.choice([k for k in (2, 3, 4) if not opts.ns or k in opts.ns] or [3])
        children = trial.params.pop("children", None) or n
        trial.params.update(n=n, mode=how, children=children)
        job = Job(trial.scenario)
        try:
            t0 = time.monotonic()
            proc = job._start([sys.executable, "-m", "minidist", "run", "-n", str(n),
                               str(SCRIPTS / "forked_children.py"), how, str(children),
                               "50"], job_env(timeout=20), "launcher")
            try:
                rc = proc.wait(FORK_LIMIT)
            except subprocess.TimeoutExpired:
                trial.flag("hang", f"the job did not end within {FORK_LIMIT:.0f} s")
                return
            trial.times.append(time.monotonic() - t0)
            results = {}
            for _, _, text in list(job.lines):
                _, _, rest = text.partition("RESULT ")
                if rest.startswith("{"):
                    r = json.loads(rest)
                    results[r["rank"]] = r
            if rc != 0:
                trial.flag("other", f"the job exited with {rc}")
            for r in range(n):
                res = results.get(r)
                if res is None:
                    trial.flag("hang", f"rank {r} reported no result")
                    continue
                if res["bad_children"]:
                    trial.flag("other", f"rank {r}: {res['bad_children']} child(ren) of "
                               f"mode {how} did not end as they should")
                if res["wrong"]:
                    trial.wrong += res["wrong"] - 1
                    trial.flag("wrong", f"rank {r}: {res['wrong']} wrong all_reduce(s) "
                               f"after {how} children")
            job.finish(trial)
        finally:
            trial.output = job.output()
            job.close()

    scenario.__doc__ = f"a rank's forked children ({mode or 'other ways'})"
    return scenario


def nofile(rng: random.Random, opts: Options, trial: Trial) -> None:
    """``minidist run`` of 300-400 ranks under low nofile limits."""
    n, soft, hard, must_run = NOFILE_CASES[int(trial.seed.rsplit("/", 1)[-1]) %
                                           len(NOFILE_CASES)]
    trial.params.update(n=n, soft=soft, hard=hard)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "minidist", "run", "-n", str(n),
                            str(SCRIPTS / "fd_tiny.py")], env=job_env(timeout=60),
                           capture_output=True, text=True, timeout=170, preexec_fn=limit,
                           start_new_session=True)
    except subprocess.TimeoutExpired:
        trial.flag("hang", f"{n} ranks under nofile {soft}/{hard} did not end in 170 s")
        return
    took = time.monotonic() - t0
    trial.times.append(took)
    if must_run:
        if p.returncode != 0 or f"FD OK {n}" not in p.stdout:
            trial.flag("other", f"{n} ranks under nofile {soft}/{hard} failed "
                       f"({p.returncode}): {p.stderr[-1500:]}")
    elif p.returncode == 0:
        trial.extra["ran"] = True  # allowed: it ran after all
    elif took > 5 or f"most {hard}" not in p.stderr or "ulimit -n" not in p.stderr:
        trial.flag("late" if took > 5 else "wrong",
                   f"{n} ranks under hard {hard}: failed after {took:.1f} s with "
                   f"{p.stderr[-1500:]!r} (wanted: within 5 s, naming the limit)")


ENV_SCENARIOS = {
    "fork_sys_exit": _fork("sys_exit"),
    "fork_os_exit": _fork("os_exit"),
    "fork_exception": _fork("exception"),
    "fork_other": _fork(None),
    "nofile": nofile,
}
