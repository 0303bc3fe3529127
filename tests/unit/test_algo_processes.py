"""Algorithms of your own and the classics on real processes: ``minidist run`` with
MINIDIST_ALGO_MODULE (or ``--algo-module``), ``algorithm="name"``,
MINIDIST_ALGO_<COLLECTIVE>, and what a rank that disagrees is told."""

from __future__ import annotations

import os
import textwrap

import pytest

from tests.processes.harness import ROOT, Job, clean_env

pytestmark = pytest.mark.timeout(180)

MODULE = '''
from minidist.algorithms import Copy, Schedule, Step, compose, make_schedule, part


def halving_doubling(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Rabenseifner's all_reduce, under a name of our own."""
    return make_schedule("all_reduce", "rabenseifner", rank, size, count)


def two_level(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """Pairs first, then across pairs: composed from built-ins, all in tmp."""
    pair = [r for r in range(size) if r // 2 == rank // 2]
    across = [r for r in range(size) if r % 2 == rank % 2]
    bufs = {"out": ("tmp", 0), "tmp": ("tmp", count)}
    return compose("all_reduce", "two_level", rank, size, count, 0, [
        Step(compute=(Copy("tmp", 0, "out", 0, count),)),
        part("all_reduce", "recursive_doubling", pair, rank, count, buffers=bufs),
        part("all_reduce", "ring", across, rank, count, buffers=bufs),
        Step(compute=(Copy("out", 0, "tmp", 0, count),)),
    ])
'''

SCRIPT = '''
import numpy as np
import minidist as md

md.init()
r, n = md.get_rank(), md.get_world_size()
rng = np.random.default_rng(0)
inputs = [rng.integers(-100, 100, 37).astype(np.float64) for _ in range(n)]
total = sum(inputs)

x = inputs[r].copy()
md.all_reduce(x)  # MINIDIST_ALGO_ALL_REDUCE=two_level
assert np.array_equal(x, total), ("env", x, total)
for name in ("halving_doubling", "two_level", "rabenseifner", "double_binary_tree"):
    x = inputs[r].copy()
    md.all_reduce(x, algorithm=name)
    assert np.array_equal(x, total), name

x = inputs[r].copy()
md.reduce(x, dst=2, algorithm="rabenseifner")
assert np.array_equal(x, total if r == 2 else inputs[r])

big = np.concatenate(inputs)
out = np.zeros(37)
md.reduce_scatter(out, np.concatenate([inputs[r]] * n) + r, algorithm="recursive_halving")
assert np.array_equal(out, total + sum(range(n))), "reduce_scatter"

out = np.zeros(37 * n)
md.all_gather(out, inputs[r], algorithm="bruck")
assert np.array_equal(out, big), "all_gather"

send = np.arange(3 * n, dtype=np.int32) + 100 * r
got = np.zeros(3 * n, np.int32)
md.all_to_all(got, send, algorithm="bruck")
want = np.concatenate([np.arange(3 * r, 3 * r + 3, dtype=np.int32) + 100 * j for j in range(n)])
assert np.array_equal(got, want), "all_to_all"

y = np.arange(100_000, dtype=np.float32) if r == 1 else np.zeros(100_000, np.float32)
md.broadcast(y, src=1, algorithm="pipeline")
assert np.array_equal(y, np.arange(100_000, dtype=np.float32)), "broadcast"
print("ALL OK", r, flush=True)
md.destroy()
'''

MISMATCH = '''
import numpy as np
import minidist as md

md.init()
r = md.get_rank()
x = np.ones(10)
try:
    md.all_reduce(x, algorithm="ring" if r == 0 else "halving_doubling")
except md.CollectiveMismatchError as e:
    print("MISMATCH", r, e, flush=True)
md.destroy()
'''


def _env(tmp_path, **extra):
    (tmp_path / "my_job_algos.py").write_text(textwrap.dedent(MODULE))
    env = clean_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def test_a_module_of_algorithms_on_eight_processes(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = _env(tmp_path, MINIDIST_ALGO_MODULE="my_job_algos",
               MINIDIST_ALGO_ALL_REDUCE="two_level")
    with Job(8, script, env=env) as job:
        rc = job.wait(150)
    assert rc == 0, job.out + job.err
    assert job.out.count("ALL OK") == 8


def test_algo_module_option_and_a_rank_that_runs_another_algorithm(tmp_path):
    script = tmp_path / "mismatch.py"
    script.write_text(MISMATCH)
    with Job(2, script, env=_env(tmp_path, MINIDIST_TIMEOUT="30"),
             launcher_args=("--algo-module", "my_job_algos")) as job:
        job.wait(90)
    lines = [ln for ln in job.out.splitlines() if "MISMATCH" in ln]
    assert lines, job.out + job.err
    assert any("algorithm='halving_doubling'" in ln and "algorithm='ring'" in ln
               for ln in lines), lines


def test_a_module_that_cannot_be_imported_fails_init_clearly(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import minidist as md\nmd.init()\n")
    env = _env(tmp_path, MINIDIST_ALGO_MODULE="no_such_algorithms_here")
    with Job(2, script, env=env) as job:
        rc = job.wait(90)
    assert rc != 0
    assert "cannot import algorithm module 'no_such_algorithms_here'" in job.out + job.err
