"""Workers killed during lockstep stepping, and started again: the learner must never
stop. Registered in ``scenarios.SCENARIOS`` (run by ``tests/chaos`` and
``benchmarks/chaos.py``).

The job is ``examples/elastic_rl.py`` under ``minidist run --restart-failed``: a learner
(rank 0) scatters actions to its workers and gathers their observations in lockstep,
agrees with them every few steps, shrinks the group when a worker died, and takes the
worker back once it was restarted. Its killer thread SIGKILLs a random worker every
``kill_every`` seconds for ``kill_for`` seconds. The contract:

* the learner completes every step it planned, with 0 wrong observations;
* after each shrink that no further death interrupted, every survivor's new group has
  the learner's members, epoch and id (gathered in the job);
* every killed worker is back in the learner's group by the end (and the final group is
  every rank); the job exits 0 within its limit (0 hangs);
* no process and no ``/dev/shm`` file of the job is left behind.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from .scenarios import Job, Options, Trial, job_env

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "elastic_rl.py"
LIMIT = 120.0  # seconds the whole job may take on a shared 2-core machine


def elastic(rng: random.Random, opts: Options, trial: Trial) -> None:
    """kill -9 of random workers during lockstep stepping, with restarts."""
    n = rng.choice([k for k in (5, 9) if not opts.ns or k in opts.ns] or [5])
    # a learner with 4 workers does thousands of steps a second on a quiet machine:
    # kills come early and often enough that some land inside the planned steps
    steps = trial.params.pop("steps", None) or rng.choice((3000, 5000))
    kill_every = round(rng.uniform(0.1, 0.3), 2)
    kill_for = trial.params.pop("kill_for", None) or 2.0
    trial.params.update(n=n, steps=steps, kill_every=kill_every, kill_for=kill_for)
    job = Job(trial.scenario)
    try:
        job._start([sys.executable, "-m", "minidist", "run", "-n", str(n),
                    "--restart-failed", "1000", str(EXAMPLE), "--steps", str(steps),
                    "--kill-every", str(kill_every), "--kill-for", str(kill_for)],
                   job_env(), "launcher")
        job.learn_key()
        ended = job.wait_for(lambda: bool(_summary(job)) or job.popens[0].poll() is not None,
                             LIMIT)
        s = _summary(job)
        if not s:
            trial.flag("hang" if not ended else "other",
                       "the learner printed no summary " + (
                           f"within {LIMIT:.0f} s" if not ended else
                           f"(exit code {job.popens[0].returncode})"))
            return
        trial.extra.update(s)
        if s["steps"] != s["planned"]:
            trial.flag("other", f"the learner did {s['steps']} of {s['planned']} steps")
        if s["wrong"]:
            trial.flag("wrong", f"{s['wrong']} wrong observations")
        if s["split_views"] or s["views_checked"] == 0:
            trial.flag("wrong", f"{s['split_views']} survivors shrank to another group than "
                       f"the learner's ({s['views_checked']} shrinks compared)")
        if s["not_back"] or s["back"] != s["kills"] or s["final_group"] != list(range(n)):
            trial.flag("other", f"killed workers not back: {s['not_back']} "
                       f"({s['back']} of {s['kills']} back; final group {s['final_group']})")
        if s["kills"] == 0:
            trial.flag("other", "no worker was killed")
        if s["back_ms_max"] is not None:
            trial.times.append(s["back_ms_max"] / 1000)
        job.finish(trial, timeout=30)
        rc = job.popens[0].returncode
        if rc not in (0, None):
            trial.flag("other", f"the job exited with code {rc}")
    finally:
        trial.output = job.output()
        job.close()


def _summary(job: Job) -> dict | None:
    with job.cond:
        lines = [text for _, source, text in job.lines if source == "launcher"]
    for text in lines:  # the learner's own line (a traceback may quote the source line)
        if "]: ELASTIC_RL {" in text:
            try:
                return json.loads(text.split("ELASTIC_RL ", 1)[1])
            except json.JSONDecodeError:
                return None
    return None


ELASTIC_SCENARIOS = {"elastic": elastic}
